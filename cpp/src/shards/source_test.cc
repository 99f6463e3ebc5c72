#include "shards/source.h"

#include <gtest/gtest.h>

#include <set>

#include "image/image_testutil.h"
#include "pipeline/loader.h"
#include "shards/tar_testutil.h"

namespace ddp::shards {
namespace {

using pipeline::Loader;
using pipeline::LoaderOptions;

// Shards in a real (in-memory) store: shard s holds counts[s] JPEGs; each sample's label
// is its global id, so the labels a loader yields spell out the order it read.
struct Shards {
  std::shared_ptr<Store> store;
  std::vector<std::string> keys;
  std::vector<int64_t> counts;
};

Shards MakeShards(const std::string& name, const std::vector<int64_t>& counts) {
  Shards f;
  f.store = OpenStore("memory://" + name).value();
  f.counts = counts;
  int64_t id = 0;
  for (size_t s = 0; s < counts.size(); ++s) {
    std::string tar;
    for (int64_t i = 0; i < counts[s]; ++i, ++id) {
      const int w = 20 + static_cast<int>(id % 7), h = 18 + static_cast<int>(id % 5);
      const std::string key = "s" + std::to_string(s) + "/" + std::to_string(id);
      tar += testing::TarMember(key + ".jpg", image::testing::EncodeJpeg(image::testing::Pattern(w, h), w, h, 3, 90));
      tar += testing::TarMember(key + ".cls", std::to_string(id));
    }
    tar += testing::TarEnd();
    f.keys.push_back("shard-" + std::to_string(s) + ".tar");
    EXPECT_TRUE(f.store->Put(f.keys.back(), tar).ok());
  }
  return f;
}

image::Pipeline Resize8() {
  image::TransformOp r;
  r.kind = image::OpKind::kResize;
  r.height = r.width = 8;
  image::TransformOp tt;
  tt.kind = image::OpKind::kPILToTensor;
  return image::Pipeline::Create({r, tt}).value();
}

std::unique_ptr<Loader> MakeLoader(const Shards& f, ShardSourceOptions so, int batch_size = 4) {
  auto src = ShardSource::Create(f.store, f.keys, f.counts, so);
  EXPECT_TRUE(src.ok()) << src.status().ToString();
  LoaderOptions o;
  o.batch_size = batch_size;
  o.num_threads = 2;
  o.skip_errors = so.parse.skip_errors;
  return Loader::Create(*src, Resize8(), o).value();
}

// (labels, pixels) of every batch of an epoch from `start`.
std::pair<std::vector<int64_t>, std::vector<uint8_t>> ReadEpoch(Loader& l, uint64_t epoch, int64_t start = 0) {
  std::pair<std::vector<int64_t>, std::vector<uint8_t>> out;
  EXPECT_TRUE(l.StartEpoch(epoch, start).ok());
  for (;;) {
    auto b = l.Next();
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok() || !b->has_value()) break;
    const auto& batch = **b;
    out.first.insert(out.first.end(), batch.labels, batch.labels + batch.size);
    const auto* px = static_cast<const uint8_t*>(batch.images);
    out.second.insert(out.second.end(), px, px + batch.size * 3 * 8 * 8);
  }
  return out;
}

TEST(ShardSourceTest, RanksReadTheOrderWithEqualBatchCountsAndFullCoverage) {
  Shards f = MakeShards("shard-source-cover", {9, 9, 9, 9, 5});
  for (uint64_t epoch : {0u, 1u}) {
    std::set<int64_t> seen;
    int64_t batches = -1;
    for (int r = 0; r < 3; ++r) {
      ShardSourceOptions so;
      so.order = {.shuffle = true, .seed = 3, .rank = r, .world_size = 3, .shuffle_buffer = 6};
      auto l = MakeLoader(f, so);
      auto [labels, px] = ReadEpoch(*l, epoch);
      const auto want = RankSamples(f.counts, EpochSegments(f.counts, true, 3, epoch), epoch, so.order).value().samples;
      EXPECT_EQ(labels, want) << "rank " << r << " epoch " << epoch;
      if (batches < 0) batches = l->num_batches();
      EXPECT_EQ(l->num_batches(), batches);
      seen.insert(labels.begin(), labels.end());
    }
    EXPECT_EQ(seen.size(), 41u);
  }
}

TEST(ShardSourceTest, ResumeYieldsTheSameTail) {
  Shards f = MakeShards("shard-source-resume", {7, 7, 7, 7});
  ShardSourceOptions so;
  so.order = {.shuffle = true, .seed = 1, .rank = 0, .world_size = 1, .shuffle_buffer = 5};
  so.lookahead_shards = 1;
  auto l = MakeLoader(f, so, 3);
  auto full = ReadEpoch(*l, 2);
  auto tail = ReadEpoch(*l, 2, 4);
  ASSERT_EQ(full.first.size(), 28u);
  EXPECT_EQ(tail.first, std::vector<int64_t>(full.first.begin() + 12, full.first.end()));
  EXPECT_EQ(tail.second, std::vector<uint8_t>(full.second.begin() + 12 * 192, full.second.end()));
  EXPECT_EQ(CountSamples(*f.store, f.keys, {}, 0, nullptr).value(), f.counts);
}

TEST(ShardSourceTest, ASubsetOfShardsForOneEpoch) {
  Shards f = MakeShards("shard-source-subset", {4, 4, 4});
  ShardSourceOptions so;
  so.order = {.shuffle = false, .rank = 0, .world_size = 1};
  auto src = ShardSource::Create(f.store, f.keys, f.counts, so).value();
  ASSERT_TRUE(src->SetEpochSegments(1, {{2, 0, 4}}).ok());
  EXPECT_FALSE(src->SetEpochSegments(1, {{3, 0, 1}}).ok());
  EXPECT_FALSE(src->SetEpochSegments(1, {{2, 1, 5}}).ok());
  ASSERT_TRUE(src->SetEpochSegments(2, {{1, 1, 3}, {0, 3, 4}}).ok());
  LoaderOptions o;
  o.batch_size = 4;
  auto l = Loader::Create(src, Resize8(), o).value();
  EXPECT_EQ(ReadEpoch(*l, 1).first, (std::vector<int64_t>{8, 9, 10, 11}));
  EXPECT_EQ(ReadEpoch(*l, 0).first.size(), 12u);
  EXPECT_EQ(ReadEpoch(*l, 2).first, (std::vector<int64_t>{5, 6, 3}));
}

TEST(ShardSourceTest, TruncatedShardFailsNamingItOrIsSkipped) {
  Shards f = MakeShards("shard-source-bad", {4, 4});
  std::string tar = f.store->Get(f.keys[1]).value();
  ASSERT_TRUE(f.store->Put(f.keys[1], tar.substr(0, tar.size() / 2)).ok());
  ShardSourceOptions so;
  so.order = {.shuffle = false, .rank = 0, .world_size = 1};
  auto l = MakeLoader(f, so);
  ASSERT_TRUE(l->StartEpoch(0).ok());
  ASSERT_TRUE(l->Next().ok());
  auto bad = l->Next();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("memory://shard-source-bad/shard-1.tar: tar member at byte"),
            std::string::npos)
      << bad.status().ToString();

  so.parse.skip_errors = true;
  auto skipping = MakeLoader(f, so);
  auto [labels, px] = ReadEpoch(*skipping, 0);
  EXPECT_LT(labels.size(), 8u);
  EXPECT_GE(labels.size(), 4u);
  EXPECT_GE(skipping->skipped(), 1);
  int64_t skipped = 0;
  EXPECT_EQ(CountSamples(*f.store, f.keys, {.skip_errors = true}, 0, &skipped).value()[0], 4);
  EXPECT_EQ(skipped, 1);
}

// A shard of `n` samples of `bytes` each (not images: read by the source alone).
std::shared_ptr<Store> BigShard(const std::string& name, int n, size_t bytes) {
  auto store = std::shared_ptr<Store>(OpenStore("memory://" + name).value());
  std::string tar;
  tar.reserve(static_cast<size_t>(n) * (bytes + 2048));
  for (int i = 0; i < n; ++i) {
    const std::string key = std::to_string(100000 + i);
    tar += testing::TarMember(key + ".jpg", std::string(bytes, static_cast<char>(i)));
    tar += testing::TarMember(key + ".cls", std::to_string(i));
  }
  tar += testing::TarEnd();
  EXPECT_TRUE(store->Put("big.tar", tar).ok());
  return store;
}

// A source over the one shard "big.tar" of `store` (`n` samples).
std::shared_ptr<ShardSource> OneShard(std::shared_ptr<Store> store, int64_t n, ShardOrderOptions order,
                                      uint64_t range_bytes) {
  ShardSourceOptions so;
  so.order = order;
  so.range_bytes = range_bytes;
  return ShardSource::Create(std::move(store), {"big.tar"}, {n}, so).value();
}

// Every sample of the epoch through Fetch, a batch of positions at a time; returns the labels.
std::vector<int64_t> FetchAll(ShardSource& src, uint64_t epoch, int64_t batch, int64_t start = 0) {
  const auto order = src.Order(epoch).value();
  std::vector<int64_t> labels;
  const std::atomic<bool> never{false};
  for (int64_t p = start; p < static_cast<int64_t>(order.size()); p += batch) {
    std::vector<int64_t> positions;
    for (int64_t q = p; q < std::min<int64_t>(p + batch, static_cast<int64_t>(order.size())); ++q) positions.push_back(q);
    EXPECT_TRUE(src.Fetch(positions, [&](size_t, Result<pipeline::SourceSample> r) {
                      EXPECT_TRUE(r.ok()) << r.status().ToString();
                      if (r.ok()) labels.push_back(r->label);
                    }, never).ok());
  }
  return labels;
}

TEST(ShardSourceTest, StreamsABigShardInBoundedMemory) {
  // 64 MiB in one shard; ranges of 1 MiB, a shuffle buffer of 8 samples.
  auto store = BigShard("shard-source-big", 256, 256 << 10);
  auto src = OneShard(store, 256, {.shuffle = true, .seed = 2, .world_size = 1, .shuffle_buffer = 8}, 1 << 20);
  auto labels = FetchAll(*src, 0, 16);
  EXPECT_EQ(std::set<int64_t>(labels.begin(), labels.end()).size(), 256u);
  // Chunks ahead (3 x 2 x 1 MiB) + samples not yet due (buffer + a batch) + one member.
  const uint64_t bound = 6u * (1u << 20) + (8 + 16 + 2) * (256u << 10) + (1u << 20);
  EXPECT_GT(src->peak_held_bytes(), 0u);
  EXPECT_LT(src->peak_held_bytes(), bound);
  EXPECT_EQ(CountSamples(*store, {"big.tar"}, {}, 0, nullptr, 1 << 20).value(), std::vector<int64_t>{256});
}

TEST(ShardSourceTest, RanksSharingAShardEachReadTheirRange) {
  auto store = BigShard("shard-source-shared", 64, 64 << 10);  // 4 MiB
  uint64_t parsed[2] = {0, 0};
  std::set<int64_t> seen;
  for (int r = 0; r < 2; ++r) {
    auto src = OneShard(store, 64, {.shuffle = false, .rank = r, .world_size = 2}, 256 << 10);
    auto labels = FetchAll(*src, 0, 8);
    std::vector<int64_t> want(32);
    for (int i = 0; i < 32; ++i) want[static_cast<size_t>(i)] = 32 * r + i;
    EXPECT_EQ(labels, want);
    parsed[r] = src->parsed_bytes();
  }
  // Rank 0 stops after its half; rank 1 parses the whole shard (skipping rank 0's half).
  EXPECT_LT(parsed[0], (2u << 20) + (256u << 10) + 1);
  EXPECT_GE(parsed[1], 4u << 20);
}

TEST(ShardSourceTest, AResumedEpochKeepsOnlyTheSamplesStillDue) {
  auto store = BigShard("shard-source-late", 64, 64 << 10);
  auto src = OneShard(store, 64, {.shuffle = true, .seed = 5, .world_size = 1, .shuffle_buffer = 4}, 256 << 10);
  const auto all = FetchAll(*src, 1, 8);
  const auto tail = FetchAll(*src, 1, 8, 48);
  EXPECT_EQ(tail, std::vector<int64_t>(all.begin() + 48, all.end()));
  EXPECT_LT(src->peak_held_bytes(), 6u * (256u << 10) + (4 + 8 + 2) * (64u << 10) + (256u << 10));
}

// A float32 .npy of `n` elements, each `value` (numpy.save's layout, version 1.0).
std::string NpyOf(int n, float value) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(n) + ",), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY\x01";
  out += '\0';
  out += static_cast<char>(header.size());
  out += '\0';
  out += header;
  for (int i = 0; i < n; ++i) out.append(reinterpret_cast<const char*>(&value), sizeof value);
  return out;
}

TEST(ShardSourceTest, FieldsOfAnyTypeBatchedWithoutImages) {
  auto store = std::shared_ptr<Store>(OpenStore("memory://shard-source-fields").value());
  std::string tar;
  for (int i = 0; i < 6; ++i) {
    const std::string key = "s" + std::to_string(i);
    tar += testing::TarMember(key + ".cls", std::to_string(10 + i));
    tar += testing::TarMember(key + ".npy", NpyOf(i == 5 ? 4 : 3, static_cast<float>(i)));
    tar += testing::TarMember(key + ".txt", "t" + std::to_string(i));
    tar += testing::TarMember(key + ".jpg", "never read");
  }
  ASSERT_TRUE(store->Put("f.tar", tar + testing::TarEnd()).ok());
  ShardSourceOptions so;
  so.order = {.shuffle = false, .rank = 0, .world_size = 1};
  so.parse.fields = {"npy", "cls", "txt"};
  EXPECT_EQ(CountSamples(*store, {"f.tar"}, so.parse, 0, nullptr).value(), std::vector<int64_t>{6});
  auto src = ShardSource::Create(store, {"f.tar"}, {6}, so).value();
  EXPECT_FALSE(src->has_images());
  EXPECT_EQ(src->field_names(), (std::vector<std::string>{"npy", "cls", "txt"}));
  LoaderOptions o;
  o.batch_size = 3;
  o.num_threads = 1;
  o.decode_images = false;
  o.field_names = src->field_names();
  auto l = Loader::Create(src, Resize8(), o).value();
  ASSERT_TRUE(l->StartEpoch(0).ok());
  auto b = l->Next();
  ASSERT_TRUE(b.ok() && b->has_value()) << b.status().ToString();
  const auto& f = (*b)->fields;
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0].kind, pipeline::FieldKind::kArray);
  EXPECT_EQ(f[0].shape, std::vector<int64_t>{3});
  EXPECT_EQ(f[0].dtype_kind, 'f');
  ASSERT_EQ(f[0].data->size(), 3u * 3 * 4);
  const auto* px = reinterpret_cast<const float*>(f[0].data->data());
  EXPECT_EQ(std::vector<float>(px, px + 9), (std::vector<float>{0, 0, 0, 1, 1, 1, 2, 2, 2}));
  EXPECT_EQ(f[1].ints, (std::vector<int64_t>{10, 11, 12}));
  EXPECT_EQ(f[2].raw, (std::vector<std::string>{"t0", "t1", "t2"}));
  // The next batch's arrays differ in shape: an error naming both samples and shapes.
  auto bad = l->Next();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("f.tar#s3 has shape (3,) f32, memory://shard-source-fields/f.tar#s5 has (4,) f32"),
            std::string::npos)
      << bad.status().ToString();
}

}  // namespace
}  // namespace ddp::shards
