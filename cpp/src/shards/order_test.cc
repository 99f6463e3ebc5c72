#include "shards/order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

namespace ddp::shards {
namespace {

std::vector<int64_t> Samples(const std::vector<int64_t>& counts, uint64_t epoch, ShardOrderOptions o,
                             std::vector<Segment> segments = {}) {
  if (segments.empty()) segments = EpochSegments(counts, o.shuffle, o.seed, epoch);
  Result<RankOrder> r = RankSamples(counts, segments, epoch, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->samples : std::vector<int64_t>{};
}

// Every rank's samples for an epoch; checks the balance bound on the way: equal lengths,
// every sample of the epoch yielded (or, with drop_last, at most once), and at most
// world_size - 1 repeats (padding) or drops.
void CheckBalance(const std::vector<int64_t>& counts, int world, bool drop_last, uint64_t epoch, int64_t buffer) {
  const int64_t n = Prefix(counts).back();
  std::map<int64_t, int> seen;
  size_t len = 0;
  for (int r = 0; r < world; ++r) {
    auto s = Samples(counts, epoch,
                     {.shuffle = true, .seed = 9, .rank = r, .world_size = world, .drop_last = drop_last,
                      .shuffle_buffer = buffer});
    if (r == 0) len = s.size();
    ASSERT_EQ(s.size(), len) << "rank " << r << " of " << world;
    for (int64_t id : s) ++seen[id];
  }
  int64_t repeats = 0;
  for (const auto& [id, k] : seen) repeats += k - 1;
  const int64_t total = static_cast<int64_t>(len) * world;
  if (drop_last) {
    EXPECT_EQ(repeats, 0);
    EXPECT_EQ(static_cast<int64_t>(len), n / world);
    EXPECT_LE(n - total, world - 1);
  } else {
    EXPECT_EQ(static_cast<int64_t>(seen.size()), n) << "a sample was never yielded";
    EXPECT_EQ(repeats, total - n);
    EXPECT_LE(repeats, world - 1);
  }
}

TEST(ShardOrderTest, RanksDifferByAtMostOneSampleBeforePadding) {
  // Uneven shards: the 203 samples of 7 shards (6 x 30 + 23) webdataset's ShardWriter
  // writes, big and tiny shards, an empty one.
  const std::vector<std::vector<int64_t>> sets = {
      {30, 30, 30, 30, 30, 30, 23}, {10, 10, 10, 10, 10, 10, 10, 4}, {1000, 3, 1, 0, 250, 17}, {5}, {2, 1}};
  for (const auto& counts : sets) {
    for (int world : {1, 2, 3, 8}) {
      for (bool drop_last : {false, true}) {
        for (uint64_t epoch : {0u, 1u}) {
          SCOPED_TRACE(::testing::Message() << "world " << world << " drop_last " << drop_last << " epoch " << epoch
                                            << " shards " << counts.size());
          CheckBalance(counts, world, drop_last, epoch, 7);
        }
      }
    }
  }
}

TEST(ShardOrderTest, RanksReadContiguousRunsSharingBoundaryShards) {
  const std::vector<int64_t> counts = {30, 30, 30, 30, 30, 30, 23};  // 203
  std::map<int64_t, int> readers;
  for (int r = 0; r < 2; ++r) {
    auto order = RankSamples(counts, EpochSegments(counts, false, 0, 0), 0, {.shuffle = false, .rank = r, .world_size = 2});
    ASSERT_TRUE(order.ok());
    EXPECT_EQ(order->samples.size(), 102u);
    for (const Segment& g : order->parts) ++readers[g.shard];
    if (r == 0) {
      EXPECT_EQ(order->parts, (std::vector<Segment>{{0, 0, 30}, {1, 0, 30}, {2, 0, 30}, {3, 0, 12}}));
    } else {
      // The rest from sample 12 of shard 3, then one padding sample: the head again.
      EXPECT_EQ(order->parts, (std::vector<Segment>{{3, 12, 30}, {4, 0, 30}, {5, 0, 30}, {6, 0, 23}, {0, 0, 1}}));
    }
  }
  int shared = 0;
  for (const auto& [shard, k] : readers) shared += k - 1;
  EXPECT_EQ(shared, 2);  // the boundary shard and the padding's head
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

TEST(ShardOrderTest, SegmentsOfShards) {
  const std::vector<int64_t> counts = {3, 3, 3, 3};
  auto s = Samples(counts, 0, {.shuffle = false, .rank = 0, .world_size = 1}, {{2, 0, 3}, {0, 1, 2}});
  EXPECT_EQ(s, (std::vector<int64_t>{6, 7, 8, 1}));
  EXPECT_FALSE(RankSamples(counts, {{4, 0, 1}}, 0, {}).ok());
  EXPECT_FALSE(RankSamples(counts, {{0, 2, 4}}, 0, {}).ok());
  EXPECT_FALSE(RankSamples(counts, {{0, 2, 1}}, 0, {}).ok());
  EXPECT_FALSE(RankSamples(counts, {{0, 0, 1}}, 0, {.rank = 2, .world_size = 2}).ok());
  // An epoch without samples: every rank yields none.
  EXPECT_TRUE(Samples({0, 0}, 0, {.rank = 1, .world_size = 2}).empty());
}

TEST(ShardOrderTest, UnreadSegmentsAreExactlyTheSamplesNoRankYielded) {
  const std::vector<int64_t> counts = {30, 30, 30, 30, 30, 30, 23};
  const ShardOrderOptions o{.shuffle = true, .seed = 4, .world_size = 3, .shuffle_buffer = 10};
  const auto segments = EpochSegments(counts, true, 4, 1);
  for (int64_t position : {0, 1, 25, 68}) {
    std::set<int64_t> yielded;
    for (int r = 0; r < 3; ++r) {
      ShardOrderOptions mine = o;
      mine.rank = r;
      auto order = RankSamples(counts, segments, 1, mine).value().samples;
      yielded.insert(order.begin(), order.begin() + std::min<int64_t>(position, static_cast<int64_t>(order.size())));
    }
    auto unread = UnreadSegments(counts, segments, 1, o, position);
    ASSERT_TRUE(unread.ok()) << unread.status().ToString();
    const auto prefix = Prefix(counts);
    std::set<int64_t> rest;
    for (const Segment& g : *unread) {
      for (int64_t i = g.begin; i < g.end; ++i) {
        EXPECT_TRUE(rest.insert(prefix[static_cast<size_t>(g.shard)] + i).second) << "read twice";
      }
    }
    for (int64_t id = 0; id < 203; ++id) {
      EXPECT_NE(yielded.count(id), rest.count(id)) << "sample " << id << " at position " << position;
    }
    // The rest reads on another world size with the same balance.
    for (int world : {2, 4}) {
      size_t len = 0;
      std::set<int64_t> after;
      for (int r = 0; r < world; ++r) {
        auto s = Samples(counts, 1, {.shuffle = true, .seed = 4, .rank = r, .world_size = world}, *unread);
        if (r == 0) len = s.size();
        EXPECT_EQ(s.size(), len);
        after.insert(s.begin(), s.end());
      }
      if (!rest.empty()) {
        EXPECT_EQ(after, rest);
      }
    }
  }
  EXPECT_FALSE(UnreadSegments(counts, segments, 1, o, -1).ok());
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
