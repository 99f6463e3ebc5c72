// Rows of a table's columns packed into records: a row's columns side by side (the layout
// the gather reads, table/gather.h), in one pass over the rows a block at a time, so the
// records being written stay in the cache while every column is copied into them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "ddp/status.h"

namespace ddp::table {

struct PackColumn {
  std::string name;              // for error messages
  const uint8_t* data = nullptr;  // row 0 of the column
  int64_t rows = 0;              // rows in the column
  size_t stride = 0;             // bytes from one row to the next (>= row_bytes)
  size_t row_bytes = 0;          // bytes of one row (item size x width), contiguous
  size_t offset = 0;             // byte offset of the column inside a record
  bool picked = true;            // rows picked by begin/rows; else record i is row i
};

// Writes records [0, n) of `out` (n * record_bytes bytes): record i takes row
// begin + i of every picked column, or row rows[i] when `rows` is not empty (then n = its
// size); row i of a column not picked (its rows already taken).
// Checks first that every column fits in a record, that they do not overlap, and that
// every row read exists (the error names the column, the row and its row count);
// writes nothing on an error. `where` prefixes the errors (e.g. "partition 3").
Status PackRecords(std::span<const PackColumn> columns, size_t record_bytes, int64_t begin,
                   size_t n, std::span<const int64_t> rows, std::span<uint8_t> out,
                   const std::string& where);

}  // namespace ddp::table
