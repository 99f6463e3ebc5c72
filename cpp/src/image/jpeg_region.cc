#include "image/jpeg_region.h"

#include <csetjmp>
#include <cstdio>
#include <string>
#include <vector>

// jpeglib.h needs FILE and size_t declared first.
#include <jerror.h>
#include <jpeglib.h>

namespace ddp::image {
namespace {

struct ErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool premature_end;
  bool too_many_scans;
};

// libjpeg calls this while it absorbs a multi-scan file (and per row): past the scan
// limit it leaves through the error handler's jump, as TJFLAG_LIMITSCANS does.
void CheckScans(j_common_ptr cinfo) {
  if (cinfo->is_decompressor &&
      reinterpret_cast<j_decompress_ptr>(cinfo)->input_scan_number > kMaxJpegScans) {
    auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
    err->too_many_scans = true;
    std::longjmp(err->jump, 1);
  }
}

[[noreturn]] void ErrorExit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void EmitMessage(j_common_ptr cinfo, int level) {
  // Level -1 is a warning. Most are benign (extraneous bytes); a premature end is not.
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    reinterpret_cast<ErrorManager*>(cinfo->err)->premature_end = true;
  }
}

enum class Outcome { kOk, kCorrupt, kTruncated, kTooLarge, kTooManyScans };

struct Job {
  const unsigned char* data;
  unsigned long size;
  int denom;
  Region region;
  int max_side;
  unsigned long long max_pixels;
  Image* out;
  std::vector<uint8_t>* cmyk_row;
  bool cmyk;
  int width, height;  // full-resolution size, for limit messages
  char message[JMSG_LENGTH_MAX];
};

// Plain C control flow only: longjmp from libjpeg's error handler lands here, so no
// object with a destructor may live in this frame.
Outcome Run(Job& job) {
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  jpeg_progress_mgr progress{};
  progress.progress_monitor = CheckScans;
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = ErrorExit;
  err.pub.emit_message = EmitMessage;
  err.premature_end = false;
  err.too_many_scans = false;
  err.message[0] = '\0';
  if (setjmp(err.jump)) {
    std::snprintf(job.message, sizeof(job.message), "%s", err.message);
    jpeg_destroy_decompress(&cinfo);
    return err.too_many_scans ? Outcome::kTooManyScans : Outcome::kCorrupt;
  }
  jpeg_create_decompress(&cinfo);
  cinfo.progress = &progress;
  jpeg_mem_src(&cinfo, job.data, job.size);
  jpeg_read_header(&cinfo, TRUE);
  job.width = static_cast<int>(cinfo.image_width);
  job.height = static_cast<int>(cinfo.image_height);
  if (job.width > job.max_side || job.height > job.max_side ||
      static_cast<unsigned long long>(job.width) * job.height > job.max_pixels) {
    jpeg_destroy_decompress(&cinfo);
    return Outcome::kTooLarge;
  }
  job.cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = job.cmyk ? JCS_CMYK : JCS_RGB;
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned>(job.denom);
  cinfo.dct_method = JDCT_ISLOW;  // as PIL and our TurboJPEG path: identical pixels
  jpeg_start_decompress(&cinfo);
  const auto full_w = static_cast<int>(cinfo.output_width);
  const auto full_h = static_cast<int>(cinfo.output_height);
  const int d = job.denom;
  auto clampi = [](int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); };
  // A margin of 2 output pixels on each side: fancy chroma upsampling reads one
  // neighbouring chroma sample, so the region's pixels then equal a full decode's
  // (Decode.RegionDecodeIsExactForEverySubsamplingAndScale: every subsampling, scale and
  // progressive mode; it fails with no margin). libjpeg widens the columns to whole iMCUs
  // itself. The margin was 16 (one iMCU), decoding up to 30% more of a 224-px crop.
  constexpr int kMargin = 2;
  int x0 = clampi(job.region.left / d - kMargin, 0, full_w - 1);
  int x1 = clampi((job.region.left + job.region.width + d - 1) / d + kMargin, x0 + 1, full_w);
  int y0 = clampi(job.region.top / d - kMargin, 0, full_h - 1);
  int y1 = clampi((job.region.top + job.region.height + d - 1) / d + kMargin, y0 + 1, full_h);
  JDIMENSION xoff = static_cast<JDIMENSION>(x0), cw = static_cast<JDIMENSION>(x1 - x0);
  if (static_cast<int>(cw) < full_w) jpeg_crop_scanline(&cinfo, &xoff, &cw);
  if (y0 > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(y0));
  Image& out = *job.out;
  out.width = static_cast<int>(cinfo.output_width);
  out.height = y1 - y0;
  out.offset_x = static_cast<int>(xoff);
  out.offset_y = y0;
  out.full_width = full_w;
  out.full_height = full_h;
  out.pixels.resize(static_cast<size_t>(out.width) * out.height * 3);
  if (job.cmyk) job.cmyk_row->resize(static_cast<size_t>(out.width) * 4);
  for (int y = 0; y < out.height; ++y) {
    uint8_t* dst = out.pixels.data() + static_cast<size_t>(y) * out.width * 3;
    JSAMPROW row = job.cmyk ? job.cmyk_row->data() : dst;
    if (jpeg_read_scanlines(&cinfo, &row, 1) != 1) {
      jpeg_destroy_decompress(&cinfo);
      return Outcome::kTruncated;
    }
    if (job.cmyk) {
      // Same conversion as decode.cc (Pillow's formula on Adobe-inverted CMYK).
      const uint8_t* c = job.cmyk_row->data();
      for (int x = 0; x < out.width; ++x) {
        const int nk = c[4 * x + 3];
        for (int k = 0; k < 3; ++k) {
          const int t = (255 - c[4 * x + k]) * nk + 128;
          const int v = nk - (((t >> 8) + t) >> 8);
          dst[3 * x + k] = static_cast<uint8_t>(v < 0 ? 0 : v);
        }
      }
    }
  }
  const bool premature = err.premature_end;
  jpeg_abort_decompress(&cinfo);  // the rows below the region are never decoded
  jpeg_destroy_decompress(&cinfo);
  return premature ? Outcome::kTruncated : Outcome::kOk;
}

}  // namespace

Status JpegScanLimitError(std::string_view url) {
  return ResourceExhaustedError((url.empty() ? std::string("<bytes>") : std::string(url)) +
                                ": progressive JPEG has more than " + std::to_string(kMaxJpegScans) +
                                " scans, over the limit of " + std::to_string(kMaxJpegScans));
}

Status DecodeJpegRegion(std::string_view data, std::string_view url, const DecodeOptions& options,
                        int scale_denom, const Region& region, Image& out) {
  thread_local std::vector<uint8_t> cmyk_row;
  Job job{};
  job.data = reinterpret_cast<const unsigned char*>(data.data());
  job.size = static_cast<unsigned long>(data.size());
  job.denom = scale_denom;
  job.region = region;
  job.max_side = options.max_side;
  job.max_pixels = options.max_pixels;
  job.out = &out;
  job.cmyk_row = &cmyk_row;
  const std::string u = url.empty() ? std::string("<bytes>") : std::string(url);
  switch (Run(job)) {
    case Outcome::kOk:
      return Status::Ok();
    case Outcome::kCorrupt:
      return DataLossError(u + ": corrupt JPEG: " + job.message);
    case Outcome::kTruncated:
      return DataLossError(u + ": corrupt or truncated JPEG: Premature end of JPEG file");
    case Outcome::kTooManyScans:
      return JpegScanLimitError(url);
    case Outcome::kTooLarge:
      return ResourceExhaustedError(u + ": image is " + std::to_string(job.width) + "x" +
                                    std::to_string(job.height) + " pixels, over the limit of " +
                                    std::to_string(options.max_side) + " per side or " +
                                    std::to_string(options.max_pixels) + " pixels");
  }
  return InternalError(u + ": unreachable");
}

}  // namespace ddp::image
