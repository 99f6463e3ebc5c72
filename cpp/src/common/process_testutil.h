// Runs a test's body in a fork()ed child, for the engine objects that must behave there
// (common/process.h).
#pragma once

#include <chrono>
#include <functional>

namespace ddp {

// What became of the child: its exit code, or the signal that ended it, or hung when it
// outlived the deadline (then it is killed).
struct ForkedChildEnd {
  int exit_code = -1;  // -1: it did not exit
  int signal = 0;      // the signal that ended it, 0: none
  bool hung = false;
};

// Forks; the child runs `body` and _exit()s with its result (no atexit handlers, no
// gtest teardown, no destructors of the parent's objects). Waits at most `deadline`.
ForkedChildEnd RunInForkedChild(const std::function<int()>& body,
                    std::chrono::milliseconds deadline = std::chrono::seconds(20));

}  // namespace ddp
