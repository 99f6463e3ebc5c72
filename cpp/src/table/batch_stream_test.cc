#include "table/batch_stream.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <chrono>

#include "common/process_testutil.h"

namespace ddp::table {
namespace {

// Segments of records of 12 bytes: a float32 feature pair then an int32 label; row r of
// segment s holds 1000 * s + r in every place. Outputs: 0 = the pair, 1 = the label.
struct Records {
  std::vector<std::vector<uint8_t>> segments;

  explicit Records(const std::vector<int64_t>& rows) {
    for (size_t s = 0; s < rows.size(); ++s) {
      std::vector<uint8_t> buf(static_cast<size_t>(rows[s]) * 12);
      for (int64_t r = 0; r < rows[s]; ++r) {
        const int32_t v = static_cast<int32_t>(1000 * s) + static_cast<int32_t>(r);
        const float f[2] = {static_cast<float>(v), static_cast<float>(v) + 0.5f};
        std::memcpy(&buf[static_cast<size_t>(r) * 12], f, 8);
        std::memcpy(&buf[static_cast<size_t>(r) * 12 + 8], &v, 4);
      }
      segments.push_back(std::move(buf));
    }
  }

  std::shared_ptr<const GatherLayout> Layout() const {
    auto g = std::make_shared<GatherLayout>();
    GatherColumn x{"x", 8, 12, 0, 0, 0, {}};
    GatherColumn y{"y", 4, 12, 8, 1, 0, {}};
    for (size_t s = 0; s < segments.size(); ++s) {
      g->segment_names.push_back("partition " + std::to_string(s));
      g->segment_rows.push_back(static_cast<int64_t>(segments[s].size() / 12));
      x.segments.push_back(segments[s].data());
      y.segments.push_back(segments[s].data());
    }
    g->columns = {x, y};
    g->output_row_bytes = {8, 4};
    EXPECT_TRUE(ValidateLayout(*g).ok());
    return g;
  }
};

// Every position of `job` as the value its row holds.
std::vector<int32_t> Values(const BatchJob& job) {
  std::vector<int32_t> v;
  for (size_t i = 0; i < job.row.size(); ++i) {
    v.push_back(1000 * job.segment[i] + static_cast<int32_t>(job.row[i]));
  }
  return v;
}

// Drains the stream: the label of every row, checking each batch's features against it.
std::vector<int32_t> Drain(BatchStream& stream, std::vector<size_t>* sizes, Status* error) {
  std::vector<int32_t> got;
  while (true) {
    Batch b;
    bool end = false;
    *error = stream.Next(&b, &end);
    if (end) break;
    EXPECT_TRUE(error->ok()) << error->ToString();
    sizes->push_back(b.rows);
    for (size_t i = 0; i < b.rows; ++i) {
      float f[2];
      int32_t y;
      std::memcpy(f, b.outputs[0].get() + 8 * i, 8);
      std::memcpy(&y, b.outputs[1].get() + 4 * i, 4);
      EXPECT_EQ(f[0], static_cast<float>(y));
      EXPECT_EQ(f[1], static_cast<float>(y) + 0.5f);
      got.push_back(y);
    }
  }
  return got;
}

BatchJob ShuffledJob(const Records& t, const std::vector<int64_t>& rows, uint32_t seed) {
  BatchJob job;
  job.layout = t.Layout();
  for (size_t s = 0; s < rows.size(); ++s) {
    for (int64_t r = 0; r < rows[s]; ++r) {
      job.segment.push_back(static_cast<int32_t>(s));
      job.row.push_back(r);
    }
  }
  std::vector<size_t> perm(job.row.size());
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  BatchJob out{job.layout, {}, {}};
  for (size_t i : perm) {
    out.segment.push_back(job.segment[i]);
    out.row.push_back(job.row[i]);
  }
  return out;
}

// Each test runs with the stream's own thread (ahead) and without (each Next gathers).
class BatchStreamTest : public testing::TestWithParam<bool> {};

TEST_P(BatchStreamTest, EveryRowOnceInOrderAcrossJobsWithShortLastBatches) {
  const std::vector<int64_t> rows_a = {37, 50}, rows_b = {5, 41, 9};
  Records a(rows_a), b(rows_b);
  GatherPool pool(2);
  BatchStream stream({8, 4}, 16, 2, 1, &pool, GetParam());
  BatchJob ja = ShuffledJob(a, rows_a, 1), jb = ShuffledJob(b, rows_b, 2);
  std::vector<int32_t> want = Values(ja);
  const std::vector<int32_t> want_b = Values(jb);
  want.insert(want.end(), want_b.begin(), want_b.end());
  // A producer pushing while the consumer drains (max_jobs 1: the second push waits).
  std::thread producer([&] {
    EXPECT_TRUE(stream.Push(std::move(ja)).ok());
    EXPECT_TRUE(stream.Push(std::move(jb)).ok());
    EXPECT_TRUE(stream.Push(BatchJob{a.Layout(), {}, {}}).ok());  // empty: no batch
    stream.Finish();
  });
  std::vector<size_t> sizes;
  Status error;
  const std::vector<int32_t> got = Drain(stream, &sizes, &error);
  producer.join();
  EXPECT_TRUE(error.ok());
  EXPECT_EQ(got, want);
  // 87 rows: 5 batches of 16 and one of 7; then 55 rows: 3 of 16 and one of 7.
  EXPECT_EQ(sizes, (std::vector<size_t>{16, 16, 16, 16, 16, 7, 16, 16, 16, 7}));
  EXPECT_EQ(stream.jobs_done(), 3u);
}

TEST_P(BatchStreamTest, OutOfRangeRowEndsTheStreamAfterTheBatchesBefore) {
  const std::vector<int64_t> rows = {10, 10};
  Records t(rows);
  BatchStream stream({8, 4}, 4, 8, 4, nullptr, GetParam());
  BatchJob job{t.Layout(), {0, 0, 0, 0, 1, 1, 1, 1, 1, 1}, {0, 1, 2, 3, 4, 5, 6, 10, 1, 2}};
  ASSERT_TRUE(stream.Push(std::move(job)).ok());
  std::vector<size_t> sizes;
  Status error;
  Drain(stream, &sizes, &error);
  EXPECT_EQ(sizes, std::vector<size_t>{4});
  EXPECT_EQ(error.code(), Code::kOutOfRange);
  EXPECT_NE(error.message().find("partition 1, which holds 10 rows"), std::string::npos)
      << error.message();
  Batch b;
  bool end = false;
  EXPECT_TRUE(stream.Next(&b, &end).ok());  // the error is reported once
  EXPECT_TRUE(end);
  EXPECT_EQ(stream.Push(BatchJob{t.Layout(), {}, {}}).code(), Code::kCancelled);
  stream.Finish();
  EXPECT_EQ(stream.Push(BatchJob{t.Layout(), {}, {}}).code(), Code::kFailedPrecondition);
}

TEST_P(BatchStreamTest, RejectsJobsThatDoNotMatch) {
  Records t({3});
  BatchStream stream({8, 4}, 2, 1, 1, nullptr, GetParam());
  EXPECT_EQ(stream.Push(BatchJob{}).code(), Code::kInvalidArgument);
  EXPECT_EQ(stream.Push(BatchJob{t.Layout(), {0}, {0, 1}}).code(), Code::kInvalidArgument);
  auto other = std::make_shared<GatherLayout>(*t.Layout());
  other->output_row_bytes = {8};
  EXPECT_EQ(stream.Push(BatchJob{other, {0}, {0}}).code(), Code::kInvalidArgument);
  stream.Finish();
  EXPECT_EQ(stream.Push(BatchJob{t.Layout(), {0}, {0}}).code(), Code::kFailedPrecondition);
}

TEST_P(BatchStreamTest, CloseUnblocksAProducerAndAConsumer) {
  const std::vector<int64_t> rows = {64};
  Records t(rows);
  BatchStream stream({8, 4}, 4, 1, 1, nullptr, GetParam());
  // The first job fills the one prefetch slot and waits; the second push blocks.
  ASSERT_TRUE(stream.Push(ShuffledJob(t, rows, 3)).ok());
  Status pushed;
  std::thread producer([&] { pushed = stream.Push(ShuffledJob(t, rows, 4)); });
  Batch b;
  bool end = false;
  ASSERT_TRUE(stream.Next(&b, &end).ok());
  ASSERT_FALSE(end);
  stream.Close();
  producer.join();
  EXPECT_EQ(pushed.code(), Code::kCancelled);
  EXPECT_TRUE(stream.Next(&b, &end).ok());
  EXPECT_TRUE(end);
  stream.Close();  // idempotent
}

TEST_P(BatchStreamTest, NextTimesOutWithoutABatch) {
  BatchStream stream({8, 4}, 4, 1, 1, nullptr, GetParam());
  Batch b;
  bool end = false;
  EXPECT_EQ(stream.Next(&b, &end, 0.01).code(), Code::kDeadlineExceeded);
  EXPECT_FALSE(end);
  stream.Finish();
  EXPECT_TRUE(stream.Next(&b, &end, 5).ok());
  EXPECT_TRUE(end);
}

TEST_P(BatchStreamTest, DestroyedWhileGatheringStops) {
  const std::vector<int64_t> rows = {500};
  Records t(rows);
  for (int i = 0; i < 20; ++i) {
    BatchStream stream({8, 4}, 7, 2, 2, nullptr, GetParam());
    ASSERT_TRUE(stream.Push(ShuffledJob(t, rows, static_cast<uint32_t>(i))).ok());
  }
}

TEST(BatchStreamInline, GathersOnlyWhenAskedAndFreesAJobWithItsLastBatch) {
  const std::vector<int64_t> rows = {8};
  Records t(rows);
  BatchStream stream({8, 4}, 4, 2, 1, nullptr, /*ahead=*/false);
  ASSERT_TRUE(stream.Push(ShuffledJob(t, rows, 5)).ok());
  // Nothing is gathered before the consumer asks (no thread): the job stays unfinished,
  // so a second push would wait.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(stream.jobs_done(), 0u);
  Batch b;
  bool end = false;
  ASSERT_TRUE(stream.Next(&b, &end).ok());
  EXPECT_EQ(b.rows, 4u);
  EXPECT_EQ(stream.jobs_done(), 0u);
  ASSERT_TRUE(stream.Next(&b, &end).ok());
  EXPECT_EQ(b.rows, 4u);
  EXPECT_EQ(stream.jobs_done(), 1u);  // its last batch is out: its window is free
  stream.Finish();
  ASSERT_TRUE(stream.Next(&b, &end).ok());
  EXPECT_TRUE(end);
}

TEST_P(BatchStreamTest, LentBuffersHoldBatchesAndComeBackOnlyWhenTheBatchIsFreed) {
  const std::vector<int64_t> rows = {30, 20};
  Records t(rows);
  BatchStream stream({8, 4}, 16, 1, 2, nullptr, GetParam());
  // Outputs at 64-byte boundaries: 16 * 8 = 128 bytes, then 16 * 4 = 64.
  ASSERT_EQ(stream.batch_buffer_bytes(), 192u);
  std::vector<uint8_t> small(100);
  Status st = stream.AdoptBuffers({{small.data(), small.size(), nullptr}});
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("lent buffer 0 holds 100 bytes"), std::string::npos) << st.message();
  alignas(64) static uint8_t memory[2][192];
  auto kept = std::make_shared<int>(0);  // what keeps the memory alive: dropped after Close
  ASSERT_TRUE(stream.AdoptBuffers({{memory[0], 192, kept}, {memory[1], 192, kept}}).ok());
  const BatchJob job = ShuffledJob(t, rows, 3);
  ASSERT_TRUE(stream.Push(job).ok());
  stream.Finish();
  const std::vector<int32_t> want = Values(job);
  std::vector<int32_t> got;
  std::vector<Batch> held;
  int lent_batches = 0;
  auto lent = [&](const Batch& b) {
    return (b.outputs[0].get() == memory[0] || b.outputs[0].get() == memory[1]) &&
           b.outputs[1].get() == b.outputs[0].get() + 128;
  };
  while (true) {
    Batch b;
    bool end = false;
    ASSERT_TRUE(stream.Next(&b, &end).ok());
    if (end) break;
    for (size_t i = 0; i < b.rows; ++i) {
      int32_t y;
      std::memcpy(&y, b.outputs[1].get() + 4 * i, 4);
      got.push_back(y);
    }
    // Never gathered over a batch still held: a lent buffer is in at most one held batch.
    if (lent(b)) {
      for (const Batch& h : held) EXPECT_NE(h.outputs[0].get(), b.outputs[0].get());
    }
    lent_batches += lent(b);
    held.push_back(std::move(b));
    // Two batches held: a third is gathered into blocks of its own, never over either.
    if (held.size() == 3) {
      EXPECT_TRUE(lent(held[0]) && lent(held[1]));
      EXPECT_NE(held[0].outputs[0].get(), held[1].outputs[0].get());
      EXPECT_FALSE(lent(held[2]));
      held.erase(held.begin(), held.begin() + 2);  // both buffers come back
    }
  }
  EXPECT_EQ(got, want);  // 50 rows: 16, 16, 16 (own blocks), then 2
  ASSERT_EQ(held.size(), 2u);
  EXPECT_FALSE(lent(held[0]));
  // Inline, the tail is gathered after both buffers came back, so into one of them. Ahead,
  // the gathering thread may have taken the tail before they came back: blocks of its own.
  const int tail_lent = lent(held[1]) ? 1 : 0;
  if (!GetParam()) {
    EXPECT_EQ(tail_lent, 1);
  }
  EXPECT_EQ(lent_batches, 2 + tail_lent);
  EXPECT_EQ(kept.use_count(), 3);  // each lent buffer keeps its memory, free or in a batch
  stream.Close();
  EXPECT_EQ(kept.use_count(), 1 + tail_lent);  // the free ones dropped at Close
  held.clear();
  EXPECT_EQ(kept.use_count(), 1);  // a batch freed after Close drops its buffer
}

INSTANTIATE_TEST_SUITE_P(AheadAndInline, BatchStreamTest, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& param) {
                           return param.param ? "Ahead" : "Inline";
                         });

TEST(BatchStreamFork, AForkedChildGetsAnErrorAndLeavesTheThreadsToTheParent) {
  Records t({40, 30});
  auto* pool = new GatherPool(3);
  auto* stream = new BatchStream({8, 4}, 7, 2, 2, pool, /*ahead=*/true);
  ASSERT_TRUE(stream->Push(ShuffledJob(t, {40, 30}, 1)).ok());
  stream->Finish();
  Batch first;
  bool end = false;
  ASSERT_TRUE(stream->Next(&first, &end).ok());
  const ForkedChildEnd child = RunInForkedChild([&] {
    Batch b;
    bool e = false;
    if (stream->Next(&b, &e).code() != Code::kOtherProcess) return 1;
    if (stream->Push(ShuffledJob(t, {40, 30}, 2)).code() != Code::kOtherProcess) return 2;
    const BatchJob job = ShuffledJob(t, {40, 30}, 3);
    std::vector<uint8_t> x(8 * job.row.size()), y(4 * job.row.size());
    std::vector<uint8_t*> outs{x.data(), y.data()};
    if (GatherRows(*job.layout, job.segment, job.row, outs, pool).code() != Code::kOtherProcess) return 3;
    stream->Close();
    delete stream;
    delete pool;
    return 0;
  });
  EXPECT_FALSE(child.hung);
  EXPECT_EQ(child.signal, 0);
  EXPECT_EQ(child.exit_code, 0);
  size_t rows = first.rows;
  for (;;) {
    Batch b;
    ASSERT_TRUE(stream->Next(&b, &end).ok());
    if (end) break;
    rows += b.rows;
  }
  EXPECT_EQ(rows, 70u);
  delete stream;
  delete pool;
}

}  // namespace
}  // namespace ddp::table
