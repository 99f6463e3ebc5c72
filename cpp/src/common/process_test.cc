#include "common/process.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "common/process_testutil.h"

namespace ddp {
namespace {

TEST(ProcessOwner, IsHereInTheProcessThatMadeIt) {
  ProcessOwner owner;
  EXPECT_TRUE(owner.here());
  EXPECT_EQ(owner.pid(), ::getpid());
  EXPECT_TRUE(owner.Check("this thing", "make another").ok());
}

TEST(ProcessOwner, AForkedChildIsAnotherProcessAndTheErrorSaysWhatToDo) {
  ProcessOwner owner;
  const ForkedChildEnd end = RunInForkedChild([&] {
    if (owner.here()) return 1;
    const Status st = owner.Check("this thing", "make another here");
    if (st.code() != Code::kOtherProcess) return 2;
    const std::string& m = st.message();
    const bool names = m.find("this thing") != std::string::npos && m.find("fork()") != std::string::npos &&
                       m.find(std::to_string(owner.pid())) != std::string::npos &&
                       m.find(std::to_string(::getpid())) != std::string::npos &&
                       m.find("make another here") != std::string::npos;
    return names ? 0 : 3;
  });
  EXPECT_EQ(end.exit_code, 0);
}

TEST(ProcessOwner, AChildLeaksThreadsAndForgetsWaitersInsteadOfHanging) {
  // A thread of the parent waits on cv when the child is forked: in the child, joining
  // it or destroying cv as is would crash or wait for ever.
  struct Parts {
    std::mutex mu;
    std::condition_variable cv;
    bool stop = false;
    std::thread waiter;
  };
  auto* parts = new Parts;
  parts->waiter = std::thread([parts] {
    std::unique_lock<std::mutex> lock(parts->mu);
    parts->cv.wait(lock, [parts] { return parts->stop; });
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the waiter waits
  const ForkedChildEnd end = RunInForkedChild([&] {
    Leak(std::move(parts->waiter));
    ForgetWaiters(parts->cv);
    delete parts;  // ~condition_variable returns; no joinable std::thread is destroyed
    return 0;
  });
  EXPECT_FALSE(end.hung);
  EXPECT_EQ(end.signal, 0);
  EXPECT_EQ(end.exit_code, 0);
  {
    std::lock_guard<std::mutex> lock(parts->mu);
    parts->stop = true;
  }
  parts->cv.notify_all();
  parts->waiter.join();
  delete parts;
}

}  // namespace
}  // namespace ddp
