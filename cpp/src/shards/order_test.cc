#include "shards/order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace ddp::shards {
namespace {

std::vector<int64_t> Samples(const std::vector<int64_t>& counts, uint64_t epoch, ShardOrderOptions o,
                             std::vector<int64_t> shards = {}) {
  if (shards.empty()) shards = EpochShards(static_cast<int64_t>(counts.size()), o.shuffle, o.seed, epoch);
  Result<RankOrder> r = RankSamples(counts, shards, epoch, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->samples : std::vector<int64_t>{};
}

TEST(ShardOrderTest, EveryRankEqualLengthAndFullCoverageWithPadding) {
  const std::vector<int64_t> counts = {10, 10, 10, 10, 10, 10, 10, 4};  // 74 samples, 8 shards
  for (uint64_t epoch : {0u, 1u}) {
    std::multiset<int64_t> seen;
    size_t len = 0;
    for (int r = 0; r < 3; ++r) {
      auto s = Samples(counts, epoch, {.shuffle = true, .seed = 5, .rank = r, .world_size = 3, .shuffle_buffer = 7});
      if (r == 0) len = s.size();
      EXPECT_EQ(s.size(), len) << "rank " << r;
      seen.insert(s.begin(), s.end());
    }
    for (int64_t id = 0; id < 74; ++id) EXPECT_GE(seen.count(id), 1u) << "sample " << id << " epoch " << epoch;
  }
}

TEST(ShardOrderTest, DropLastTakesTheSmallestRank) {
  const std::vector<int64_t> counts = {10, 10, 10, 10, 3};
  size_t len = 0;
  for (int r = 0; r < 2; ++r) {
    auto s = Samples(counts, 0, {.shuffle = false, .rank = r, .world_size = 2, .drop_last = true});
    if (r == 0) len = s.size();
    EXPECT_EQ(s.size(), len);
    std::set<int64_t> unique(s.begin(), s.end());
    EXPECT_EQ(unique.size(), s.size());  // no repeats when dropping
  }
  // Shards 0, 2, 4 (23 samples) against 1, 3 (20): 20 each.
  EXPECT_EQ(len, 20u);
}

TEST(ShardOrderTest, DeterministicPerSeedAndEpoch) {
  const std::vector<int64_t> counts(20, 25);
  const ShardOrderOptions o{.shuffle = true, .seed = 1, .rank = 1, .world_size = 2, .shuffle_buffer = 50};
  EXPECT_EQ(Samples(counts, 3, o), Samples(counts, 3, o));
  EXPECT_NE(Samples(counts, 3, o), Samples(counts, 4, o));
  ShardOrderOptions other = o;
  other.seed = 2;
  EXPECT_NE(Samples(counts, 3, o), Samples(counts, 3, other));
  // The shuffle buffer mixes samples of neighbouring shards, not the whole rank at once.
  auto s = Samples(counts, 0, o);
  auto sorted = s;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NE(s, sorted);
  const std::vector<int64_t> plain = Samples(counts, 0, {.shuffle = false, .rank = 0, .world_size = 1});
  std::vector<int64_t> all(500);
  for (int64_t i = 0; i < 500; ++i) all[static_cast<size_t>(i)] = i;
  EXPECT_EQ(plain, all);
}

TEST(ShardOrderTest, ASubsetOfShards) {
  const std::vector<int64_t> counts = {3, 3, 3, 3};
  auto s = Samples(counts, 0, {.shuffle = false, .rank = 0, .world_size = 1}, {2, 0});
  EXPECT_EQ(s, (std::vector<int64_t>{6, 7, 8, 0, 1, 2}));
  EXPECT_FALSE(RankSamples(counts, {4}, 0, {}).ok());
  EXPECT_FALSE(RankSamples(counts, {0}, 0, {.rank = 2, .world_size = 2}).ok());
}

TEST(ShardOrderTest, ShardOfId) {
  const auto prefix = Prefix({3, 0, 2});
  EXPECT_EQ(ShardOf(prefix, 0), 0);
  EXPECT_EQ(ShardOf(prefix, 2), 0);
  EXPECT_EQ(ShardOf(prefix, 3), 2);
  EXPECT_EQ(ShardOf(prefix, 4), 2);
}

}  // namespace
}  // namespace ddp::shards
