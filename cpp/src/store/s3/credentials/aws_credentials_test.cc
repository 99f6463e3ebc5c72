#include "store/s3/credentials/aws_credentials.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace ddp::store_internal {
namespace {

using std::chrono::seconds;

int64_t Epoch(WallClock::time_point t) {
  return std::chrono::duration_cast<seconds>(t.time_since_epoch()).count();
}

TEST(ParseIso8601Test, ReadsTheFormsAwsWrites) {
  EXPECT_EQ(Epoch(*ParseIso8601("1970-01-01T00:00:00Z", "x")), 0);
  EXPECT_EQ(Epoch(*ParseIso8601("2026-11-22T03:00:00Z", "x")), 1795316400);
  EXPECT_EQ(Epoch(*ParseIso8601("2026-11-22T03:00:00.999Z", "x")), 1795316400);
  EXPECT_EQ(Epoch(*ParseIso8601("2026-11-22T05:30:00+02:30", "x")), 1795316400);
  EXPECT_EQ(Epoch(*ParseIso8601("2026-11-22T00:00:00-0300", "x")), 1795316400);
  EXPECT_EQ(Epoch(*ParseIso8601("2000-02-29T12:00:00Z", "x")), 951825600);
  auto frac = ParseIso8601("1970-01-01T00:00:01.25Z", "x");
  EXPECT_EQ(std::chrono::duration_cast<std::chrono::milliseconds>(frac->time_since_epoch())
                .count(),
            1250);
}

TEST(ParseIso8601Test, RejectsOtherText) {
  for (std::string_view bad :
       {"", "2026-11-22", "2026-11-22T03:00:00", "2026-13-01T00:00:00Z", "2026-11-22T25:00:00Z",
        "2026-11-22T03:00:00Zjunk", "2026-11-22T03:00:00.Z", "1795316400", "2026-11-22T03:00Z"}) {
    auto t = ParseIso8601(bad, "container credentials at http://x");
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_EQ(t.status().code(), Code::kDataLoss);
    EXPECT_NE(t.status().message().find("container credentials at http://x"), std::string::npos);
  }
}

// A clock the test moves by hand, and a fetch that hands out numbered keys.
struct FakeSource {
  std::atomic<int64_t> now_s{1'000'000};
  std::atomic<int> calls{0};
  std::atomic<bool> fail{false};
  int64_t lifetime_s = 3600;

  WallClock::time_point Now() const { return WallClock::time_point(seconds(now_s.load())); }
  Result<AwsCredentials> Fetch() {
    int n = ++calls;
    if (fail) return UnavailableError("agent down");
    AwsCredentials c{"AK" + std::to_string(n), "SK", "TOK", "fake", {}};
    c.expiration = Now() + seconds(lifetime_s);
    return c;
  }
  RefreshingCredentials Provider() {
    return RefreshingCredentials([this] { return Fetch(); }, [this] { return Now(); });
  }
};

TEST(RefreshingCredentialsTest, RefreshesFiveMinutesBeforeExpiry) {
  FakeSource src;
  auto p = src.Provider();
  EXPECT_EQ(p.Get()->access_key, "AK1");
  src.now_s += 3600 - 301;  // 5 min + 1 s left: still cached
  EXPECT_EQ(p.Get()->access_key, "AK1");
  EXPECT_EQ(src.calls, 1);
  src.now_s += 2;  // 4:59 left: refreshed
  EXPECT_EQ(p.Get()->access_key, "AK2");
  EXPECT_EQ(p.Get()->access_key, "AK2");
  EXPECT_EQ(src.calls, 2);
  EXPECT_EQ(p.fetches(), 2);
}

TEST(RefreshingCredentialsTest, ShortLivedKeysAreRefreshedHalfway) {
  FakeSource src;
  src.lifetime_s = 60;
  auto p = src.Provider();
  EXPECT_EQ(p.Get()->access_key, "AK1");
  src.now_s += 29;
  EXPECT_EQ(p.Get()->access_key, "AK1");
  src.now_s += 1;
  EXPECT_EQ(p.Get()->access_key, "AK2");
}

TEST(RefreshingCredentialsTest, AFailedEarlyRefreshKeepsTheValidKeysThenExpiryFails) {
  FakeSource src;
  auto p = src.Provider();
  EXPECT_EQ(p.Get()->access_key, "AK1");
  src.fail = true;
  src.now_s += 3600 - 120;  // refresh due, keys valid for 2 more minutes
  EXPECT_EQ(p.Get()->access_key, "AK1");
  EXPECT_EQ(src.calls, 2);
  EXPECT_EQ(p.Get()->access_key, "AK1");  // not retried before retry_after (10 s)
  EXPECT_EQ(src.calls, 2);
  src.now_s += 10;
  EXPECT_EQ(p.Get()->access_key, "AK1");
  EXPECT_EQ(src.calls, 3);
  src.now_s += 200;  // expired: the error comes through
  auto r = p.Get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "agent down");
  EXPECT_EQ(src.calls, 4);
  EXPECT_FALSE(p.Get().ok());  // within a second of the failure: no new fetch
  EXPECT_EQ(src.calls, 4);
  src.fail = false;
  src.now_s += 1;
  EXPECT_EQ(p.Get()->access_key, "AK5");
}

TEST(RefreshingCredentialsTest, KeysExpiredOnArrivalAreNotFetchedPerCall) {
  FakeSource src;
  src.lifetime_s = -30;  // our clock runs ahead of the agent's
  auto p = src.Provider();
  EXPECT_EQ(p.Get()->access_key, "AK1");
  EXPECT_EQ(p.Get()->access_key, "AK1");
  EXPECT_EQ(src.calls, 1);
  src.now_s += 5;  // tried again after retry_after / 2, not on every call
  EXPECT_EQ(p.Get()->access_key, "AK2");
  EXPECT_EQ(src.calls, 2);
}

TEST(RefreshingCredentialsTest, InvalidateFetchesAgain) {
  FakeSource src;
  auto p = src.Provider();
  EXPECT_EQ(p.Get()->access_key, "AK1");
  p.Invalidate();
  EXPECT_EQ(p.Get()->access_key, "AK2");
}

TEST(RefreshingCredentialsTest, KeysWithoutExpiryAreFetchedOnce) {
  int calls = 0;
  RefreshingCredentials p([&]() -> Result<AwsCredentials> {
    ++calls;
    return AwsCredentials{"AK", "SK", "", "fake", {}};
  });
  for (int i = 0; i < 5; ++i) EXPECT_EQ(p.Get()->access_key, "AK");
  EXPECT_EQ(calls, 1);
}

TEST(RefreshingCredentialsTest, OneFetchAtATimeUnderConcurrentCallers) {
  std::atomic<int> in_fetch{0}, max_in_fetch{0}, calls{0};
  std::atomic<int64_t> now_s{0};
  RefreshingCredentials p(
      [&]() -> Result<AwsCredentials> {
        int inside = ++in_fetch;
        int seen = max_in_fetch.load();
        while (inside > seen && !max_in_fetch.compare_exchange_weak(seen, inside)) {
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        int n = ++calls;
        --in_fetch;
        AwsCredentials c{"AK" + std::to_string(n), "SK", "T", "fake", {}};
        c.expiration = WallClock::time_point(seconds(now_s.load() + 60));
        return c;
      },
      [&] { return WallClock::time_point(seconds(now_s.load())); });
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        if (!p.Get().ok()) ++errors;
        if (i % 50 == 0) now_s += 31;  // past the halfway refresh point, now and then
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(errors, 0);
  EXPECT_EQ(max_in_fetch, 1);
  EXPECT_GE(calls, 2);
  EXPECT_LE(calls, 64);  // about one per clock step (32), never one per call (1600)
}

}  // namespace
}  // namespace ddp::store_internal
