// The process an engine object was made in, for objects that own threads, sockets or
// condition variables.
//
// fork() copies the whole memory of a process but only the thread that called it. In
// the child, an object made by the parent is only half there: its threads do not exist,
// a mutex may be held by a thread that vanished, a condition variable may count waiters
// that never wake (glibc's pthread_cond_destroy waits for them), and a libcurl handle
// shares its sockets and TLS state with the parent's connections. Such objects record
// where they were made (ProcessOwner), refuse work in another process
// (ProcessOwner::Check: kOtherProcess), and there free nothing they do not own: they leak
// their threads and handles (Leak) and forget their condition variables' waiters
// (ForgetWaiters) instead of joining, locking, destroying or closing them. The leak is
// the child's copy of the parent's memory; it goes when the child exits.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <string_view>
#include <type_traits>
#include <utility>

#include "ddp/status.h"

namespace ddp {

class ProcessOwner {
 public:
  ProcessOwner() noexcept;

  // Whether the calling process is the one that made the object.
  bool here() const noexcept;
  pid_t pid() const noexcept { return pid_; }
  // OK here. In another process kOtherProcess: "<what> was made in process P and is
  // used in process Q, a fork() of it (...); <remedy>".
  Status Check(std::string_view what, std::string_view remedy) const;

 private:
  pid_t pid_;
};

// Moves `value` to the heap and never frees it: a child's way to drop what its parent
// made (std::thread objects, libcurl handles) without joining or closing them.
template <typename T>
void Leak(T&& value) {
  (void)new std::decay_t<T>(std::forward<T>(value));
}

// Makes `cv` a new condition variable in place, without waiting for the waiters the
// parent's threads left counted in it: its destructor then returns at once. Only for a
// child, where no thread of its own waits on `cv`.
void ForgetWaiters(std::condition_variable& cv) noexcept;

}  // namespace ddp
