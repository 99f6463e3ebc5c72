// Region-limited JPEG decode with the libjpeg API (jpeg_crop_scanline and
// jpeg_skip_scanlines, which TurboJPEG 2.1 does not expose). See DecodeImage.
#pragma once

#include <string_view>

#include "ddp/status.h"
#include "image/decode.h"

namespace ddp::image {

// The most scans a progressive JPEG may have, on every decode path: TurboJPEG's
// TJFLAG_LIMITSCANS limit (a file with thousands of scans is a decode-time bomb).
inline constexpr int kMaxJpegScans = 500;

// kResourceExhausted naming `url` and kMaxJpegScans.
Status JpegScanLimitError(std::string_view url);

Status DecodeJpegRegion(std::string_view data, std::string_view url, const DecodeOptions& options,
                        int scale_denom, const Region& region, Image& out);

}  // namespace ddp::image
