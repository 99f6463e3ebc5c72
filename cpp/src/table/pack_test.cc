#include "table/pack.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace ddp::table {
namespace {

// A table of 10 rows: f (float32), l (int64), e (3 x float32, strided: every other row of
// a 20-row buffer); row r holds r, 100 + r, and (r, r + 0.5, r + 0.25).
struct Columns {
  std::vector<float> f, e;
  std::vector<int64_t> l;

  Columns() {
    for (int r = 0; r < 10; ++r) {
      f.push_back(static_cast<float>(r));
      l.push_back(100 + r);
    }
    e.assign(60, -1.0f);
    for (int r = 0; r < 10; ++r) {
      e[6 * r] = static_cast<float>(r);
      e[6 * r + 1] = static_cast<float>(r) + 0.5f;
      e[6 * r + 2] = static_cast<float>(r) + 0.25f;
    }
  }

  // Records: l at 0, f at 8, e at 12 (24 bytes).
  std::vector<PackColumn> Pack() const {
    auto b = [](const void* p) { return static_cast<const uint8_t*>(p); };
    return {{"l", b(l.data()), 10, 8, 8, 0},
            {"f", b(f.data()), 10, 4, 4, 8},
            {"e", b(e.data()), 10, 24, 12, 12}};
  }
};

void CheckRecord(const uint8_t* rec, int r) {
  int64_t l;
  float f, e[3];
  std::memcpy(&l, rec, 8);
  std::memcpy(&f, rec + 8, 4);
  std::memcpy(e, rec + 12, 12);
  EXPECT_EQ(l, 100 + r);
  EXPECT_EQ(f, static_cast<float>(r));
  EXPECT_EQ(e[0], static_cast<float>(r));
  EXPECT_EQ(e[1], static_cast<float>(r) + 0.5f);
  EXPECT_EQ(e[2], static_cast<float>(r) + 0.25f);
}

TEST(PackRecords, ARangeOfRows) {
  Columns t;
  std::vector<uint8_t> out(24 * 7);
  ASSERT_TRUE(PackRecords(t.Pack(), 24, 3, 7, {}, out, "partition 0").ok());
  for (int i = 0; i < 7; ++i) CheckRecord(&out[24 * static_cast<size_t>(i)], 3 + i);
}

TEST(PackRecords, PickedRowsInTheirOrder) {
  Columns t;
  const std::vector<int64_t> rows = {9, 0, 4, 4, 2};
  std::vector<uint8_t> out(24 * rows.size());
  ASSERT_TRUE(PackRecords(t.Pack(), 24, 0, rows.size(), rows, out, "").ok());
  for (size_t i = 0; i < rows.size(); ++i) CheckRecord(&out[24 * i], static_cast<int>(rows[i]));
}

TEST(PackRecords, AColumnNotPickedGivesItsRowsInOrder) {
  Columns t;
  std::vector<PackColumn> cols = t.Pack();
  const std::vector<int64_t> rows = {7, 3};
  std::vector<float> taken = {7.0f, 3.0f};  // f's rows 7 and 3, taken already
  cols[1].data = reinterpret_cast<const uint8_t*>(taken.data());
  cols[1].rows = 2;
  cols[1].picked = false;
  std::vector<uint8_t> out(24 * 2);
  ASSERT_TRUE(PackRecords(cols, 24, 0, 2, rows, out, "").ok());
  CheckRecord(&out[0], 7);
  CheckRecord(&out[24], 3);
  cols[1].rows = 1;  // fewer rows than records
  EXPECT_EQ(PackRecords(cols, 24, 0, 2, rows, out, "").code(), Code::kOutOfRange);
}

TEST(PackRecords, ManyRowsAcrossBlocks) {
  std::vector<int32_t> v(5000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(i * 7);
  std::vector<PackColumn> cols = {
      {"v", reinterpret_cast<const uint8_t*>(v.data()), 5000, 4, 4, 0}};
  std::vector<uint8_t> out(4 * 4999);
  ASSERT_TRUE(PackRecords(cols, 4, 1, 4999, {}, out, "").ok());
  for (size_t i = 0; i < 4999; ++i) {
    int32_t x;
    std::memcpy(&x, &out[4 * i], 4);
    ASSERT_EQ(x, static_cast<int32_t>((i + 1) * 7));
  }
}

TEST(PackRecords, ErrorsNameTheColumnAndWriteNothing) {
  Columns t;
  std::vector<uint8_t> out(24 * 3, 0xab);
  const std::vector<int64_t> bad = {1, 10, 2};
  Status s = PackRecords(t.Pack(), 24, 0, 3, bad, out, "partition 5");
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_NE(s.message().find("row 10 of column 'l' in partition 5, which holds 10 rows"),
            std::string::npos)
      << s.message();
  for (uint8_t b : out) ASSERT_EQ(b, 0xab);
  EXPECT_EQ(PackRecords(t.Pack(), 24, 8, 3, {}, out, "").code(), Code::kOutOfRange);
  EXPECT_EQ(PackRecords(t.Pack(), 20, 0, 3, {}, out, "").code(), Code::kInvalidArgument);
  EXPECT_EQ(PackRecords(t.Pack(), 24, 0, 4, {}, out, "").code(), Code::kInvalidArgument);
  std::vector<PackColumn> overlap = t.Pack();
  overlap[1].offset = 4;
  s = PackRecords(overlap, 24, 0, 3, {}, out, "");
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("overlap"), std::string::npos) << s.message();
  std::vector<PackColumn> narrow = t.Pack();
  narrow[2].stride = 8;  // rows of 12 bytes every 8: not a column
  EXPECT_EQ(PackRecords(narrow, 24, 0, 3, {}, out, "").code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ddp::table
