// Test helpers: real JPEG and PNG files made by the real encoders.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::image::testing {

// A smooth, non-trivial RGB8 pattern (gradients plus a diagonal), w x h.
std::vector<uint8_t> Pattern(int w, int h, int channels = 3);

// JPEG via TurboJPEG. channels: 1 (gray), 3 (RGB) or 4 (CMYK). subsamp: a TJSAMP_*
// value, or -1 for 4:2:0 (colour) / gray.
std::string EncodeJpeg(const std::vector<uint8_t>& px, int w, int h, int channels, int quality = 95,
                       bool progressive = false, int subsamp = -1);

// A grayscale progressive JPEG with 1 + 63 * (max_al + 1) scans (libjpeg with a custom
// scan script: each AC coefficient in its own band, refined bit by bit from `max_al`;
// max_al <= 10), e.g. 694 scans for max_al = 10: a legal file with a hostile scan count.
std::string EncodeJpegManyScans(const std::vector<uint8_t>& gray, int w, int h, int max_al);

// PNG via libspng. color_type: 0 gray, 2 RGB, 6 RGBA (8-bit).
std::string EncodePng(const std::vector<uint8_t>& px, int w, int h, int color_type);

}  // namespace ddp::image::testing
