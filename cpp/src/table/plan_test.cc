#include "table/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <utility>
#include <vector>

namespace ddp::table {
namespace {

TEST(ShuffleRowsTest, IsAPermutationFixedByItsKey) {
  std::vector<int64_t> a(1000);
  std::iota(a.begin(), a.end(), 0);
  std::vector<int64_t> b = a, c = a, d = a;
  ShuffleRows(a, {1, 2, 3, 4});
  ShuffleRows(b, {1, 2, 3, 4});
  ShuffleRows(c, {1, 2, 3, 5});
  ShuffleRows(d, {2, 2, 3, 4});
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> want(1000);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(sorted, want);
  EXPECT_NE(a, want);
}

// The chi-square of the 24 orders of four ids over 48,000 keys (each expected 2,000
// times); beyond 60 (23 degrees of freedom) has a chance below 1e-4.
double OrdersOfFourChiSquare(uint64_t seed, size_t in_cache) {
  std::map<std::vector<int64_t>, int> seen;
  for (uint64_t k = 0; k < 48000; ++k) {
    std::vector<int64_t> v{0, 1, 2, 3};
    ShuffleRows(v, {seed, k, 0, 0}, in_cache);
    ++seen[v];
  }
  EXPECT_EQ(seen.size(), 24u);
  double chi = 0;
  for (const auto& [order, count] : seen) chi += (count - 2000.0) * (count - 2000.0) / 2000.0;
  return chi;
}

TEST(ShuffleRowsTest, EveryOrderOfFourIsEquallyLikely) {
  EXPECT_LT(OrdersOfFourChiSquare(7, kShuffleInCache), 60.0);
}

TEST(ShuffleRowsTest, EveryOrderOfFourIsEquallyLikelyThroughBuckets) {
  // in_cache 1: four buckets of one expected id each, then each bucket shuffled.
  EXPECT_LT(OrdersOfFourChiSquare(9, 1), 60.0);
}

TEST(ShuffleRowsTest, ALargeShuffleLeavesNoTraceOfTheOrderBefore) {
  // 1M ids (the bucketed path): which sixteenth an id came from and which sixteenth it
  // lands in are independent: 256 cells of 4096 expected each; a chi-square of 225
  // degrees of freedom beyond 330 has a chance below 1e-5.
  const size_t n = size_t{1} << 20;
  std::vector<int64_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  ShuffleRows(ids, {3, 1, 4, 1});
  std::vector<int64_t> sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(sorted[i], static_cast<int64_t>(i));
  std::vector<double> cells(256, 0);
  for (size_t pos = 0; pos < n; ++pos) {
    cells[(static_cast<size_t>(ids[pos]) >> 16) * 16 + (pos >> 16)] += 1;
  }
  double chi = 0;
  for (double c : cells) chi += (c - 4096.0) * (c - 4096.0) / 4096.0;
  EXPECT_LT(chi, 330.0);
}

TEST(ShuffleRowsTest, EmptyAndSingleAreLeftAlone) {
  std::vector<int64_t> none;
  ShuffleRows(none, {0, 0, 0, 0});
  std::vector<int64_t> one{42};
  ShuffleRows(one, {0, 0, 0, 0});
  EXPECT_EQ(one, std::vector<int64_t>{42});
}

TEST(WindowPermutationTest, IsAPermutationOfEverySize) {
  for (uint64_t size : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{5}, uint64_t{65536},
                        uint64_t{65537}, uint64_t{100000}, uint64_t{131072}, uint64_t{131073},
                        uint64_t{300007}}) {
    const WindowPermutation perm(size, {1, 2, 3, 4});
    std::vector<uint8_t> seen(size, 0);
    for (uint64_t j = 0; j < size; ++j) {
      const uint64_t y = perm(j);
      ASSERT_LT(y, size) << "size " << size << " position " << j;
      ASSERT_EQ(seen[y], 0) << "size " << size << ": " << y << " reached twice";
      seen[y] = 1;
    }
  }
}

TEST(WindowPermutationTest, SmallWindowsAreTheFisherYatesOrderAndKeysDecideTheOrder) {
  std::vector<int64_t> ids(1000);
  std::iota(ids.begin(), ids.end(), 0);
  ShuffleRows(ids, {5, 6, 7, 8});
  const WindowPermutation perm(1000, {5, 6, 7, 8});
  for (uint64_t j = 0; j < 1000; ++j) ASSERT_EQ(perm(j), static_cast<uint64_t>(ids[j]));
  const uint64_t big = 200000;
  const WindowPermutation a(big, {1, 2, 3, 4}), b(big, {1, 2, 3, 4}), c(big, {1, 2, 3, 5});
  size_t same = 0, moved = 0;
  for (uint64_t j = 0; j < big; ++j) {
    same += a(j) == b(j);
    moved += a(j) != c(j);
    ASSERT_EQ(a(j), b(j));
  }
  EXPECT_EQ(same, big);
  EXPECT_GT(moved, big * 99 / 100);  // another key: another order, not a few swaps
}

// The chi-square of 16 x 16 cells of (cell_a(j), cell_b(j)) over the positions j of a
// Feistel-sized window; beyond 330 (225 degrees of freedom) has a chance below 1e-5.
template <typename A, typename B>
double IndependenceChiSquare(uint64_t size, A cell_a, B cell_b) {
  std::vector<double> cells(256, 0);
  for (uint64_t j = 0; j + 1 < size; ++j) cells[cell_a(j) * 16 + cell_b(j)] += 1;
  const double expect = static_cast<double>(size - 1) / 256.0;
  double chi = 0;
  for (double c : cells) chi += (c - expect) * (c - expect) / expect;
  return chi;
}

TEST(WindowPermutationTest, ALargeWindowLeavesNoTraceOfPositionsOrNeighbours) {
  // A size with walks beyond it (2^20 < size < 2^21), high and low bits of positions and
  // images, and the images of neighbouring positions.
  const uint64_t size = 1500007;
  const WindowPermutation perm(size, {3, 1, 4, 1});
  auto high = [&](uint64_t v) { return v * 16 / size; };
  EXPECT_LT(IndependenceChiSquare(size, [&](uint64_t j) { return high(j); },
                                  [&](uint64_t j) { return high(perm(j)); }), 330.0);
  EXPECT_LT(IndependenceChiSquare(size, [&](uint64_t j) { return j % 16; },
                                  [&](uint64_t j) { return perm(j) % 16; }), 330.0);
  EXPECT_LT(IndependenceChiSquare(size, [&](uint64_t j) { return high(perm(j)); },
                                  [&](uint64_t j) { return high(perm(j + 1)); }), 330.0);
  EXPECT_LT(IndependenceChiSquare(size, [&](uint64_t j) { return perm(j) % 16; },
                                  [&](uint64_t j) { return perm(j + 1) % 16; }), 330.0);
  // Over keys, a position's image is uniform: 16,000 keys in 16 cells (15 degrees of
  // freedom; beyond 50, a chance below 1e-5).
  std::vector<double> cells(16, 0);
  for (uint64_t k = 0; k < 16000; ++k) cells[high(WindowPermutation(size, {9, k, 0, 0})(7))] += 1;
  double chi = 0;
  for (double c : cells) chi += (c - 1000.0) * (c - 1000.0) / 1000.0;
  EXPECT_LT(chi, 50.0);
}

TEST(WindowedSequenceTest, UnshuffledIsEachWindowsPartitionsInTheGivenOrder) {
  const std::vector<int64_t> counts{3, 0, 2, 4};  // rows 0-2, -, 3-4, 5-8
  const std::vector<int64_t> order{3, 0, 2, 1};
  std::vector<int64_t> rows(9), wins(9);
  ASSERT_TRUE(WindowedSequence(counts, order, 2, false, 0, 0, 0, rows, wins).ok());
  EXPECT_EQ(rows, (std::vector<int64_t>{5, 6, 7, 8, 0, 1, 2, 3, 4}));
  EXPECT_EQ(wins, (std::vector<int64_t>{0, 0, 0, 0, 0, 0, 0, 1, 1}));
}

TEST(WindowedSequenceTest, ShuffledKeepsEachWindowsRowsAndDependsOnSeedEpochAndSalt) {
  const std::vector<int64_t> counts{50, 70, 0, 30, 40};
  const std::vector<int64_t> order{4, 1, 3, 0, 2};
  auto run = [&](uint64_t seed, uint64_t epoch, uint64_t salt) {
    std::vector<int64_t> rows(190), wins(190);
    EXPECT_TRUE(WindowedSequence(counts, order, 2, true, seed, epoch, salt, rows, wins).ok());
    return std::make_pair(rows, wins);
  };
  auto [rows, wins] = run(1, 2, 0);
  std::vector<int64_t> plain(190), plain_wins(190);
  ASSERT_TRUE(WindowedSequence(counts, order, 2, false, 0, 0, 0, plain, plain_wins).ok());
  EXPECT_EQ(wins, plain_wins);
  for (int64_t w = 0; w < 3; ++w) {
    std::multiset<int64_t> got, want;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (wins[i] == w) {
        got.insert(rows[i]);
        want.insert(plain[i]);
      }
    }
    EXPECT_EQ(got, want) << "window " << w;
  }
  EXPECT_NE(rows, plain);
  EXPECT_EQ(run(1, 2, 0).first, rows);
  EXPECT_NE(run(1, 3, 0).first, rows);
  EXPECT_NE(run(2, 2, 0).first, rows);
  EXPECT_NE(run(1, 2, 1).first, rows);
}

TEST(WindowedSequenceTest, BadInputIsRefusedNamingIt) {
  std::vector<int64_t> rows(3), wins(3);
  Status s = WindowedSequence(std::vector<int64_t>{3, -1}, std::vector<int64_t>{0, 1}, 1,
                              false, 0, 0, 0, rows, wins);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("partition 1 has -1 rows"), std::string::npos) << s.message();
  s = WindowedSequence(std::vector<int64_t>{3}, std::vector<int64_t>{1}, 1, false, 0, 0, 0,
                       rows, wins);
  EXPECT_NE(s.message().find("order entry 0 names partition 1 of 1"), std::string::npos)
      << s.message();
  s = WindowedSequence(std::vector<int64_t>{4}, std::vector<int64_t>{0}, 1, false, 0, 0, 0,
                       rows, wins);
  EXPECT_NE(s.message().find("for 4 rows"), std::string::npos) << s.message();
  s = WindowedSequence(std::vector<int64_t>{3}, std::vector<int64_t>{0}, 0, false, 0, 0, 0,
                       rows, wins);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
}

// Rank `rank`'s entries of the whole sequence, padded or cut as DistributedSampler does
// (what RankSequence must agree with).
std::pair<std::vector<int64_t>, std::vector<int64_t>> ShareOfTheWhole(
    const std::vector<int64_t>& counts, const std::vector<int64_t>& order, size_t window,
    bool shuffle, uint64_t seed, size_t world, size_t rank, bool drop_last) {
  size_t n = 0;
  for (int64_t p : order) n += static_cast<size_t>(counts[static_cast<size_t>(p)]);
  std::vector<int64_t> rows(n), wins(n);
  EXPECT_TRUE(WindowedSequence(counts, order, window, shuffle, seed, 5, 3, rows, wins).ok());
  if (drop_last) {
    rows.resize(n / world * world);
    wins.resize(n / world * world);
  } else if (n % world != 0) {
    const int64_t last = wins.back() + 1;
    for (size_t q = n; q % world != 0; ++q) {
      rows.push_back(rows[(q - n) % n]);
      wins.push_back(last);
    }
  }
  std::pair<std::vector<int64_t>, std::vector<int64_t>> share;
  for (size_t q = rank; q < rows.size(); q += world) {
    share.first.push_back(rows[q]);
    share.second.push_back(wins[q]);
  }
  return share;
}

TEST(RankSequenceTest, IsTheRanksEntriesOfTheWholePaddedSequence) {
  std::mt19937_64 gen(11);
  for (int trial = 0; trial < 400; ++trial) {
    const size_t nparts = 1 + gen() % 7;
    std::vector<int64_t> counts(nparts);
    // Empty partitions, and tables smaller than the world (the padding cycles).
    for (auto& c : counts) c = gen() % 4 == 0 ? 0 : static_cast<int64_t>(gen() % 40);
    std::vector<int64_t> order(nparts);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), gen);
    const size_t window = 1 + gen() % 3;
    const bool shuffle = gen() % 2 == 0, drop_last = gen() % 2 == 0;
    const size_t world = 1 + gen() % 5;
    for (size_t rank = 0; rank < world; ++rank) {
      std::vector<int64_t> rows, wins;
      ASSERT_TRUE(RankSequence(counts, order, window, shuffle, trial, 5, 3, world, rank,
                               drop_last, &rows, &wins).ok());
      auto [want_rows, want_wins] =
          ShareOfTheWhole(counts, order, window, shuffle, trial, world, rank, drop_last);
      ASSERT_EQ(rows, want_rows) << "trial " << trial << " rank " << rank << " of " << world;
      ASSERT_EQ(wins, want_wins) << "trial " << trial << " rank " << rank << " of " << world;
    }
  }
}

TEST(RankSequenceTest, LargeShuffledWindowsAgreeToo) {
  // Windows beyond kShuffleInCache ids: the bucketed shuffle, its buffers reused.
  const std::vector<int64_t> counts{70000, 50000, 90000, 3};
  const std::vector<int64_t> order{2, 0, 3, 1};
  for (size_t rank = 0; rank < 3; ++rank) {
    std::vector<int64_t> rows, wins;
    ASSERT_TRUE(
        RankSequence(counts, order, 2, true, 8, 5, 3, 3, rank, false, &rows, &wins).ok());
    auto [want_rows, want_wins] = ShareOfTheWhole(counts, order, 2, true, 8, 3, rank, false);
    EXPECT_EQ(rows, want_rows) << "rank " << rank;
    EXPECT_EQ(wins, want_wins) << "rank " << rank;
  }
}

TEST(RankSequenceTest, BadRanksAndInputAreRefusedNamingThem) {
  std::vector<int64_t> rows, wins;
  const std::vector<int64_t> counts{3}, order{0};
  Status s = RankSequence(counts, order, 1, false, 0, 0, 0, 2, 2, false, &rows, &wins);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("rank 2 of a world of 2"), std::string::npos) << s.message();
  s = RankSequence(counts, order, 1, false, 0, 0, 0, 0, 0, false, &rows, &wins);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  s = RankSequence(std::vector<int64_t>{-2}, order, 1, false, 0, 0, 0, 1, 0, false, &rows,
                   &wins);
  EXPECT_NE(s.message().find("partition 0 has -2 rows"), std::string::npos) << s.message();
  s = RankSequence(counts, std::vector<int64_t>{4}, 1, false, 0, 0, 0, 1, 0, false, &rows,
                   &wins);
  EXPECT_NE(s.message().find("order entry 0 names partition 4 of 1"), std::string::npos)
      << s.message();
  s = RankSequence(counts, order, 0, false, 0, 0, 0, 1, 0, false, &rows, &wins);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
}

// The pieces and positions of a window, by sorting (what IndexWindow must agree with).
void CheckAgainstASort(const std::vector<int64_t>& rows, const std::vector<int64_t>& offsets,
                       bool whole) {
  WindowIndex got;
  ASSERT_TRUE(IndexWindow(rows, offsets, whole, &got).ok());
  const size_t nparts = offsets.size() - 1;
  std::vector<std::set<int64_t>> distinct(nparts);
  for (int64_t r : rows) {
    const size_t p = static_cast<size_t>(
        std::upper_bound(offsets.begin(), offsets.end(), r) - offsets.begin() - 1);
    distinct[p].insert(r - offsets[p]);
  }
  std::vector<int64_t> parts;
  for (size_t p = 0; p < nparts; ++p) {
    if (!distinct[p].empty()) parts.push_back(static_cast<int64_t>(p));
  }
  ASSERT_EQ(got.partitions, parts);
  std::vector<std::vector<int64_t>> pieces;
  size_t at = 0;
  for (size_t s = 0; s < parts.size(); ++s) {
    const auto p = static_cast<size_t>(parts[s]);
    std::vector<int64_t> piece;
    if (whole) {
      for (int64_t r = 0; r < offsets[p + 1] - offsets[p]; ++r) piece.push_back(r);
    } else {
      piece.assign(got.piece_rows.begin() + static_cast<ptrdiff_t>(at),
                   got.piece_rows.begin() + static_cast<ptrdiff_t>(at + static_cast<size_t>(got.sizes[s])));
      at += static_cast<size_t>(got.sizes[s]);
      EXPECT_EQ(piece, std::vector<int64_t>(distinct[p].begin(), distinct[p].end()));
    }
    EXPECT_EQ(got.sizes[s], static_cast<int64_t>(piece.size()));
    pieces.push_back(piece);
  }
  ASSERT_EQ(got.seg.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto s = static_cast<size_t>(got.seg[i]);
    ASSERT_LT(s, parts.size());
    EXPECT_EQ(offsets[static_cast<size_t>(parts[s])] + pieces[s][static_cast<size_t>(got.row[i])],
              rows[i])
        << "position " << i;
  }
}

TEST(IndexWindowTest, PiecesAndPositionsAgreeWithASort) {
  std::mt19937_64 gen(5);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int64_t> offsets{0};
    const int nparts = 1 + static_cast<int>(gen() % 8);
    for (int p = 0; p < nparts; ++p) offsets.push_back(offsets.back() + static_cast<int64_t>(gen() % 40));
    if (offsets.back() == 0) continue;
    std::vector<int64_t> rows(1 + gen() % static_cast<uint64_t>(3 * offsets.back()));
    for (int64_t& r : rows) r = static_cast<int64_t>(gen() % static_cast<uint64_t>(offsets.back()));
    CheckAgainstASort(rows, offsets, false);
    CheckAgainstASort(rows, offsets, true);
  }
}

TEST(IndexWindowTest, ARowOutsideTheTableOrBadOffsetsAreRefused) {
  WindowIndex out;
  Status s = IndexWindow(std::vector<int64_t>{0, 5, 9}, std::vector<int64_t>{0, 4, 9}, false, &out);
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_NE(s.message().find("position 2 names row 9 of a table of 9 rows"), std::string::npos)
      << s.message();
  s = IndexWindow(std::vector<int64_t>{-1}, std::vector<int64_t>{0, 4}, true, &out);
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  s = IndexWindow(std::vector<int64_t>{0}, std::vector<int64_t>{0, 4, 2}, true, &out);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  s = IndexWindow(std::vector<int64_t>{0}, std::vector<int64_t>{1, 4}, true, &out);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  s = IndexWindow(std::vector<int64_t>{}, std::vector<int64_t>{}, true, &out);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ddp::table
