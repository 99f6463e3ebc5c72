#include "table/gather.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>

namespace ddp::table {
namespace {

// Two segments of a table with a float column, an int64 column and a 3-wide float list
// column; row r of segment s holds the value 1000 * s + r in every place.
struct Fixture {
  std::vector<std::vector<float>> f{std::vector<float>(5), std::vector<float>(7)};
  std::vector<std::vector<int64_t>> l{std::vector<int64_t>(5), std::vector<int64_t>(7)};
  std::vector<std::vector<float>> e{std::vector<float>(15), std::vector<float>(21)};

  Fixture() {
    for (size_t s = 0; s < 2; ++s) {
      for (size_t r = 0; r < f[s].size(); ++r) {
        const float v = static_cast<float>(1000 * s + r);
        f[s][r] = v;
        l[s][r] = static_cast<int64_t>(v);
        for (size_t k = 0; k < 3; ++k) e[s][3 * r + k] = v + 0.25f * static_cast<float>(k);
      }
    }
  }

  const uint8_t* B(const void* p) { return static_cast<const uint8_t*>(p); }

  // Outputs: 0 = [f, e...] stacked (16 bytes a row), 1 = l.
  GatherLayout Layout() {
    GatherLayout g;
    g.segment_names = {"partition 0", "partition 1"};
    g.segment_rows = {5, 7};
    g.columns.push_back({"f", 4, 4, 0, 0, 0, {B(f[0].data()), B(f[1].data())}});
    g.columns.push_back({"e", 12, 12, 0, 0, 4, {B(e[0].data()), B(e[1].data())}});
    g.columns.push_back({"l", 8, 8, 0, 1, 0, {B(l[0].data()), B(l[1].data())}});
    g.output_row_bytes = {16, 8};
    return g;
  }
};

void CheckRows(const std::vector<int32_t>& seg, const std::vector<int64_t>& row,
               const std::vector<float>& x, const std::vector<int64_t>& y) {
  for (size_t i = 0; i < row.size(); ++i) {
    const float v = static_cast<float>(1000 * seg[i] + row[i]);
    EXPECT_EQ(x[4 * i], v) << i;
    for (size_t k = 0; k < 3; ++k) EXPECT_EQ(x[4 * i + 1 + k], v + 0.25f * static_cast<float>(k));
    EXPECT_EQ(y[i], static_cast<int64_t>(v));
  }
}

TEST(GatherRows, CopiesShuffledRowsIntoStackedOutputs) {
  Fixture t;
  GatherLayout g = t.Layout();
  ASSERT_TRUE(ValidateLayout(g).ok());
  std::vector<int32_t> seg = {1, 0, 1, 0, 1};
  std::vector<int64_t> row = {6, 4, 0, 0, 3};
  std::vector<float> x(4 * row.size());
  std::vector<int64_t> y(row.size());
  uint8_t* outs[2] = {reinterpret_cast<uint8_t*>(x.data()), reinterpret_cast<uint8_t*>(y.data())};
  ASSERT_TRUE(GatherRows(g, seg, row, outs, nullptr).ok());
  CheckRows(seg, row, x, y);
}

TEST(GatherRows, ThreadedEqualsSerialOnALargeBatch) {
  Fixture t;
  GatherLayout g = t.Layout();
  std::mt19937 rng(7);
  const size_t n = 5000;
  std::vector<int32_t> seg(n);
  std::vector<int64_t> row(n);
  for (size_t i = 0; i < n; ++i) {
    seg[i] = static_cast<int32_t>(rng() % 2);
    row[i] = static_cast<int64_t>(rng() % (seg[i] == 0 ? 5 : 7));
  }
  GatherPool pool(4);
  EXPECT_EQ(pool.threads(), 4);
  for (int round = 0; round < 20; ++round) {
    std::vector<float> x(4 * n);
    std::vector<int64_t> y(n);
    uint8_t* outs[2] = {reinterpret_cast<uint8_t*>(x.data()),
                        reinterpret_cast<uint8_t*>(y.data())};
    ASSERT_TRUE(GatherRows(g, seg, row, outs, &pool).ok());
    CheckRows(seg, row, x, y);
  }
}

TEST(GatherRows, OutOfRangeRowNamesTheSegmentAndCopiesNothing) {
  Fixture t;
  GatherLayout g = t.Layout();
  std::vector<int32_t> seg = {0, 0};
  std::vector<int64_t> row = {1, 5};
  std::vector<float> x(8, -1.0f);
  std::vector<int64_t> y(2, -1);
  uint8_t* outs[2] = {reinterpret_cast<uint8_t*>(x.data()), reinterpret_cast<uint8_t*>(y.data())};
  Status s = GatherRows(g, seg, row, outs, nullptr);
  ASSERT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_NE(s.message().find("partition 0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("holds 5 rows"), std::string::npos) << s.message();
  EXPECT_EQ(x[0], -1.0f);
  std::vector<int32_t> bad_seg = {2};
  std::vector<int64_t> one = {0};
  EXPECT_EQ(GatherRows(g, bad_seg, one, outs, nullptr).code(), Code::kOutOfRange);
}

TEST(GatherRows, ReadsColumnsInsideRecords) {
  // Records of (int64 id, float a, float b): 16 bytes; b and a swapped into the output.
  struct Rec {
    int64_t id;
    float a, b;
  };
  std::vector<Rec> s0 = {{0, 0.5f, 1.5f}, {1, 2.5f, 3.5f}};
  std::vector<Rec> s1 = {{10, 4.5f, 5.5f}};
  const uint8_t* p0 = reinterpret_cast<const uint8_t*>(s0.data());
  const uint8_t* p1 = reinterpret_cast<const uint8_t*>(s1.data());
  GatherLayout g;
  g.segment_names = {"partition 0", "partition 1"};
  g.segment_rows = {2, 1};
  g.columns.push_back({"b", 4, 16, 12, 0, 0, {p0, p1}});
  g.columns.push_back({"a", 4, 16, 8, 0, 4, {p0, p1}});
  g.columns.push_back({"id", 8, 16, 0, 1, 0, {p0, p1}});
  g.output_row_bytes = {8, 8};
  ASSERT_TRUE(ValidateLayout(g).ok());
  std::vector<int32_t> seg = {1, 0, 0};
  std::vector<int64_t> row = {0, 1, 0};
  std::vector<float> x(6);
  std::vector<int64_t> y(3);
  uint8_t* outs[2] = {reinterpret_cast<uint8_t*>(x.data()), reinterpret_cast<uint8_t*>(y.data())};
  ASSERT_TRUE(GatherRows(g, seg, row, outs, nullptr).ok());
  EXPECT_EQ(x, (std::vector<float>{5.5f, 4.5f, 3.5f, 2.5f, 1.5f, 0.5f}));
  EXPECT_EQ(y, (std::vector<int64_t>{10, 1, 0}));
  g.columns[0].src_offset = 14;
  Status s = ValidateLayout(g);
  EXPECT_NE(s.message().find("'b'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("record of 16 bytes"), std::string::npos) << s.message();
}

TEST(GatherRows, EveryRowWidthCopiesItsBytes) {
  // The widths copied by fixed-size moves and a few between them (a call to memcpy), at
  // an odd offset in records of an odd size: rows land whole and nothing else is written.
  for (size_t width : {1, 2, 3, 4, 8, 16, 24, 32, 40, 64, 100, 128, 200, 256, 300}) {
    const size_t stride = width + 7, offset = 5, rows = 50;
    std::vector<uint8_t> rec(rows * stride);
    for (size_t i = 0; i < rec.size(); ++i) rec[i] = static_cast<uint8_t>(i * 7 + width);
    GatherLayout g;
    g.segment_names = {"partition 0"};
    g.segment_rows = {static_cast<int64_t>(rows - 1)};  // the last record's tail is past it
    rec.resize(rows * stride - 2);
    g.columns.push_back({"c", width, stride, offset, 0, 0, {rec.data()}});
    g.output_row_bytes = {width};
    ASSERT_TRUE(ValidateLayout(g).ok()) << width;
    std::vector<int32_t> seg(30, 0);
    std::vector<int64_t> row(30);
    for (size_t i = 0; i < row.size(); ++i) row[i] = static_cast<int64_t>((i * 17) % (rows - 1));
    std::vector<uint8_t> out(row.size() * width + 16, 0xAB);
    uint8_t* outs[1] = {out.data()};
    ASSERT_TRUE(GatherRows(g, seg, row, outs, nullptr).ok()) << width;
    for (size_t i = 0; i < row.size(); ++i) {
      ASSERT_EQ(std::memcmp(out.data() + i * width,
                            rec.data() + static_cast<size_t>(row[i]) * stride + offset, width),
                0)
          << "width " << width << " row " << i;
    }
    for (size_t k = row.size() * width; k < out.size(); ++k) ASSERT_EQ(out[k], 0xAB) << width;
  }
}

TEST(ValidateLayout, NamesTheColumnThatDoesNotFit) {
  Fixture t;
  GatherLayout g = t.Layout();
  g.columns[1].offset = 8;
  Status s = ValidateLayout(g);
  ASSERT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("'e'"), std::string::npos) << s.message();
  g = t.Layout();
  g.columns[2].segments.pop_back();
  s = ValidateLayout(g);
  EXPECT_NE(s.message().find("'l'"), std::string::npos) << s.message();
  g = t.Layout();
  g.output_row_bytes[0] = 20;
  EXPECT_EQ(ValidateLayout(g).code(), Code::kInvalidArgument);
}

TEST(GatherPool, RunsEveryIndexOnceFromConcurrentCallers) {
  GatherPool pool(3);
  std::vector<std::thread> callers;
  std::vector<std::vector<int>> hits(4, std::vector<int>(1000, 0));
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      for (int k = 0; k < 10; ++k) pool.ParallelFor(100, [&](size_t i) { ++hits[c][100 * k + i]; });
    });
  }
  for (std::thread& t : callers) t.join();
  for (const auto& h : hits) {
    EXPECT_EQ(std::accumulate(h.begin(), h.end(), 0), 1000);
    EXPECT_EQ(*std::min_element(h.begin(), h.end()), 1);
  }
}

}  // namespace
}  // namespace ddp::table
