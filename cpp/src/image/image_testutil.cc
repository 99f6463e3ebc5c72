#include "image/image_testutil.h"

#include <spng.h>
#include <turbojpeg.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>

namespace ddp::image::testing {

std::vector<uint8_t> Pattern(int w, int h, int channels) {
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * channels);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < channels; ++c) {
        const int v = (x * 255 / std::max(w - 1, 1)) * (c == 0) + (y * 255 / std::max(h - 1, 1)) * (c == 1) +
                      ((x + y) * 255 / std::max(w + h - 2, 1)) * (c >= 2);
        px[(static_cast<size_t>(y) * w + x) * channels + c] = static_cast<uint8_t>(v);
      }
    }
  }
  return px;
}

std::string EncodeJpeg(const std::vector<uint8_t>& px, int w, int h, int channels, int quality,
                       bool progressive, int subsamp) {
  tjhandle tj = tjInitCompress();
  if (tj == nullptr) throw std::runtime_error("tjInitCompress failed");
  const int pf = channels == 1 ? TJPF_GRAY : channels == 4 ? TJPF_CMYK : TJPF_RGB;
  if (subsamp < 0) subsamp = channels == 1 ? TJSAMP_GRAY : TJSAMP_420;
  unsigned char* out = nullptr;
  unsigned long size = 0;
  const int flags = progressive ? TJFLAG_PROGRESSIVE : 0;
  if (tjCompress2(tj, px.data(), w, 0, h, pf, &out, &size, subsamp, quality, flags) != 0) {
    std::string err = tjGetErrorStr2(tj);
    tjDestroy(tj);
    throw std::runtime_error("tjCompress2: " + err);
  }
  std::string s(reinterpret_cast<char*>(out), size);
  tjFree(out);
  tjDestroy(tj);
  return s;
}

std::string EncodeJpegManyScans(const std::vector<uint8_t>& gray, int w, int h, int max_al) {
  std::vector<jpeg_scan_info> scans;
  scans.push_back({1, {0, 0, 0, 0}, 0, 0, 0, 0});  // DC
  for (int k = 1; k < 64; ++k) {
    scans.push_back({1, {0, 0, 0, 0}, k, k, 0, max_al});
    for (int a = max_al; a >= 1; --a) scans.push_back({1, {0, 0, 0, 0}, k, k, a, a - 1});
  }
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);  // errors exit(): fine for a test helper given valid input
  jpeg_create_compress(&c);
  unsigned char* out = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &out, &size);
  c.image_width = static_cast<JDIMENSION>(w);
  c.image_height = static_cast<JDIMENSION>(h);
  c.input_components = 1;
  c.in_color_space = JCS_GRAYSCALE;
  jpeg_set_defaults(&c);
  c.scan_info = scans.data();
  c.num_scans = static_cast<int>(scans.size());
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(gray.data() + static_cast<size_t>(c.next_scanline) * w);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  std::string s(reinterpret_cast<char*>(out), size);
  free(out);
  return s;
}

std::string EncodePng(const std::vector<uint8_t>& px, int w, int h, int color_type) {
  spng_ctx* ctx = spng_ctx_new(SPNG_CTX_ENCODER);
  spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{};
  ihdr.width = static_cast<uint32_t>(w);
  ihdr.height = static_cast<uint32_t>(h);
  ihdr.bit_depth = 8;
  ihdr.color_type = static_cast<uint8_t>(color_type);
  spng_set_ihdr(ctx, &ihdr);
  int rc = spng_encode_image(ctx, px.data(), px.size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
  if (rc != 0) {
    spng_ctx_free(ctx);
    throw std::runtime_error(std::string("spng_encode_image: ") + spng_strerror(rc));
  }
  size_t len = 0;
  int err = 0;
  void* buf = spng_get_png_buffer(ctx, &len, &err);
  std::string s(static_cast<char*>(buf), len);
  free(buf);
  spng_ctx_free(ctx);
  return s;
}

}  // namespace ddp::image::testing
