#include "pipeline/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

namespace ddp::pipeline {
namespace {

std::vector<int64_t> Gather(int64_t n, int ws, bool drop_last, bool shuffle, uint64_t epoch) {
  std::vector<int64_t> all;
  int64_t per = -1;
  for (int r = 0; r < ws; ++r) {
    auto s = DistributedSampler::Create(n, {shuffle, 42, r, ws, drop_last});
    EXPECT_TRUE(s.ok());
    auto idx = s->Indices(epoch);
    EXPECT_EQ(static_cast<int64_t>(idx.size()), s->num_samples());
    if (per >= 0) {
      EXPECT_EQ(per, s->num_samples());
    }
    per = s->num_samples();
    all.insert(all.end(), idx.begin(), idx.end());
  }
  return all;
}

TEST(Sampler, EveryIndexOncePerEpochWhenDivisible) {
  for (int ws : {1, 2, 3, 4}) {
    auto all = Gather(12, ws, false, true, 5);
    std::sort(all.begin(), all.end());
    std::vector<int64_t> want(12);
    for (int i = 0; i < 12; ++i) want[static_cast<size_t>(i)] = i;
    EXPECT_EQ(all, want) << "world_size " << ws;
  }
}

TEST(Sampler, PadsLikeTorchWhenUneven) {
  // torch: n=10, ws=4 -> num_samples 3, total 12, the first 2 of the order repeated.
  auto all = Gather(10, 4, false, false, 0);
  ASSERT_EQ(all.size(), 12u);
  std::map<int64_t, int> count;
  for (auto i : all) count[i]++;
  EXPECT_EQ(count.size(), 10u);
  EXPECT_EQ(count[0], 2);
  EXPECT_EQ(count[1], 2);
  // unshuffled rank 1 takes positions 1, 5, 9
  auto s = DistributedSampler::Create(10, {false, 0, 1, 4, false});
  EXPECT_EQ(s->Indices(0), (std::vector<int64_t>{1, 5, 9}));
  // drop_last: ceil((10 - 4) / 4) = 2 each, 8 distinct
  auto d = Gather(10, 4, true, true, 1);
  EXPECT_EQ(d.size(), 8u);
  std::sort(d.begin(), d.end());
  EXPECT_EQ(std::unique(d.begin(), d.end()), d.end());
}

TEST(Sampler, ShuffleDependsOnSeedAndEpoch) {
  auto s = DistributedSampler::Create(100, {true, 1, 0, 1, false});
  auto t = DistributedSampler::Create(100, {true, 2, 0, 1, false});
  EXPECT_EQ(s->Indices(0), s->Indices(0));
  EXPECT_NE(s->Indices(0), s->Indices(1));
  EXPECT_NE(s->Indices(0), t->Indices(0));
}

TEST(Sampler, RejectsBadRank) {
  EXPECT_EQ(DistributedSampler::Create(10, {true, 0, 2, 2, false}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(DistributedSampler::Create(10, {true, 0, 0, 0, false}).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ddp::pipeline
