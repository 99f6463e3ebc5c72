#include "table/plan.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>

namespace ddp::table {
namespace {

__extension__ using Uint128 = unsigned __int128;

// SplitMix64's finaliser: a bijection of 64-bit words with full avalanche.
inline uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// SplitMix64 started from the key's words: a counter through the finaliser.
class KeyedStream {
 public:
  explicit KeyedStream(const ShuffleKey& key) {
    uint64_t h = 0x6A09E667F3BCC909ULL;
    for (uint64_t word : key) h = Mix(h ^ Mix(word + 0x9E3779B97F4A7C15ULL));
    state_ = h;
  }
  uint64_t Next() { return Mix(state_ += 0x9E3779B97F4A7C15ULL); }
  // Uniform in [0, n), n >= 1 (Lemire's multiply-shift; the few biased draws rejected).
  uint64_t Below(uint64_t n) {
    Uint128 m = static_cast<Uint128>(Next()) * n;
    auto low = static_cast<uint64_t>(m);
    if (low < n) {
      const uint64_t floor = (0 - n) % n;
      while (low < floor) {
        m = static_cast<Uint128>(Next()) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

 private:
  uint64_t state_;
};

// The partition holding `row`: the last p with offsets[p] <= row (offsets[0] <= row <
// offsets.back()), without branches on the data.
inline size_t PartitionOf(const int64_t* offsets, size_t n_offsets, int64_t row) {
  const int64_t* base = offsets;
  size_t len = n_offsets;
  while (len > 1) {
    const size_t half = len / 2;
    base = base[half] <= row ? base + half : base;
    len -= half;
  }
  return static_cast<size_t>(base - offsets);
}

}  // namespace

namespace {

void FisherYates(std::span<int64_t> ids, KeyedStream& stream) {
  for (size_t i = ids.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(stream.Below(i));
    std::swap(ids[i - 1], ids[j]);
  }
}

}  // namespace

void ShuffleRows(std::span<int64_t> ids, const ShuffleKey& key, size_t in_cache) {
  KeyedStream stream(key);
  const size_t n = ids.size();
  in_cache = std::max<size_t>(in_cache, 1);
  if (n <= in_cache) {
    FisherYates(ids, stream);
    return;
  }
  // Beyond the cache, Fisher-Yates waits on a miss per swap. Instead each id goes to one
  // of B buckets (a power of two: uniform, 8 bits of a draw each), in one sequential pass,
  // and each bucket, now cache-sized, is shuffled alone; the buckets end to end are a
  // uniform permutation (every order is reached through every split of the buckets' sizes
  // with the same probability).
  size_t buckets = 2;
  while (buckets < 256 && n / buckets > in_cache) buckets *= 2;
  std::vector<uint8_t> which(n);
  std::vector<size_t> start(buckets + 1, 0);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t bits = stream.Next();
    for (size_t k = i; k < std::min(n, i + 8); ++k, bits >>= 8) {
      which[k] = static_cast<uint8_t>(bits & (buckets - 1));
      ++start[which[k] + 1];
    }
  }
  for (size_t b = 0; b < buckets; ++b) start[b + 1] += start[b];
  std::vector<int64_t> out(n);
  std::vector<size_t> at(start.begin(), start.end() - 1);
  for (size_t i = 0; i < n; ++i) out[at[which[i]]++] = ids[i];
  for (size_t b = 0; b < buckets; ++b) {
    FisherYates(std::span<int64_t>(out).subspan(start[b], start[b + 1] - start[b]), stream);
  }
  std::copy(out.begin(), out.end(), ids.begin());
}

WindowPermutation::WindowPermutation(uint64_t size, const ShuffleKey& key) : size_(size) {
  if (size <= kShuffleInCache) {
    table_.resize(size);
    for (uint64_t j = 0; j < size; ++j) table_[j] = static_cast<int64_t>(j);
    ShuffleRows(table_, key);
    return;
  }
  KeyedStream stream(key);
  for (uint64_t& k : round_keys_) k = stream.Next();
  unsigned bits = 0;
  while (bits < 64 && (uint64_t{1} << bits) < size) ++bits;
  high_bits_ = bits / 2;
  low_bits_ = bits - high_bits_;
}

uint64_t WindowPermutation::Network(uint64_t x) const {
  // (high, low) -> (low, high ^ F(low)): the halves trade places (and widths) each round,
  // and after four rounds are back to their widths. A round is undone by (h, l) -> (l ^
  // F(h), h), so the network is a bijection of the bits' range.
  unsigned hb = high_bits_, lb = low_bits_;
  uint64_t high = x >> lb, low = x & ((uint64_t{1} << lb) - 1);
  for (uint64_t k : round_keys_) {
    const uint64_t f = Mix(low ^ k) & ((uint64_t{1} << hb) - 1);
    const uint64_t next_low = high ^ f;
    high = low;
    low = next_low;
    std::swap(hb, lb);
  }
  return (high << lb) | low;
}

void WindowPermutation::Images(uint64_t first, uint64_t step, size_t n, uint64_t* out) const {
  if (!table_.empty()) {
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint64_t>(table_[first + i * step]);
    return;
  }
  // Independent networks side by side (no branch: the CPU overlaps them), then the few
  // images beyond size walked on.
  for (size_t i = 0; i < n; ++i) out[i] = Network(first + i * step);
  for (size_t i = 0; i < n; ++i) {
    while (out[i] >= size_) out[i] = Network(out[i]);
  }
}

namespace {

// Partition offsets (first row of each, then the table's rows) and the rows `order`
// names, or InvalidArgument naming a negative count or an order entry of no partition.
Status LayoutOffsets(std::span<const int64_t> counts, std::span<const int64_t> order,
                     size_t window, std::vector<int64_t>* offsets, size_t* total) {
  if (window == 0) return InvalidArgumentError("table plan: window must be >= 1");
  offsets->assign(counts.size() + 1, 0);
  for (size_t p = 0; p < counts.size(); ++p) {
    if (counts[p] < 0) {
      return InvalidArgumentError("table plan: partition " + std::to_string(p) + " has " +
                                  std::to_string(counts[p]) + " rows");
    }
    (*offsets)[p + 1] = (*offsets)[p] + counts[p];
  }
  *total = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    if (order[k] < 0 || static_cast<size_t>(order[k]) >= counts.size()) {
      return InvalidArgumentError("table plan: order entry " + std::to_string(k) + " names " +
                                  "partition " + std::to_string(order[k]) + " of " +
                                  std::to_string(counts.size()));
    }
    *total += static_cast<size_t>(counts[static_cast<size_t>(order[k])]);
  }
  return Status::Ok();
}

// Window w's partitions laid end to end: where each begins in the window, and its first
// row in the table; the window's row at position j is found by a search over them.
struct WindowLayout {
  std::vector<int64_t> begin;  // the pieces' first positions, then the window's size
  std::vector<int64_t> first;  // each piece's first row in the table

  WindowLayout(std::span<const int64_t> offsets, std::span<const int64_t> order, size_t window,
               size_t w) {
    const size_t last = std::min(order.size(), (w + 1) * window);
    begin.push_back(0);
    for (size_t k = w * window; k < last; ++k) {
      const auto p = static_cast<size_t>(order[k]);
      if (offsets[p + 1] == offsets[p]) continue;
      first.push_back(offsets[p]);
      begin.push_back(begin.back() + offsets[p + 1] - offsets[p]);
    }
  }
  uint64_t size() const { return static_cast<uint64_t>(begin.back()); }
  int64_t Row(uint64_t j) const {
    const size_t piece = PartitionOf(begin.data(), begin.size() - 1, static_cast<int64_t>(j));
    return first[piece] + static_cast<int64_t>(j) - begin[piece];
  }
};

// The window's rows at positions first, first + step, ... below end, in the epoch's
// order, into out (one per position).
// perm: the window's permutation, or null for table order. Returns how many.
uint64_t WindowRows(const WindowLayout& layout, const WindowPermutation* perm, uint64_t first,
                    uint64_t step, uint64_t end, int64_t* out) {
  if (first >= end) return 0;
  const uint64_t n = (end - first + step - 1) / step;
  if (perm == nullptr) {
    for (uint64_t i = 0; i < n; ++i) out[i] = layout.Row(first + i * step);
    return n;
  }
  constexpr size_t kBlock = 64;
  uint64_t images[kBlock];
  for (uint64_t i = 0; i < n; i += kBlock) {
    const size_t k = static_cast<size_t>(std::min<uint64_t>(kBlock, n - i));
    perm->Images(first + i * step, step, k, images);
    for (size_t b = 0; b < k; ++b) out[i + b] = layout.Row(images[b]);
  }
  return n;
}

}  // namespace

Status WindowedSequence(std::span<const int64_t> counts, std::span<const int64_t> order,
                        size_t window, bool shuffle, uint64_t seed, uint64_t epoch,
                        uint64_t salt, std::span<int64_t> rows, std::span<int64_t> wins) {
  std::vector<int64_t> offsets;
  size_t total = 0;
  if (Status s = LayoutOffsets(counts, order, window, &offsets, &total); !s.ok()) return s;
  if (rows.size() != total || wins.size() != total) {
    return InvalidArgumentError("table plan: outputs of " + std::to_string(rows.size()) + " and " +
                                std::to_string(wins.size()) + " entries for " +
                                std::to_string(total) + " rows");
  }
  size_t at = 0;
  for (size_t w = 0; w * window < order.size(); ++w) {
    const WindowLayout layout(offsets, order, window, w);
    const uint64_t m = layout.size();
    std::optional<WindowPermutation> perm;
    if (shuffle) perm.emplace(m, ShuffleKey{seed, epoch, salt, w});
    WindowRows(layout, perm ? &*perm : nullptr, 0, 1, m, rows.data() + at);
    std::fill_n(wins.begin() + static_cast<ptrdiff_t>(at), m, static_cast<int64_t>(w));
    at += m;
  }
  return Status::Ok();
}

Status RankSequence(std::span<const int64_t> counts, std::span<const int64_t> order,
                    size_t window, bool shuffle, uint64_t seed, uint64_t epoch, uint64_t salt,
                    size_t world, size_t rank, bool drop_last, std::vector<int64_t>* rows,
                    std::vector<int64_t>* wins) {
  if (world == 0 || rank >= world) {
    return InvalidArgumentError("table plan: rank " + std::to_string(rank) + " of a world of " +
                                std::to_string(world));
  }
  std::vector<int64_t> offsets;
  size_t n = 0;
  if (Status s = LayoutOffsets(counts, order, window, &offsets, &n); !s.ok()) return s;
  // The padded (or cut) sequence's length, a multiple of world; the rank's share of it.
  const size_t padded = drop_last ? n / world * world : (n + world - 1) / world * world;
  const size_t share = padded / world;
  rows->assign(share, 0);
  wins->assign(share, 0);
  size_t at = 0;  // the rank's entries written
  int64_t last_window = -1;
  size_t begin = 0;  // the window's first position in the sequence
  const size_t keep = std::min(n, padded);  // positions below it are the sequence's own
  for (size_t w = 0; w * window < order.size() && begin < keep; ++w) {
    const WindowLayout layout(offsets, order, window, w);
    const size_t m = layout.size();
    if (m == 0) continue;
    last_window = static_cast<int64_t>(w);
    std::optional<WindowPermutation> perm;
    if (shuffle) perm.emplace(m, ShuffleKey{seed, epoch, salt, w});
    // The window's first position of this rank: begin + first is rank mod world.
    const size_t first = (rank + world - begin % world) % world;
    const uint64_t got = WindowRows(layout, perm ? &*perm : nullptr, first, world,
                                    std::min(m, keep - begin), rows->data() + at);
    std::fill_n(wins->data() + at, got, static_cast<int64_t>(w));
    at += got;
    begin += m;
  }
  // Padding (never with drop_last): position q >= n repeats the sequence's entry q - n,
  // cycled when the table has fewer rows than the padding: the sequence's first entries
  // (fewer than world) are laid out again.
  if (at < share) {
    std::vector<int64_t> head;
    const size_t want = std::min(n, padded - n);
    for (size_t w = 0; w * window < order.size() && head.size() < want; ++w) {
      const WindowLayout layout(offsets, order, window, w);
      if (layout.size() == 0) continue;
      std::optional<WindowPermutation> perm;
      if (shuffle) perm.emplace(layout.size(), ShuffleKey{seed, epoch, salt, w});
      const size_t k = std::min<size_t>(layout.size(), want - head.size());
      head.resize(head.size() + k);
      WindowRows(layout, perm ? &*perm : nullptr, 0, 1, k, head.data() + head.size() - k);
    }
    for (size_t q = n + (rank + world - n % world) % world; q < padded; q += world) {
      (*rows)[at] = head[(q - n) % n];
      (*wins)[at] = last_window + 1;
      ++at;
    }
  }
  if (at != share) {
    return InternalError("table plan: rank " + std::to_string(rank) + " laid out " +
                         std::to_string(at) + " of its " + std::to_string(share) + " rows");
  }
  return Status::Ok();
}

Status IndexWindow(std::span<const int64_t> rows, std::span<const int64_t> offsets, bool whole,
                   WindowIndex* out) {
  if (offsets.empty() || offsets[0] != 0) {
    return InvalidArgumentError("table window: partition offsets must start at 0");
  }
  for (size_t p = 1; p < offsets.size(); ++p) {
    if (offsets[p] < offsets[p - 1]) {
      return InvalidArgumentError("table window: partition offsets decrease at partition " +
                                  std::to_string(p - 1));
    }
  }
  const size_t nparts = offsets.size() - 1;
  const int64_t end = offsets.back();
  const size_t n = rows.size();
  *out = WindowIndex{};
  // Each position's partition (kept in seg until the present partitions are known).
  std::vector<int32_t> part(n);
  std::vector<uint8_t> present(nparts, 0);
  for (size_t i = 0; i < n; ++i) {
    const int64_t r = rows[i];
    if (r < 0 || r >= end) {
      return OutOfRangeError("table window: position " + std::to_string(i) + " names row " +
                             std::to_string(r) + " of a table of " + std::to_string(end) +
                             " rows");
    }
    const size_t p = PartitionOf(offsets.data(), offsets.size(), r);
    part[i] = static_cast<int32_t>(p);
    present[p] = 1;
  }
  std::vector<int32_t> seg_of(nparts, -1);
  for (size_t p = 0; p < nparts; ++p) {
    if (present[p]) {
      seg_of[p] = static_cast<int32_t>(out->partitions.size());
      out->partitions.push_back(static_cast<int64_t>(p));
    }
  }
  out->seg.resize(n);
  out->row.resize(n);
  if (whole) {
    for (int64_t p : out->partitions) {
      out->sizes.push_back(offsets[static_cast<size_t>(p) + 1] - offsets[static_cast<size_t>(p)]);
    }
    for (size_t i = 0; i < n; ++i) {
      const auto p = static_cast<size_t>(part[i]);
      out->seg[i] = seg_of[p];
      out->row[i] = rows[i] - offsets[p];
    }
    return Status::Ok();
  }
  // A mark per row of the present partitions, laid end to end in table order; then each
  // marked row's index among its partition's marked rows.
  std::vector<int64_t> base(nparts, 0);
  size_t span = 0;
  for (int64_t p : out->partitions) {
    base[static_cast<size_t>(p)] = static_cast<int64_t>(span);
    span += static_cast<size_t>(offsets[static_cast<size_t>(p) + 1] - offsets[static_cast<size_t>(p)]);
  }
  std::vector<int64_t> index(span, -1);
  for (size_t i = 0; i < n; ++i) {
    const auto p = static_cast<size_t>(part[i]);
    index[static_cast<size_t>(base[p] + rows[i] - offsets[p])] = 0;
  }
  for (int64_t p : out->partitions) {
    const auto b = static_cast<size_t>(base[static_cast<size_t>(p)]);
    const auto k = static_cast<size_t>(offsets[static_cast<size_t>(p) + 1] - offsets[static_cast<size_t>(p)]);
    int64_t count = 0;
    for (size_t j = 0; j < k; ++j) {
      if (index[b + j] == 0) {
        index[b + j] = count++;
        out->piece_rows.push_back(static_cast<int64_t>(j));
      }
    }
    out->sizes.push_back(count);
  }
  for (size_t i = 0; i < n; ++i) {
    const auto p = static_cast<size_t>(part[i]);
    out->seg[i] = seg_of[p];
    out->row[i] = index[static_cast<size_t>(base[p] + rows[i] - offsets[p])];
  }
  return Status::Ok();
}

}  // namespace ddp::table
