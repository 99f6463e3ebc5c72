// Image decode: JPEG (libjpeg-turbo, TurboJPEG API) and PNG (libspng) to RGB8.
//
// Every error names the URL it was given and, for limits, the limit broken:
// corrupt or truncated data is kDataLoss, a file that is neither JPEG nor PNG (including a
// zero-byte one) is kInvalidArgument, an image over the dimension limit is
// kResourceExhausted (checked from the header, before any pixel memory is allocated).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "ddp/status.h"

namespace ddp::image {

struct DecodeOptions {
  int max_side = 1 << 14;                 // pixels per side
  uint64_t max_pixels = 1ull << 26;       // width * height (64 Mpx = 192 MiB of RGB8)
};

enum class Format { kJpeg, kPng };

struct ImageInfo {
  int width = 0;
  int height = 0;
  Format format = Format::kJpeg;
};

// An RGB8 image, rows packed (stride = 3 * width). After a region decode it holds only
// part of the (possibly DCT-scaled) image: its top-left corner is at (offset_x, offset_y)
// of a full_width x full_height picture.
struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;
  int offset_x = 0;
  int offset_y = 0;
  int full_width = 0;
  int full_height = 0;
};

// A rectangle in full-resolution pixel coordinates.
struct Region {
  int left = 0, top = 0, width = 0, height = 0;
};

// Reads the header only: size and format, with the limits of `options` applied.
Result<ImageInfo> ReadImageInfo(std::string_view data, std::string_view url,
                                const DecodeOptions& options = {});

// Decodes to RGB8. `scale_denom` (1, 2, 4 or 8) asks libjpeg-turbo for a DCT-scaled decode
// of a JPEG (size ceil(w / d) x ceil(h / d)); PNGs ignore it and decode at full size,
// so callers read the actual size from the result. `out` is reused to avoid allocation.
//
// With a `region`, a JPEG may be decoded only as far as needed to cover it: rows above
// are skipped (entropy-decoded, no IDCT/colour work), rows below are never decoded, and
// columns are cropped to the iMCU boundaries around it. Pixels inside the region are the
// same as a full decode's. Files that do not end with an EOI marker (possibly truncated)
// are decoded in full so that truncation is always reported.
Status DecodeImage(std::string_view data, std::string_view url, const DecodeOptions& options,
                   int scale_denom, Image& out, const Region* region = nullptr);

}  // namespace ddp::image
