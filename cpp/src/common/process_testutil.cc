#include "common/process_testutil.h"

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <thread>

namespace ddp {

ForkedChildEnd RunInForkedChild(const std::function<int()>& body, std::chrono::milliseconds deadline) {
  ForkedChildEnd end;
  const pid_t child = ::fork();
  if (child < 0) return end;
  if (child == 0) std::_Exit(body());
  const auto until = std::chrono::steady_clock::now() + deadline;
  int status = 0;
  for (;;) {
    const pid_t got = ::waitpid(child, &status, WNOHANG);
    if (got == child) break;
    if (got < 0 || std::chrono::steady_clock::now() >= until) {
      end.hung = got == 0;
      ::kill(child, SIGKILL);
      if (::waitpid(child, &status, 0) != child) return end;
      return end;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (WIFEXITED(status)) end.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) end.signal = WTERMSIG(status);
  return end;
}

}  // namespace ddp
