// Region-limited JPEG decode with the libjpeg API (jpeg_crop_scanline and
// jpeg_skip_scanlines, which TurboJPEG 2.1 does not expose). See DecodeImage.
#pragma once

#include <string_view>

#include "ddp/status.h"
#include "image/decode.h"

namespace ddp::image {

Status DecodeJpegRegion(std::string_view data, std::string_view url, const DecodeOptions& options,
                        int scale_denom, const Region& region, Image& out);

}  // namespace ddp::image
