#include "pipeline/loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "common/process_testutil.h"
#include "image/image_testutil.h"

namespace ddp::pipeline {
namespace {

// A small in-memory Store for the engine's unit tests (real bytes, real Store contract).
class MapStore : public Store {
 public:
  explicit MapStore(std::map<std::string, std::string> objects) : objects_(std::move(objects)) {}
  std::string url() const override { return "test://images"; }
  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override {
    std::vector<ObjectInfo> out;
    for (auto& [k, v] : objects_) {
      if (k.starts_with(prefix)) out.push_back({k, v.size()});
    }
    return out;
  }
  Result<ObjectInfo> Stat(std::string_view key) override {
    auto it = objects_.find(std::string(key));
    if (it == objects_.end()) return NotFoundError(KeyUrl(key) + ": not found");
    return ObjectInfo{it->first, it->second.size()};
  }
  Result<std::string> Get(std::string_view key, ByteRange) override {
    auto it = objects_.find(std::string(key));
    if (it == objects_.end()) return NotFoundError(KeyUrl(key) + ": not found");
    return it->second;
  }
  Status Put(std::string_view, std::string_view) override { return UnimplementedError("read-only"); }
  Status Delete(std::string_view) override { return UnimplementedError("read-only"); }

 private:
  std::map<std::string, std::string> objects_;
};

struct Fixture {
  std::shared_ptr<Store> store;
  std::vector<std::string> keys;
  std::vector<int64_t> labels;
};

Fixture MakeImages(int n, std::set<int> bad = {}) {
  std::map<std::string, std::string> objects;
  Fixture f;
  for (int i = 0; i < n; ++i) {
    const int w = 40 + 7 * (i % 5), h = 30 + 5 * (i % 3);
    std::string key = "c" + std::to_string(i % 3) + "/" + std::to_string(i) + ".jpg";
    std::string bytes = image::testing::EncodeJpeg(image::testing::Pattern(w, h), w, h, 3, 90);
    if (bad.count(i)) bytes.resize(bytes.size() / 3);
    objects[key] = bytes;
    f.keys.push_back(key);
    f.labels.push_back(i % 3);
  }
  f.store = std::make_shared<MapStore>(std::move(objects));
  return f;
}

image::Pipeline TrainPipeline() {
  image::TransformOp rrc;
  rrc.kind = image::OpKind::kRandomResizedCrop;
  rrc.height = rrc.width = 16;
  image::TransformOp flip;
  flip.kind = image::OpKind::kHorizontalFlip;
  image::TransformOp tt;
  tt.kind = image::OpKind::kToTensor;
  return image::Pipeline::Create({rrc, flip, tt}).value();
}

using Epoch = std::vector<std::pair<std::vector<float>, std::vector<int64_t>>>;

Epoch RunEpoch(Loader& l, uint64_t epoch, int64_t start = 0) {
  Epoch out;
  EXPECT_TRUE(l.StartEpoch(epoch, start).ok());
  for (;;) {
    auto b = l.Next();
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok() || !b->has_value()) break;
    const Batch& batch = **b;
    const size_t per = 3 * 16 * 16;
    const float* px = static_cast<const float*>(batch.images);
    out.emplace_back(std::vector<float>(px, px + per * batch.size),
                     std::vector<int64_t>(batch.labels, batch.labels + batch.size));
  }
  return out;
}

TEST(Loader, DeterministicAcrossThreadCountsAndFetchModes) {
  Fixture f = MakeImages(23);
  LoaderOptions o;
  o.batch_size = 5;
  o.sampler.seed = 9;
  std::vector<Epoch> runs;
  for (int threads : {1, 3}) {
    for (bool batched : {false, true}) {
      o.num_threads = threads;
      o.batched_fetch = batched;
      auto l = Loader::Create(f.store, f.keys, f.labels, TrainPipeline(), o);
      ASSERT_TRUE(l.ok());
      EXPECT_EQ((*l)->num_batches(), 5);
      runs.push_back(RunEpoch(**l, 1));
    }
  }
  ASSERT_EQ(runs[0].size(), 5u);
  EXPECT_EQ(runs[0].back().second.size(), 3u);
  for (size_t i = 1; i < runs.size(); ++i) EXPECT_EQ(runs[i], runs[0]) << "run " << i;
}

TEST(Loader, ResumeContinuesWithIdenticalBatchesAndEpochsDiffer) {
  Fixture f = MakeImages(20);
  LoaderOptions o;
  o.batch_size = 4;
  o.num_threads = 2;
  auto l = Loader::Create(f.store, f.keys, f.labels, TrainPipeline(), o).value();
  Epoch full = RunEpoch(*l, 3);
  Epoch tail = RunEpoch(*l, 3, 2);
  ASSERT_EQ(tail.size(), 3u);
  for (size_t i = 0; i < tail.size(); ++i) EXPECT_EQ(tail[i], full[i + 2]);
  EXPECT_NE(RunEpoch(*l, 4), full);
}

TEST(Loader, KeptBatchIsNeverOverwritten) {
  Fixture f = MakeImages(30);
  LoaderOptions o;
  o.batch_size = 2;
  o.prefetch = 2;
  o.num_threads = 2;
  auto l = Loader::Create(f.store, f.keys, f.labels, TrainPipeline(), o).value();
  ASSERT_TRUE(l->StartEpoch(0).ok());
  std::vector<Batch> kept;
  std::vector<std::vector<float>> copies;
  for (;;) {
    auto b = l->Next();
    ASSERT_TRUE(b.ok());
    if (!b->has_value()) break;
    const float* p = static_cast<const float*>((*b)->images);
    copies.emplace_back(p, p + (*b)->size * 3 * 16 * 16);
    kept.push_back(std::move(**b));
  }
  ASSERT_EQ(kept.size(), 15u);
  for (size_t i = 0; i < kept.size(); ++i) {
    const float* p = static_cast<const float*>(kept[i].images);
    EXPECT_EQ(std::vector<float>(p, p + copies[i].size()), copies[i]);
  }
}

TEST(Loader, LentBuffersHoldTheBatchesAndOutliveTheLoaderWhileBatchesDo) {
  Fixture f = MakeImages(23);
  LoaderOptions o;
  o.batch_size = 5;
  o.prefetch = 2;
  o.num_threads = 2;
  o.sampler.seed = 4;
  Epoch want = RunEpoch(*Loader::Create(f.store, f.keys, f.labels, TrainPipeline(), o).value(), 1);
  auto l = Loader::Create(f.store, f.keys, f.labels, TrainPipeline(), o).value();
  const size_t bytes = l->batch_buffer_bytes();
  // The images (3840 bytes), the labels at the next 64-byte boundary (3840), 5 of them.
  EXPECT_EQ(bytes, size_t{5} * 3 * 16 * 16 * sizeof(float) + 5 * sizeof(int64_t));
  auto memory = std::make_shared<std::vector<std::vector<uint8_t>>>(2, std::vector<uint8_t>(bytes));
  std::vector<ExternalBuffer> lent;
  for (auto& m : *memory) lent.push_back({m.data(), m.size(), memory});
  std::vector<ExternalBuffer> small = {{(*memory)[0].data(), bytes - 1, memory}};
  Status st = l->AdoptBuffers(small);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("lent buffer 0 holds"), std::string::npos) << st.ToString();
  small.clear();
  ASSERT_TRUE(l->AdoptBuffers(std::move(lent)).ok());
  // The same batches; the ones the loop holds one at a time come from the lent memory.
  EXPECT_EQ(RunEpoch(*l, 1), want);
  ASSERT_TRUE(l->StartEpoch(1).ok());
  auto b = l->Next();
  ASSERT_TRUE(b.ok() && b->has_value());
  // Images and labels both in one lent buffer, the labels after the images.
  const auto* p = static_cast<const uint8_t*>((*b)->images);
  const auto* q = reinterpret_cast<const uint8_t*>((*b)->labels);
  bool inside = false;
  for (auto& m : *memory) {
    inside = inside || (p == m.data() && q == m.data() + bytes - 5 * sizeof(int64_t));
  }
  EXPECT_TRUE(inside);
  std::vector<uint8_t> odd(bytes + 1);
  st = l->AdoptBuffers({{odd.data() + 1, bytes, nullptr}});
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("not 8-byte aligned"), std::string::npos) << st.ToString();
  // The lent memory stays referenced while a batch may read it, after the loader too.
  Batch kept = std::move(**b);
  l.reset();
  EXPECT_GT(memory.use_count(), 1);
  kept = Batch{};
  EXPECT_EQ(memory.use_count(), 1);
}

TEST(Loader, ErrorsRaiseOrSkip) {
  Fixture f = MakeImages(12, {4, 7});
  LoaderOptions o;
  o.batch_size = 4;
  o.sampler.shuffle = false;
  auto l = Loader::Create(f.store, f.keys, f.labels, TrainPipeline(), o).value();
  ASSERT_TRUE(l->StartEpoch(0).ok());
  ASSERT_TRUE(l->Next().ok());
  auto b = l->Next();
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::kDataLoss);
  EXPECT_NE(b.status().message().find("test://images/c1/4.jpg"), std::string::npos) << b.status().ToString();

  o.skip_errors = true;
  auto s = Loader::Create(f.store, f.keys, f.labels, TrainPipeline(), o).value();
  Epoch e = RunEpoch(*s, 0);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[1].second.size(), 2u);
  EXPECT_EQ(s->skipped(), 2);
  // labels follow the kept samples (5 and 6 -> classes 2 and 0)
  EXPECT_EQ(e[1].second, (std::vector<int64_t>{2, 0}));
}

TEST(Loader, MissingObjectIsNotFound) {
  Fixture f = MakeImages(3);
  f.keys[1] = "nope.jpg";
  auto l = Loader::Create(f.store, f.keys, f.labels, TrainPipeline(), LoaderOptions{}).value();
  ASSERT_TRUE(l->StartEpoch(0).ok());
  auto b = l->Next();
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::kNotFound);
  // on_error="skip" skips bad images, not storage errors.
  LoaderOptions o;
  o.skip_errors = true;
  auto s = Loader::Create(f.store, f.keys, f.labels, TrainPipeline(), o).value();
  ASSERT_TRUE(s->StartEpoch(0).ok());
  EXPECT_EQ(s->Next().status().code(), Code::kNotFound);
}

TEST(Loader, SkipMissingSkipsAndCountsMissingObjectsOnly) {
  Fixture f = MakeImages(6);
  f.keys[1] = "gone/1.jpg";
  f.keys[4] = "gone/4.jpg";
  LoaderOptions o;
  o.batch_size = 3;
  o.sampler.shuffle = false;
  o.skip_missing = true;  // without skip_errors it changes nothing
  auto strict = Loader::Create(f.store, f.keys, f.labels, TrainPipeline(), o).value();
  ASSERT_TRUE(strict->StartEpoch(0).ok());
  auto b = strict->Next();
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::kNotFound);
  EXPECT_NE(b.status().message().find("gone/1.jpg"), std::string::npos) << b.status().ToString();

  o.skip_errors = true;
  auto s = Loader::Create(f.store, f.keys, f.labels, TrainPipeline(), o).value();
  Epoch e = RunEpoch(*s, 0);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].second, (std::vector<int64_t>{f.labels[0], f.labels[2]}));
  EXPECT_EQ(e[1].second, (std::vector<int64_t>{f.labels[3], f.labels[5]}));
  EXPECT_EQ(s->skipped(), 2);
}

TEST(Loader, ShardsCoverEveryIndexOnce) {
  Fixture f = MakeImages(12);
  std::multiset<int64_t> labels_seen;
  int64_t total = 0;
  for (int r = 0; r < 3; ++r) {
    LoaderOptions o;
    o.batch_size = 3;
    o.sampler.rank = r;
    o.sampler.world_size = 3;
    auto l = Loader::Create(f.store, f.keys, f.labels, TrainPipeline(), o).value();
    for (auto& [px, lab] : RunEpoch(*l, 0)) {
      total += static_cast<int64_t>(lab.size());
      labels_seen.insert(lab.begin(), lab.end());
    }
  }
  EXPECT_EQ(total, 12);
  for (int c = 0; c < 3; ++c) EXPECT_EQ(labels_seen.count(c), 4u);
}

TEST(Loader, RestartMidEpochAndDestroyWithWorkInFlight) {
  Fixture f = MakeImages(40);
  LoaderOptions o;
  o.batch_size = 4;
  o.num_threads = 2;
  auto l = Loader::Create(f.store, f.keys, f.labels, TrainPipeline(), o).value();
  ASSERT_TRUE(l->StartEpoch(0).ok());
  ASSERT_TRUE(l->Next().ok());
  ASSERT_TRUE(l->StartEpoch(1).ok());
  ASSERT_TRUE(l->Next().ok());
  EXPECT_EQ(l->StartEpoch(0, 11).code(), Code::kOutOfRange);
}

// Parts of one image list, as predict reads them: keys [begin, end) with their labels.
Fixture Part(const Fixture& f, size_t begin, size_t end) {
  return {f.store, std::vector<std::string>(f.keys.begin() + begin, f.keys.begin() + end),
          std::vector<int64_t>(f.labels.begin() + begin, f.labels.begin() + end)};
}

TEST(Loader, RestartReadsANewListAsANewLoaderWould) {
  Fixture f = MakeImages(23);
  LoaderOptions o;
  o.batch_size = 4;
  o.num_threads = 2;
  o.sampler.seed = 5;
  for (bool batched : {false, true}) {
    o.batched_fetch = batched;
    auto l = Loader::Create(f.store, {}, {}, TrainPipeline(), o).value();
    EXPECT_EQ(l->num_batches(), 0);
    EXPECT_TRUE(RunEpoch(*l, 0).empty());
    for (auto [begin, end] : {std::pair<size_t, size_t>{0, 10}, {10, 23}, {3, 4}, {0, 0}, {0, 23}}) {
      Fixture part = Part(f, begin, end);
      ASSERT_TRUE(l->Restart(part.keys, part.labels).ok());
      EXPECT_EQ(l->num_samples(), static_cast<int64_t>(end - begin));
      auto fresh = Loader::Create(f.store, part.keys, part.labels, TrainPipeline(), o).value();
      EXPECT_EQ(l->num_batches(), fresh->num_batches());
      EXPECT_EQ(RunEpoch(*l, 2), RunEpoch(*fresh, 2)) << "keys [" << begin << ", " << end << ")";
    }
  }
}

TEST(Loader, RestartWhileBatchesOfThePreviousListAreHeldLeavesThemAsDelivered) {
  Fixture f = MakeImages(30);
  LoaderOptions o;
  o.batch_size = 3;
  o.prefetch = 2;
  o.num_threads = 2;
  Fixture a = Part(f, 0, 15), b = Part(f, 15, 30);
  auto l = Loader::Create(f.store, a.keys, a.labels, TrainPipeline(), o).value();
  ASSERT_TRUE(l->StartEpoch(0).ok());
  // Two batches held (every buffer of `prefetch`), the rest of the list still in flight.
  std::vector<Batch> held;
  std::vector<std::pair<std::vector<float>, std::vector<int64_t>>> copies;
  for (int i = 0; i < 2; ++i) {
    auto r = l->Next();
    ASSERT_TRUE(r.ok() && r->has_value()) << r.status().ToString();
    const auto* p = static_cast<const float*>((*r)->images);
    copies.emplace_back(std::vector<float>(p, p + (*r)->size * 3 * 16 * 16),
                        std::vector<int64_t>((*r)->labels, (*r)->labels + (*r)->size));
    held.push_back(std::move(**r));
  }
  ASSERT_TRUE(l->Restart(b.keys, b.labels).ok());
  // The end until the next StartEpoch, which reads the new list whole.
  auto end = l->Next();
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(end->has_value());
  o.num_threads = 1;
  Epoch want = RunEpoch(*Loader::Create(f.store, b.keys, b.labels, TrainPipeline(), o).value(), 0);
  EXPECT_EQ(RunEpoch(*l, 0), want);
  for (size_t i = 0; i < held.size(); ++i) {
    const auto* p = static_cast<const float*>(held[i].images);
    EXPECT_EQ(std::vector<float>(p, p + copies[i].first.size()), copies[i].first) << "batch " << i;
    EXPECT_EQ(std::vector<int64_t>(held[i].labels, held[i].labels + held[i].size), copies[i].second);
  }
}

// A SampleSource of no samples: its loader's samples are not a key list.
class NoSamples final : public SampleSource {
 public:
  Result<std::vector<int64_t>> Order(uint64_t) override { return std::vector<int64_t>{}; }
  int64_t NumSamples(uint64_t) const override { return 0; }
  Status Fetch(std::span<const int64_t>, const SampleCallback&, const std::atomic<bool>&) override {
    return Status::Ok();
  }
};

TEST(Loader, RestartRefusesWhatItCannotReadNamingIt) {
  Fixture f = MakeImages(6);
  LoaderOptions o;
  o.batch_size = 2;
  o.num_threads = 1;
  auto l = Loader::Create(f.store, f.keys, f.labels, TrainPipeline(), o).value();
  ASSERT_TRUE(l->StartEpoch(0).ok());
  ASSERT_TRUE(l->Next().ok());
  Status st = l->Restart({"a", "b", "c"}, {0, 1});
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("3 keys but 2 labels"), std::string::npos) << st.ToString();
  // A refused restart changed nothing: the epoch goes on over the list as made.
  int64_t batches = 1;
  for (;;) {
    auto r = l->Next();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (!r->has_value()) break;
    ++batches;
  }
  EXPECT_EQ(batches, 3);
  auto shards = Loader::Create(std::make_shared<NoSamples>(), TrainPipeline(), o).value();
  st = shards->Restart(f.keys, f.labels);
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_NE(st.message().find("sample source"), std::string::npos) << st.ToString();
  l->Shutdown();
  st = l->Restart(f.keys, f.labels);
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_NE(st.message().find("closed"), std::string::npos) << st.ToString();
}

// A store whose every Get takes a while, so Next() is really waiting when it is closed.
class SlowStore final : public Store {
 public:
  explicit SlowStore(std::shared_ptr<Store> inner) : inner_(std::move(inner)) {}
  std::string url() const override { return inner_->url(); }
  Result<std::vector<ObjectInfo>> List(std::string_view p) override { return inner_->List(p); }
  Result<ObjectInfo> Stat(std::string_view k) override { return inner_->Stat(k); }
  Result<std::string> Get(std::string_view k, ByteRange r) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return inner_->Get(k, r);
  }
  Status Put(std::string_view k, std::string_view d) override { return inner_->Put(k, d); }
  Status Delete(std::string_view k) override { return inner_->Delete(k); }

 private:
  std::shared_ptr<Store> inner_;
};

TEST(Loader, ShutdownFromAnotherThreadWhileNextWaits) {
  Fixture f = MakeImages(24);
  auto slow = std::make_shared<SlowStore>(f.store);
  LoaderOptions o;
  o.batch_size = 8;
  o.num_threads = 1;
  o.batched_fetch = false;
  for (int round = 0; round < 20; ++round) {
    std::shared_ptr<Loader> l(Loader::Create(slow, f.keys, f.labels, TrainPipeline(), o).value());
    ASSERT_TRUE(l->StartEpoch(0).ok());
    std::thread closer([l, round] {
      std::this_thread::sleep_for(std::chrono::microseconds(500 * (round % 8)));
      l->Shutdown();
    });
    // Some batches may arrive before the close; after it, Next says closed, never hangs.
    Status last;
    for (int i = 0; i < 10 && last.ok(); ++i) {
      auto b = l->Next();
      last = b.status();
      if (b.ok() && !b->has_value()) break;
    }
    closer.join();
    auto after = l->Next();
    EXPECT_EQ(after.status().code(), Code::kFailedPrecondition) << after.status().ToString();
    EXPECT_NE(after.status().message().find("closed"), std::string::npos);
    EXPECT_EQ(l->StartEpoch(1).code(), Code::kFailedPrecondition);
    l->Shutdown();  // again: harmless
  }
}

TEST(Loader, DecodeBufferOfALargeImageIsNotKept) {
  // One 2048 x 1536 image (9 MiB of RGB) among small ones, a 4 MiB keep limit.
  std::map<std::string, std::string> objects;
  std::vector<std::string> keys;
  for (int i = 0; i < 8; ++i) {
    const int w = i == 3 ? 2048 : 48, h = i == 3 ? 1536 : 40;
    keys.push_back(std::to_string(i) + ".jpg");
    objects[keys.back()] = image::testing::EncodeJpeg(image::testing::Pattern(w, h), w, h, 3, 80);
  }
  auto store = std::make_shared<MapStore>(std::move(objects));
  LoaderOptions o;
  o.batch_size = 8;
  o.num_threads = 2;
  o.scaled_decode = false;
  o.region_decode = false;  // decode the whole large image
  o.decode_buffer_keep_bytes = 4u << 20;
  auto l = Loader::Create(store, keys, std::vector<int64_t>(8, 0), TrainPipeline(), o).value();
  ASSERT_TRUE(l->StartEpoch(0).ok());
  auto b = l->Next();
  ASSERT_TRUE(b.ok() && b->has_value()) << b.status().ToString();
  EXPECT_EQ((*b)->size, 8);
  // The workers settle their buffers just after finishing their samples.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (l->decode_buffer_bytes() >= 2048 * 1536 * 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // The small images' buffers may stay (reused); the large one's went. Zero is possible:
  // one thread can take every sample and drop its buffer after the large image.
  EXPECT_LE(l->decode_buffer_bytes(), 2 * (4 << 20));
  EXPECT_LT(l->decode_buffer_bytes(), 2048 * 1536 * 3);
}

TEST(Loader, AForkedChildGetsAnErrorAndFreesNothingOfTheParents) {
  Fixture f = MakeImages(24);
  LoaderOptions o;
  o.batch_size = 4;
  o.num_threads = 2;
  o.prefetch = 3;
  o.batched_fetch = true;  // worker threads and the fetch thread
  auto l = Loader::Create(f.store, f.keys, f.labels, TrainPipeline(), o).value();
  ASSERT_TRUE(l->StartEpoch(0).ok());
  auto first = l->Next();
  ASSERT_TRUE(first.ok() && first->has_value());
  std::vector<int64_t> labels((*first)->labels, (*first)->labels + (*first)->size);
  first = std::optional<Batch>();  // its lease goes back to the pool
  // The child, as a DataLoader worker whose garbage collector frees the parent's Loader
  // mid-epoch: reads fail naming fork(), counts still answer, destruction returns.
  const ForkedChildEnd end = RunInForkedChild([&] {
    auto next = l->Next();
    if (next.ok() || next.status().code() != Code::kOtherProcess) return 1;
    if (next.status().message().find("fork()") == std::string::npos) return 2;
    if (l->StartEpoch(1).code() != Code::kOtherProcess) return 3;
    if (l->num_batches() != 6 || l->num_samples() != 24) return 4;
    l->Shutdown();
    l.reset();
    return 0;
  });
  EXPECT_FALSE(end.hung);
  EXPECT_EQ(end.signal, 0);
  EXPECT_EQ(end.exit_code, 0);
  // The parent's epoch goes on, every sample once.
  for (;;) {
    auto b = l->Next();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    if (!b->has_value()) break;
    labels.insert(labels.end(), (*b)->labels, (*b)->labels + (*b)->size);
  }
  EXPECT_EQ(labels.size(), 24u);
  EXPECT_EQ(std::count(labels.begin(), labels.end(), 0), 8);
}

}  // namespace
}  // namespace ddp::pipeline
