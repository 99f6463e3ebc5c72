#include "shards/npy.h"

#include <gtest/gtest.h>

namespace ddp::shards {
namespace {

// A .npy as numpy.save writes it (version 1.0, header padded to 64 bytes).
std::string Npy(const std::string& dict, std::string_view data, char major = 1) {
  std::string header = dict;
  const size_t pre = major == 1 ? 10 : 12;
  while ((pre + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += major;
  out += '\0';
  const size_t n = header.size();
  out += static_cast<char>(n & 0xff);
  out += static_cast<char>((n >> 8) & 0xff);
  if (major != 1) out += std::string(2, '\0');
  return out + header + std::string(data);
}

constexpr char kWhere[] = "s3://b/shard-000003.tar#sample7.npy";

TEST(NpyTest, ReadsWhatNumpyWrites) {
  const std::string f4(24, '\1');
  auto a = ParseNpy(Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", f4), kWhere);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->descr, "<f4");
  EXPECT_EQ(a->kind, 'f');
  EXPECT_EQ(a->itemsize, 4);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->data_offset % 64, 0u);
  EXPECT_EQ(a->data_size, 24u);
  auto v = ParseNpy(Npy("{'descr': '|u1', 'fortran_order': False, 'shape': (5,), }", "abcde", 2), kWhere);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->shape, std::vector<int64_t>{5});
  EXPECT_EQ(ShapeString(v->shape), "(5,)");
  auto scalar = ParseNpy(Npy("{'shape': (), 'fortran_order': False, 'descr': '<i8'}", std::string(8, '\0'), 3), kWhere);
  ASSERT_TRUE(scalar.ok()) << scalar.status().ToString();
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(ShapeString(scalar->shape), "()");
  auto empty = ParseNpy(Npy("{'descr': '<f8', 'fortran_order': False, 'shape': (0, 4), }", ""), kWhere);
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
}

TEST(NpyTest, BadInputIsAnErrorNamingTheMember) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not a npy file", "magic"},
      {Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", "12345678").substr(0, 20), "only"},
      {Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", "1234"), "needs 8 bytes"},
      {Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", "123456789"), "it has 9"},
      {Npy("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", "12345678"), "dtype '>f4'"},
      {Npy("{'descr': '<U3', 'fortran_order': False, 'shape': (1,), }", "123456789012"), "dtype '<U3'"},
      {Npy("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", "12345678"), "dtype '|O'"},
      {Npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", "12345678"), "Fortran"},
      {Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", "12345678"), "sizes >= 0"},
      {Npy("{'descr': '<f4', 'fortran_order': False, }", "12345678"), "lacks"},
      {Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", "12345678"), "unknown header key"},
      {Npy("{'descr': '<f4' 'fortran_order': False}", ""), "malformed"},
      {Npy("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", "1234"), "structured"},
      {Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 4294967296), }", ""),
       "overflows"},
      {Npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", "1234", 7), "version 7.0"},
  };
  for (const auto& [bytes, what] : cases) {
    auto r = ParseNpy(bytes, kWhere);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), Code::kDataLoss);
    EXPECT_NE(r.status().message().find(kWhere), std::string::npos) << r.status().ToString();
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().ToString();
  }
}

}  // namespace
}  // namespace ddp::shards
