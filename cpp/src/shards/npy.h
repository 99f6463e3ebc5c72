// NumPy's .npy format (versions 1.0, 2.0 and 3.0), as numpy.save writes it: the magic
// "\x93NUMPY", a version, a header length, a header that is a Python dict literal
// {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), } and the array's bytes.
// ParseNpy checks all of it without trusting any field: the magic, the version, the
// header's length and syntax, a dtype the engine carries (bool, signed and unsigned
// integers of 1-8 bytes, float16/32/64; little-endian or byte order-free), C order, the
// shape (no negative sizes, no overflow) and that the data holds exactly shape x itemsize
// bytes. Errors are kDataLoss naming `where` (the shard and member) and what is wrong.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/status.h"

namespace ddp::shards {

struct NpyArray {
  std::string descr;           // as written: "<f4", "|u1", "|b1", ...
  char kind = 'f';             // 'b' bool, 'i' signed, 'u' unsigned, 'f' float
  int itemsize = 4;            // bytes per element
  std::vector<int64_t> shape;  // () for a scalar
  uint64_t data_offset = 0;    // of the array's bytes within the input
  uint64_t data_size = 0;
  int64_t elements() const;
};

Result<NpyArray> ParseNpy(std::string_view bytes, std::string_view where);

// "(3, 4)", "(5,)", "()": a shape as numpy prints it.
std::string ShapeString(const std::vector<int64_t>& shape);

}  // namespace ddp::shards
