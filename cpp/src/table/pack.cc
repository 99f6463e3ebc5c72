#include "table/pack.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace ddp::table {
namespace {

// Rows written per pass over the columns: a block of records (a thousand records of a
// few hundred bytes) stays in L2 while each column is copied into it.
constexpr size_t kBlock = 1024;

template <size_t N>
void CopyBlock(const PackColumn& c, uint8_t* dst, size_t record_bytes, int64_t first,
               const int64_t* rows, size_t a, size_t z) {
  for (size_t i = a; i < z; ++i) {
    const int64_t r = rows != nullptr ? rows[i] : first + static_cast<int64_t>(i);
    std::memcpy(dst + i * record_bytes, c.data + static_cast<size_t>(r) * c.stride, N);
  }
}

void CopyColumn(const PackColumn& c, uint8_t* out, size_t record_bytes, int64_t first,
                const int64_t* rows, size_t a, size_t z) {
  uint8_t* dst = out + c.offset;
  switch (c.row_bytes) {
    case 1: return CopyBlock<1>(c, dst, record_bytes, first, rows, a, z);
    case 2: return CopyBlock<2>(c, dst, record_bytes, first, rows, a, z);
    case 4: return CopyBlock<4>(c, dst, record_bytes, first, rows, a, z);
    case 8: return CopyBlock<8>(c, dst, record_bytes, first, rows, a, z);
    case 16: return CopyBlock<16>(c, dst, record_bytes, first, rows, a, z);
    default:
      for (size_t i = a; i < z; ++i) {
        const int64_t r = rows != nullptr ? rows[i] : first + static_cast<int64_t>(i);
        std::memcpy(dst + i * record_bytes, c.data + static_cast<size_t>(r) * c.stride,
                    c.row_bytes);
      }
  }
}

}  // namespace

Status PackRecords(std::span<const PackColumn> columns, size_t record_bytes, int64_t begin,
                   size_t n, std::span<const int64_t> rows, std::span<uint8_t> out,
                   const std::string& where) {
  const std::string at = where.empty() ? "" : " in " + where;
  if (!rows.empty() && rows.size() != n) {
    return InvalidArgumentError("table pack: " + std::to_string(rows.size()) +
                                " row indices for " + std::to_string(n) + " records");
  }
  if (out.size() < n * record_bytes) {
    return InvalidArgumentError("table pack: an output of " + std::to_string(out.size()) +
                                " bytes for " + std::to_string(n) + " records of " +
                                std::to_string(record_bytes) + " bytes");
  }
  std::vector<std::pair<size_t, size_t>> spans;
  for (const PackColumn& c : columns) {
    if (c.offset + c.row_bytes > record_bytes) {
      return InvalidArgumentError("table pack: column '" + c.name + "' (" +
                                  std::to_string(c.row_bytes) + " bytes at offset " +
                                  std::to_string(c.offset) + ") does not fit in a record of " +
                                  std::to_string(record_bytes) + " bytes");
    }
    if (c.stride < c.row_bytes || c.rows < 0 || (c.data == nullptr && c.rows > 0)) {
      return InvalidArgumentError("table pack: column '" + c.name + "'" + at +
                                  " has rows of " + std::to_string(c.row_bytes) +
                                  " bytes every " + std::to_string(c.stride) + " bytes, " +
                                  std::to_string(c.rows) + " rows");
    }
    spans.emplace_back(c.offset, c.offset + c.row_bytes);
    if (n == 0) continue;
    int64_t lo = begin, hi = begin + static_cast<int64_t>(n) - 1;
    if (!c.picked) {
      lo = 0;
      hi = static_cast<int64_t>(n) - 1;
    } else if (!rows.empty()) {
      const auto [mn, mx] = std::minmax_element(rows.begin(), rows.end());
      lo = *mn;
      hi = *mx;
    }
    if (lo < 0 || hi >= c.rows) {
      return OutOfRangeError("table pack: row " + std::to_string(lo < 0 ? lo : hi) +
                             " of column '" + c.name + "'" + at + ", which holds " +
                             std::to_string(c.rows) + " rows");
    }
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first < spans[i - 1].second) {
      return InvalidArgumentError("table pack: two columns overlap at byte " +
                                  std::to_string(spans[i].first) + " of a record");
    }
  }
  const int64_t* idx = rows.empty() ? nullptr : rows.data();
  for (size_t a = 0; a < n; a += kBlock) {
    const size_t z = std::min(n, a + kBlock);
    for (const PackColumn& c : columns) {
      if (c.picked) {
        CopyColumn(c, out.data(), record_bytes, begin, idx, a, z);
      } else {
        CopyColumn(c, out.data(), record_bytes, 0, nullptr, a, z);
      }
    }
  }
  return Status::Ok();
}

}  // namespace ddp::table
