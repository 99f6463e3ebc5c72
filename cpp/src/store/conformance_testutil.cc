#include "store/conformance_testutil.h"

#include <unistd.h>

#include <atomic>
#include <map>
#include <set>
#include <thread>

namespace ddp::testing {
namespace {

std::string Pattern(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    s[i] = static_cast<char>(x & 0xff);
  }
  return s;
}

}  // namespace

std::string StoreFactoryName(const ::testing::TestParamInfo<StoreFactory>& info) {
  return info.param.name;
}

std::string UniqueName() {
  static std::atomic<int> counter{0};
  std::string test = ::testing::UnitTest::GetInstance()->current_test_info()
                         ? ::testing::UnitTest::GetInstance()->current_test_info()->name()
                         : "none";
  for (char& c : test) {
    if (!isalnum(static_cast<unsigned char>(c))) c = '-';
  }
  return "conf-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1)) + "-" +
         test;
}

void StoreConformanceTest::SetUp() {
  Result<StorePair> r = GetParam().open(UniqueName());
  if (!r.ok() && r.status().code() == Code::kFailedPrecondition) {
    GTEST_SKIP() << r.status().message();
  }
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  pair_ = std::move(r).value();
  ASSERT_NE(pair_.reader, nullptr);
}

void StoreConformanceTest::MustPut(const std::string& key, const std::string& data) {
  Status s = writer().Put(key, data);
  ASSERT_TRUE(s.ok()) << s.ToString();
}

TEST_P(StoreConformanceTest, NewStoreListsNothing) {
  if (!GetParam().lists) GTEST_SKIP() << "back-end does not list";
  auto r = store().List("");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->empty());
}

TEST_P(StoreConformanceTest, PutThenGetRoundTripsBinaryData) {
  std::string data = Pattern(70000, 1);
  data[10] = '\0';
  ASSERT_NO_FATAL_FAILURE(MustPut("dir/sub/object.bin", data));
  ASSERT_NO_FATAL_FAILURE(MustPut("empty", ""));
  auto got = store().Get("dir/sub/object.bin");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, data);
  auto empty = store().Get("empty");
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ(*empty, "");
}

TEST_P(StoreConformanceTest, PutOverwrites) {
  ASSERT_NO_FATAL_FAILURE(MustPut("k", "first version"));
  ASSERT_NO_FATAL_FAILURE(MustPut("k", "second"));
  auto got = store().Get("k");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "second");
  auto st = store().Stat("k");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->size, 6u);
}

TEST_P(StoreConformanceTest, MissingKeyIsNotFoundAndNamesTheKey) {
  auto got = store().Get("no/such-key.txt");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Code::kNotFound) << got.status().ToString();
  EXPECT_NE(got.status().message().find("no/such-key.txt"), std::string::npos)
      << got.status().ToString();
  auto st = store().Stat("no/such-key.txt");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), Code::kNotFound) << st.status().ToString();
  EXPECT_NE(st.status().message().find("no/such-key.txt"), std::string::npos);
  auto range = store().Get("no/such-key.txt", ByteRange{5, 10});
  ASSERT_FALSE(range.ok());
  EXPECT_EQ(range.status().code(), Code::kNotFound) << range.status().ToString();
}

TEST_P(StoreConformanceTest, StatReportsSize) {
  ASSERT_NO_FATAL_FAILURE(MustPut("a/b.txt", std::string(1234, 'x')));
  auto st = store().Stat("a/b.txt");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->key, "a/b.txt");
  EXPECT_EQ(st->size, 1234u);
}

TEST_P(StoreConformanceTest, ByteRanges) {
  std::string data = Pattern(5000, 2);
  ASSERT_NO_FATAL_FAILURE(MustPut("r", data));
  struct Case {
    ByteRange range;
    std::string want;
  };
  std::vector<Case> cases = {
      {{0, 10}, data.substr(0, 10)},
      {{100, 900}, data.substr(100, 900)},
      {{4990, std::nullopt}, data.substr(4990)},
      {{0, std::nullopt}, data},
      {{4000, 5000}, data.substr(4000)},  // a length past the end is clamped
      {{4999, 1}, data.substr(4999, 1)},
      {{5000, std::nullopt}, ""},  // an offset at the end is empty, not an error
      {{123, 0}, ""},
  };
  for (const Case& c : cases) {
    auto got = store().Get("r", c.range);
    ASSERT_TRUE(got.ok()) << "offset " << c.range.offset << ": " << got.status().ToString();
    EXPECT_EQ(got->size(), c.want.size()) << "offset " << c.range.offset;
    EXPECT_TRUE(*got == c.want) << "offset " << c.range.offset;
  }
  auto past = store().Get("r", ByteRange{5001, 10});
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), Code::kOutOfRange) << past.status().ToString();
  EXPECT_NE(past.status().message().find("r"), std::string::npos);
}

TEST_P(StoreConformanceTest, ListsUnderAPrefixSortedWithSizes) {
  if (!GetParam().lists) GTEST_SKIP() << "back-end does not list";
  std::map<std::string, std::string> objects = {
      {"img/cat/1.jpg", "a"},     {"img/cat/2.jpg", "bb"}, {"img/dog/1.jpg", "ccc"},
      {"img/dogs.txt", "dddd"},   {"imgx/other", "e"},     {"top", "ffffff"},
      {"img/cat/sub/deep.jpg", "g"},
  };
  for (const auto& [k, v] : objects) ASSERT_NO_FATAL_FAILURE(MustPut(k, v));

  auto all = store().List("");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->size(), objects.size());
  size_t i = 0;
  for (const auto& [k, v] : objects) {  // std::map iterates sorted, as List must return
    EXPECT_EQ((*all)[i].key, k);
    EXPECT_EQ((*all)[i].size, v.size()) << k;
    ++i;
  }
  auto keys = [&](std::string_view prefix) {
    std::vector<std::string> out;
    auto r = store().List(prefix);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) {
      for (const auto& o : *r) out.push_back(o.key);
    }
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(keys("img/cat/"), (V{"img/cat/1.jpg", "img/cat/2.jpg", "img/cat/sub/deep.jpg"}));
  EXPECT_EQ(keys("img/dog"), (V{"img/dog/1.jpg", "img/dogs.txt"}));  // a string prefix
  EXPECT_EQ(keys("img"), (V{"img/cat/1.jpg", "img/cat/2.jpg", "img/cat/sub/deep.jpg",
                            "img/dog/1.jpg", "img/dogs.txt", "imgx/other"}));
  EXPECT_EQ(keys("nothing/"), V{});
  EXPECT_EQ(keys("top"), V{"top"});
}

TEST_P(StoreConformanceTest, DeleteRemovesAndMissingDeleteIsOk) {
  ASSERT_NO_FATAL_FAILURE(MustPut("gone/soon", "x"));
  Status s = writer().Delete("gone/soon");
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto got = store().Get("gone/soon");
  EXPECT_EQ(got.status().code(), Code::kNotFound) << got.status().ToString();
  Status again = writer().Delete("gone/soon");
  EXPECT_TRUE(again.ok()) << again.ToString();
  if (GetParam().lists) {
    auto l = store().List("gone/");
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_TRUE(l->empty());
  }
}

TEST_P(StoreConformanceTest, ReadOnlyStoresRefuseWrites) {
  if (GetParam().writable) GTEST_SKIP() << "back-end is writable";
  Status p = store().Put("k", "v");
  EXPECT_EQ(p.code(), Code::kUnimplemented) << p.ToString();
  Status d = store().Delete("k");
  EXPECT_EQ(d.code(), Code::kUnimplemented) << d.ToString();
}

TEST_P(StoreConformanceTest, EmptyKeyIsInvalid) {
  EXPECT_EQ(store().Get("").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(store().Stat("").status().code(), Code::kInvalidArgument);
  if (GetParam().writable) {
    EXPECT_EQ(store().Put("", "x").code(), Code::kInvalidArgument);
  }
}

TEST_P(StoreConformanceTest, KeyUrlNamesRootAndKey) {
  std::string u = store().KeyUrl("a/b");
  EXPECT_TRUE(u.starts_with(store().url())) << u;
  EXPECT_TRUE(u.ends_with("/a/b")) << u;
}

TEST_P(StoreConformanceTest, GetManyDeliversEveryKeyOnceWithErrorsPerKey) {
  constexpr size_t kN = 150;
  std::vector<std::string> keys;
  std::map<std::string, std::string> want;
  for (size_t i = 0; i < kN; ++i) {
    std::string k = "many/" + std::to_string(i) + ".bin";
    keys.push_back(k);
    if (i % 10 == 7) continue;  // missing
    want[k] = Pattern(100 + i * 37, static_cast<uint32_t>(i));
    ASSERT_NO_FATAL_FAILURE(MustPut(k, want[k]));
  }
  std::vector<int> calls(kN, 0);
  std::atomic<int> in_callback{0};
  bool overlapped = false;
  Status s = store().GetMany(
      keys,
      [&](size_t index, Result<std::string> data) {
        if (in_callback.fetch_add(1) != 0) overlapped = true;
        ASSERT_LT(index, kN);
        calls[index]++;
        const std::string& k = keys[index];
        if (index % 10 == 7) {
          EXPECT_EQ(data.status().code(), Code::kNotFound) << k << ": " << data.status().ToString();
          EXPECT_NE(data.status().message().find(k), std::string::npos) << data.status().ToString();
        } else {
          EXPECT_TRUE(data.ok()) << k << ": " << data.status().ToString();
          if (data.ok()) {
            EXPECT_TRUE(*data == want[k]) << k;
          }
        }
        in_callback.fetch_sub(1);
      },
      8);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(overlapped) << "callbacks ran concurrently";
  for (size_t i = 0; i < kN; ++i) EXPECT_EQ(calls[i], 1) << "key " << keys[i];
}

TEST_P(StoreConformanceTest, GetManyStopsWhenCancelled) {
  std::vector<std::string> keys;
  for (int i = 0; i < 60; ++i) {
    keys.push_back("c/" + std::to_string(i));
    ASSERT_NO_FATAL_FAILURE(MustPut(keys.back(), "v" + std::to_string(i)));
  }
  std::atomic<bool> cancel{false};
  int delivered = 0, cancelled = 0;
  std::vector<int> calls(keys.size(), 0);
  Status s = store().GetManyCancellable(
      keys,
      [&](size_t index, Result<std::string> data) {
        calls[index]++;
        if (data.ok()) {
          ++delivered;
          cancel = true;  // stop after the first object
        } else {
          EXPECT_EQ(data.status().code(), Code::kCancelled) << data.status().ToString();
          EXPECT_NE(data.status().message().find(keys[index]), std::string::npos);
          ++cancelled;
        }
      },
      2, cancel);
  EXPECT_EQ(s.code(), Code::kCancelled) << s.ToString();
  EXPECT_GE(delivered, 1);
  EXPECT_LE(delivered, 3);  // at most what was already in flight
  EXPECT_EQ(delivered + cancelled, static_cast<int>(keys.size()));
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(calls[i], 1) << keys[i];
  // The store stays usable after a cancelled batch.
  int after = 0;
  ASSERT_TRUE(store().GetMany(keys, [&](size_t, Result<std::string> d) { after += d.ok(); }).ok());
  EXPECT_EQ(after, static_cast<int>(keys.size()));
}

TEST_P(StoreConformanceTest, GetManyOfNothingReturnsAtOnce) {
  std::vector<std::string> keys;
  int calls = 0;
  Status s = store().GetMany(keys, [&](size_t, Result<std::string>) { ++calls; });
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(calls, 0);
}

TEST_P(StoreConformanceTest, ConcurrentReadersAndWritersSeeWholeObjects) {
  const std::string a(20000, 'a'), b(30000, 'b');
  ASSERT_NO_FATAL_FAILURE(MustPut("shared", a));
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&] {
      while (!stop.load()) {
        auto got = store().Get("shared");
        if (!got.ok() || (*got != a && *got != b)) bad.fetch_add(1);
      }
    });
  }
  for (int i = 0; i < 20; ++i) {
    Status s = writer().Put("shared", i % 2 ? a : b);
    if (!s.ok()) bad.fetch_add(1);
  }
  stop = true;
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST_P(StoreConformanceTest, LargeObjectRoundTrips) {
  std::string big = Pattern(6 << 20, 9);  // above a small multipart threshold
  ASSERT_NO_FATAL_FAILURE(MustPut("big/object", big));
  auto got = store().Get("big/object");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->size(), big.size());
  EXPECT_TRUE(*got == big);
  auto tail = store().Get("big/object", ByteRange{big.size() - 100, std::nullopt});
  ASSERT_TRUE(tail.ok()) << tail.status().ToString();
  EXPECT_TRUE(*tail == big.substr(big.size() - 100));
}

}  // namespace ddp::testing
