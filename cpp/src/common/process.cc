#include "common/process.h"

#include <unistd.h>

#include <new>
#include <string>

namespace ddp {

// getpid() is a system call (glibc caches nothing since 2.25): a few hundred
// nanoseconds, paid once per batch or request, never per sample.
ProcessOwner::ProcessOwner() noexcept : pid_(::getpid()) {}

bool ProcessOwner::here() const noexcept { return ::getpid() == pid_; }

Status ProcessOwner::Check(std::string_view what, std::string_view remedy) const {
  const pid_t now = ::getpid();
  if (now == pid_) return Status::Ok();
  return OtherProcessError(std::string(what) + " was made in process " + std::to_string(pid_) +
                           " and is used in process " + std::to_string(now) +
                           ", a fork() of it (its threads, locks and connections stayed in the "
                           "parent); " + std::string(remedy));
}

void ForgetWaiters(std::condition_variable& cv) noexcept {
  // The old object's destructor is skipped on purpose (it would wait for the parent's
  // waiters); std::condition_variable is transparently replaceable, so `cv` names the new
  // object from here on.
  new (&cv) std::condition_variable();
}

}  // namespace ddp
