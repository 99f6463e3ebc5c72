#include "image/decode.h"

#include <spng.h>
#include <turbojpeg.h>

#include "image/jpeg_region.h"

#include <cstring>
#include <memory>
#include <string>

namespace ddp::image {
namespace {

std::string Url(std::string_view url) { return url.empty() ? std::string("<bytes>") : std::string(url); }

bool IsJpeg(std::string_view d) {
  return d.size() >= 3 && static_cast<uint8_t>(d[0]) == 0xFF && static_cast<uint8_t>(d[1]) == 0xD8 &&
         static_cast<uint8_t>(d[2]) == 0xFF;
}

bool IsPng(std::string_view d) {
  static constexpr uint8_t kSig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  return d.size() >= 8 && std::memcmp(d.data(), kSig, 8) == 0;
}

// One TurboJPEG decompressor per thread: creating one costs more than a small decode.
// TurboJPEG 2.1 leaves a handle in a bad state after a failed call (the next header
// reads as 0x0), so a failure replaces the thread's handle.
struct JpegHolder {
  tjhandle h = tjInitDecompress();
  ~JpegHolder() {
    if (h != nullptr) tjDestroy(h);
  }
};
thread_local JpegHolder jpeg_holder;

tjhandle JpegHandle() { return jpeg_holder.h; }

void ResetJpegHandle() {
  if (jpeg_holder.h != nullptr) tjDestroy(jpeg_holder.h);
  jpeg_holder.h = tjInitDecompress();
}

struct SpngDeleter {
  void operator()(spng_ctx* c) const { spng_ctx_free(c); }
};
using SpngPtr = std::unique_ptr<spng_ctx, SpngDeleter>;

Status CheckLimits(int w, int h, std::string_view url, const DecodeOptions& o) {
  if (w <= 0 || h <= 0) {
    return DataLossError(Url(url) + ": image header declares an empty size " + std::to_string(w) +
                         "x" + std::to_string(h));
  }
  if (w > o.max_side || h > o.max_side) {
    return ResourceExhaustedError(Url(url) + ": image is " + std::to_string(w) + "x" +
                                  std::to_string(h) + " pixels, over the limit of " +
                                  std::to_string(o.max_side) + " per side");
  }
  if (static_cast<uint64_t>(w) * static_cast<uint64_t>(h) > o.max_pixels) {
    return ResourceExhaustedError(Url(url) + ": image is " + std::to_string(w) + "x" +
                                  std::to_string(h) + " pixels, over the limit of " +
                                  std::to_string(o.max_pixels) + " pixels");
  }
  return Status::Ok();
}

Result<ImageInfo> JpegInfo(std::string_view data, std::string_view url, int* colorspace) {
  tjhandle h = JpegHandle();
  if (h == nullptr) return InternalError(Url(url) + ": cannot create a TurboJPEG decompressor");
  int w = 0, ht = 0, subsamp = 0, cs = 0;
  if (tjDecompressHeader3(h, reinterpret_cast<const unsigned char*>(data.data()),
                          static_cast<unsigned long>(data.size()), &w, &ht, &subsamp, &cs) != 0) {
    Status st = DataLossError(Url(url) + ": corrupt JPEG header: " + tjGetErrorStr2(h));
    ResetJpegHandle();
    return st;
  }
  if (colorspace != nullptr) *colorspace = cs;
  return ImageInfo{w, ht, Format::kJpeg};
}

Result<SpngPtr> PngContext(std::string_view data, std::string_view url, spng_ihdr* ihdr) {
  SpngPtr ctx(spng_ctx_new(0));
  if (!ctx) return InternalError(Url(url) + ": cannot create a PNG decoder");
  // Bound memory spent on ancillary chunks (text, ICC, ...) of hostile files.
  int rc = spng_set_chunk_limits(ctx.get(), 16u << 20, 64u << 20);
  if (rc == 0) rc = spng_set_png_buffer(ctx.get(), data.data(), data.size());
  if (rc == 0) rc = spng_get_ihdr(ctx.get(), ihdr);
  if (rc != 0) return DataLossError(Url(url) + ": corrupt PNG header: " + spng_strerror(rc));
  return ctx;
}

Result<ImageInfo> PngInfo(std::string_view data, std::string_view url) {
  spng_ihdr ihdr{};
  DDP_ASSIGN_OR_RETURN(SpngPtr ctx, PngContext(data, url, &ihdr));
  // Widths up to 2^31 are legal PNG; report them as such rather than overflowing int.
  auto clamp = [](uint32_t v) { return v > (1u << 30) ? (1 << 30) : static_cast<int>(v); };
  return ImageInfo{clamp(ihdr.width), clamp(ihdr.height), Format::kPng};
}

// Adobe CMYK JPEGs (what Photoshop and Pillow write) store inverted ink values; libjpeg
// returns them as stored. RGB is then computed exactly as Pillow's CMYK -> RGB conversion
// does (R = (255 - K) - C * (255 - K) / 255, rounded as its MULDIV255), so pixels agree.
void CmykToRgb(const uint8_t* cmyk, size_t n, uint8_t* rgb) {
  for (size_t i = 0; i < n; ++i) {
    const int nk = cmyk[4 * i + 3];  // 255 - K
    for (int c = 0; c < 3; ++c) {
      const int ink = 255 - cmyk[4 * i + c];
      const int t = ink * nk + 128;
      const int v = nk - (((t >> 8) + t) >> 8);
      rgb[3 * i + c] = static_cast<uint8_t>(v < 0 ? 0 : v);
    }
  }
}

Status DecodeJpeg(std::string_view data, std::string_view url, const DecodeOptions& o, int denom,
                  Image& out) {
  int cs = 0;
  DDP_ASSIGN_OR_RETURN(ImageInfo info, JpegInfo(data, url, &cs));
  DDP_RETURN_IF_ERROR(CheckLimits(info.width, info.height, url, o));
  if (denom != 1 && denom != 2 && denom != 4 && denom != 8) {
    return InvalidArgumentError(Url(url) + ": JPEG scale denominator must be 1, 2, 4 or 8, not " +
                                std::to_string(denom));
  }
  const tjscalingfactor sf{1, denom};
  const int w = TJSCALED(info.width, sf);
  const int h = TJSCALED(info.height, sf);
  const bool cmyk = cs == TJCS_CMYK || cs == TJCS_YCCK;
  const size_t npx = static_cast<size_t>(w) * static_cast<size_t>(h);
  out.width = w;
  out.height = h;
  out.pixels.resize(npx * 3);
  std::vector<uint8_t> cmyk_buf;
  unsigned char* dst = out.pixels.data();
  int pf = TJPF_RGB;
  if (cmyk) {
    cmyk_buf.resize(npx * 4);
    dst = cmyk_buf.data();
    pf = TJPF_CMYK;
  }
  tjhandle hd = JpegHandle();
  // LIMITSCANS: refuse progressive JPEGs with absurd scan counts (a decode-time bomb).
  const int flags = TJFLAG_LIMITSCANS;
  if (tjDecompress2(hd, reinterpret_cast<const unsigned char*>(data.data()),
                    static_cast<unsigned long>(data.size()), dst, w, 0, h, pf, flags) != 0) {
    const std::string msg = tjGetErrorStr2(hd);
    const bool warning = tjGetErrorCode(hd) == TJERR_WARNING;
    ResetJpegHandle();
    // TurboJPEG's own words for LIMITSCANS; reported as the region path reports it.
    if (msg.find("more than " + std::to_string(kMaxJpegScans) + " scans") != std::string::npos) {
      return JpegScanLimitError(url);
    }
    // Warnings leave a complete image, except a premature end: the rest is grey filler.
    if (!warning || msg.find("Premature end") != std::string::npos) {
      return DataLossError(Url(url) + ": corrupt or truncated JPEG: " + msg);
    }
  }
  if (cmyk) CmykToRgb(cmyk_buf.data(), npx, out.pixels.data());
  return Status::Ok();
}

Status DecodePng(std::string_view data, std::string_view url, const DecodeOptions& o, Image& out) {
  spng_ihdr ihdr{};
  DDP_ASSIGN_OR_RETURN(SpngPtr ctx, PngContext(data, url, &ihdr));
  const int w = ihdr.width > (1u << 30) ? (1 << 30) : static_cast<int>(ihdr.width);
  const int h = ihdr.height > (1u << 30) ? (1 << 30) : static_cast<int>(ihdr.height);
  DDP_RETURN_IF_ERROR(CheckLimits(w, h, url, o));
  size_t size = 0;
  int rc = spng_decoded_image_size(ctx.get(), SPNG_FMT_RGB8, &size);
  if (rc != 0 || size != static_cast<size_t>(w) * static_cast<size_t>(h) * 3) {
    return DataLossError(Url(url) + ": unsupported PNG layout: " + spng_strerror(rc));
  }
  out.width = w;
  out.height = h;
  out.pixels.resize(size);
  // No SPNG_DECODE_TRNS / GAMMA: alpha and transparency are dropped and no gamma is applied,
  // as Pillow's Image.convert("RGB") does.
  rc = spng_decode_image(ctx.get(), out.pixels.data(), size, SPNG_FMT_RGB8, 0);
  if (rc != 0) return DataLossError(Url(url) + ": corrupt or truncated PNG: " + spng_strerror(rc));
  return Status::Ok();
}

// A complete JPEG ends with the EOI marker; one that does not may be truncated.
bool EndsWithEoi(std::string_view d) {
  return d.size() >= 4 && static_cast<uint8_t>(d[d.size() - 2]) == 0xFF &&
         static_cast<uint8_t>(d[d.size() - 1]) == 0xD9;
}

Status UnknownFormat(std::string_view data, std::string_view url) {
  if (data.empty()) return InvalidArgumentError(Url(url) + ": empty file (0 bytes), not an image");
  return InvalidArgumentError(Url(url) + ": not a JPEG or PNG image (" + std::to_string(data.size()) +
                              " bytes, unknown signature)");
}

}  // namespace

Result<ImageInfo> ReadImageInfo(std::string_view data, std::string_view url, const DecodeOptions& o) {
  Result<ImageInfo> info = IsJpeg(data) ? JpegInfo(data, url, nullptr)
                           : IsPng(data) ? PngInfo(data, url)
                                         : Result<ImageInfo>(UnknownFormat(data, url));
  if (!info.ok()) return info;
  DDP_RETURN_IF_ERROR(CheckLimits(info->width, info->height, url, o));
  return info;
}

Status DecodeImage(std::string_view data, std::string_view url, const DecodeOptions& o,
                   int scale_denom, Image& out, const Region* region) {
  out.offset_x = out.offset_y = 0;
  if (IsJpeg(data)) {
    if (region != nullptr && EndsWithEoi(data)) {
      if (scale_denom != 1 && scale_denom != 2 && scale_denom != 4 && scale_denom != 8) {
        return InvalidArgumentError(Url(url) + ": JPEG scale denominator must be 1, 2, 4 or 8, not " +
                                    std::to_string(scale_denom));
      }
      return DecodeJpegRegion(data, url, o, scale_denom, *region, out);
    }
    DDP_RETURN_IF_ERROR(DecodeJpeg(data, url, o, scale_denom, out));
    out.full_width = out.width;
    out.full_height = out.height;
    return Status::Ok();
  }
  if (IsPng(data)) {
    DDP_RETURN_IF_ERROR(DecodePng(data, url, o, out));
    out.full_width = out.width;
    out.full_height = out.height;
    return Status::Ok();
  }
  return UnknownFormat(data, url);
}

}  // namespace ddp::image
