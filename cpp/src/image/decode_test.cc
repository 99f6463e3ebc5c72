#include "image/decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include <turbojpeg.h>

#include "image/image_testutil.h"

namespace ddp::image {
namespace {

using testing::EncodeJpeg;
using testing::EncodePng;
using testing::Pattern;

double MeanAbsDiff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += std::abs(int(a[i]) - int(b[i]));
  return s / static_cast<double>(a.size());
}

TEST(Decode, JpegRgbMatchesSourceWithinJpegLoss) {
  auto px = Pattern(97, 61);
  std::string jpg = EncodeJpeg(px, 97, 61, 3, 95);
  auto info = ReadImageInfo(jpg, "mem://a.jpg");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->width, 97);
  EXPECT_EQ(info->height, 61);
  EXPECT_EQ(info->format, Format::kJpeg);
  Image img;
  ASSERT_TRUE(DecodeImage(jpg, "mem://a.jpg", {}, 1, img).ok());
  ASSERT_EQ(img.width, 97);
  ASSERT_EQ(img.height, 61);
  EXPECT_LT(MeanAbsDiff(img.pixels, px), 3.0);
}

TEST(Decode, ScaledDecodeHalvesSize) {
  auto px = Pattern(200, 101);
  std::string jpg = EncodeJpeg(px, 200, 101, 3);
  Image img;
  ASSERT_TRUE(DecodeImage(jpg, "x", {}, 2, img).ok());
  EXPECT_EQ(img.width, 100);
  EXPECT_EQ(img.height, 51);
  ASSERT_TRUE(DecodeImage(jpg, "x", {}, 8, img).ok());
  EXPECT_EQ(img.width, 25);
  EXPECT_EQ(img.height, 13);
  EXPECT_EQ(DecodeImage(jpg, "x", {}, 3, img).code(), Code::kInvalidArgument);
}

TEST(Decode, GrayAndProgressiveJpegBecomeRgb) {
  auto g = Pattern(40, 30, 1);
  Image img;
  ASSERT_TRUE(DecodeImage(EncodeJpeg(g, 40, 30, 1), "g", {}, 1, img).ok());
  ASSERT_EQ(img.pixels.size(), 40u * 30 * 3);
  for (size_t i = 0; i < 40 * 30; ++i) {
    EXPECT_EQ(img.pixels[3 * i], img.pixels[3 * i + 1]);
    EXPECT_EQ(img.pixels[3 * i], img.pixels[3 * i + 2]);
  }
  auto px = Pattern(64, 48);
  Image base, prog;
  ASSERT_TRUE(DecodeImage(EncodeJpeg(px, 64, 48, 3, 90, false), "b", {}, 1, base).ok());
  ASSERT_TRUE(DecodeImage(EncodeJpeg(px, 64, 48, 3, 90, true), "p", {}, 1, prog).ok());
  EXPECT_LT(MeanAbsDiff(base.pixels, prog.pixels), 1.0);
}

TEST(Decode, CmykJpegConvertsToRgb) {
  // TurboJPEG stores CMYK as given; a pixel of (0,0,0,0) ink decodes to white under the
  // Adobe (inverted) convention our decoder assumes when stored values are 255.
  std::vector<uint8_t> cmyk(16 * 16 * 4, 255);
  Image img;
  ASSERT_TRUE(DecodeImage(EncodeJpeg(cmyk, 16, 16, 4), "c", {}, 1, img).ok());
  ASSERT_EQ(img.pixels.size(), 16u * 16 * 3);
  for (uint8_t v : img.pixels) EXPECT_GE(v, 250);
}

TEST(Decode, PngVariants) {
  auto rgb = Pattern(33, 17);
  Image img;
  ASSERT_TRUE(DecodeImage(EncodePng(rgb, 33, 17, 2), "rgb.png", {}, 1, img).ok());
  EXPECT_EQ(img.pixels, rgb);
  auto rgba = Pattern(33, 17, 4);
  ASSERT_TRUE(DecodeImage(EncodePng(rgba, 33, 17, 6), "rgba.png", {}, 4, img).ok());
  ASSERT_EQ(img.width, 33);  // PNG ignores the scale
  for (size_t i = 0; i < 33 * 17; ++i) {
    for (int c = 0; c < 3; ++c) EXPECT_EQ(img.pixels[3 * i + c], rgba[4 * i + c]);
  }
  auto g = Pattern(5, 7, 1);
  ASSERT_TRUE(DecodeImage(EncodePng(g, 5, 7, 0), "g.png", {}, 1, img).ok());
  for (size_t i = 0; i < 35; ++i) EXPECT_EQ(img.pixels[3 * i + 2], g[i]);
}

TEST(Decode, BadInputsNameTheUrl) {
  Image img;
  Status s = DecodeImage("", "s3://b/empty.jpg", {}, 1, img);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("s3://b/empty.jpg"), std::string::npos);
  EXPECT_NE(s.message().find("0 bytes"), std::string::npos);

  s = DecodeImage("hello world", "file:///x.jpg", {}, 1, img);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);

  std::string jpg = EncodeJpeg(Pattern(64, 64), 64, 64, 3);
  s = DecodeImage(std::string_view(jpg).substr(0, jpg.size() / 2), "t.jpg", {}, 1, img);
  EXPECT_EQ(s.code(), Code::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find("t.jpg"), std::string::npos);

  std::string png = EncodePng(Pattern(64, 64), 64, 64, 2);
  s = DecodeImage(std::string_view(png).substr(0, png.size() - 20), "t.png", {}, 1, img);
  EXPECT_EQ(s.code(), Code::kDataLoss) << s.ToString();

  std::string corrupt = jpg;
  for (size_t i = 200; i < corrupt.size() - 2; i += 7) corrupt[i] = static_cast<char>(0xFF);
  s = DecodeImage(corrupt, "c.jpg", {}, 1, img);
  EXPECT_FALSE(s.ok());
}

TEST(Decode, RegionDecodeEqualsFullDecodeInsideTheRegion) {
  const int W = 257, H = 191;
  for (bool progressive : {false, true}) {
    std::string jpg = EncodeJpeg(Pattern(W, H), W, H, 3, 90, progressive);
    Image full, part;
    ASSERT_TRUE(DecodeImage(jpg, "f", {}, 1, full).ok());
    for (Region r : {Region{60, 70, 100, 50}, Region{0, 0, 30, 20}, Region{200, 150, 57, 41}}) {
      ASSERT_TRUE(DecodeImage(jpg, "r", {}, 1, part, &r).ok());
      EXPECT_EQ(part.full_width, W);
      EXPECT_EQ(part.full_height, H);
      ASSERT_LE(part.offset_x, r.left);
      ASSERT_LE(part.offset_y, r.top);
      ASSERT_GE(part.offset_x + part.width, r.left + r.width);
      ASSERT_GE(part.offset_y + part.height, r.top + r.height);
      EXPECT_LT(part.height, H - 10);  // rows below were not decoded
      for (int y = r.top; y < r.top + r.height; ++y) {
        for (int x = r.left; x < r.left + r.width; ++x) {
          for (int c = 0; c < 3; ++c) {
            const auto a = full.pixels[(static_cast<size_t>(y) * W + x) * 3 + c];
            const auto b = part.pixels[(static_cast<size_t>(y - part.offset_y) * part.width +
                                        (x - part.offset_x)) * 3 + c];
            ASSERT_EQ(a, b) << "progressive=" << progressive << " at " << x << "," << y;
          }
        }
      }
    }
  }
  // Without an EOI marker (maybe truncated) the region path is not taken: full decode
  // reports the truncation even when the region itself is intact.
  std::string jpg = EncodeJpeg(Pattern(W, H), W, H, 3, 90);
  Region top{0, 0, 10, 10};
  Image img;
  EXPECT_EQ(DecodeImage(std::string_view(jpg).substr(0, jpg.size() * 3 / 4), "cut", {}, 1, img, &top).code(),
            Code::kDataLoss);
}

// The region decode keeps a margin of only 2 pixels around the region (chroma upsampling
// reads one neighbouring chroma sample): its pixels must still equal a full decode's, for
// every chroma subsampling, DCT scale and progressive mode, on noisy pixels (where any
// upsampling difference shows), at regions touching every edge.
TEST(Decode, RegionDecodeIsExactForEverySubsamplingAndScale) {
  const int W = 211, H = 173;
  std::vector<uint8_t> px(static_cast<size_t>(3) * W * H);
  uint32_t state = 12345;
  for (auto& v : px) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<uint8_t>(state >> 24);
  }
  std::vector<uint8_t> gray(static_cast<size_t>(W) * H);
  for (size_t i = 0; i < gray.size(); ++i) gray[i] = px[3 * i];
  uint32_t pick = 7;
  auto next = [&](int n) {
    pick = pick * 1664525u + 1013904223u;
    return static_cast<int>((pick >> 8) % static_cast<uint32_t>(n));
  };
  int checked = 0;
  for (int samp : {TJSAMP_420, TJSAMP_422, TJSAMP_444, TJSAMP_440, TJSAMP_411, TJSAMP_GRAY}) {
    for (bool progressive : {false, true}) {
      const bool is_gray = samp == TJSAMP_GRAY;
      const std::string jpg = EncodeJpeg(is_gray ? gray : px, W, H, is_gray ? 1 : 3, 90, progressive, samp);
      for (int denom : {1, 2, 4, 8}) {
        Image full, part;
        ASSERT_TRUE(DecodeImage(jpg, "f", {}, denom, full).ok());
        for (int k = 0; k < 12; ++k) {
          Region r;
          r.width = 1 + next(W / 2);
          r.height = 1 + next(H / 2);
          // Corners and edges first, then anywhere.
          r.left = k % 4 == 0 ? 0 : k % 4 == 1 ? W - r.width : next(W - r.width + 1);
          r.top = k % 4 == 0 ? 0 : k % 4 == 1 ? H - r.height : next(H - r.height + 1);
          ASSERT_TRUE(DecodeImage(jpg, "r", {}, denom, part, &r).ok());
          const int x0 = r.left / denom, y0 = r.top / denom;
          const int x1 = std::min(full.width, (r.left + r.width + denom - 1) / denom);
          const int y1 = std::min(full.height, (r.top + r.height + denom - 1) / denom);
          for (int y = y0; y < y1; ++y) {
            for (int x = x0; x < x1; ++x) {
              ASSERT_TRUE(y >= part.offset_y && x >= part.offset_x && y - part.offset_y < part.height &&
                          x - part.offset_x < part.width)
                  << "pixel " << x << "," << y << " not decoded";
              for (int c = 0; c < 3; ++c) {
                ASSERT_EQ(full.pixels[(static_cast<size_t>(y) * full.width + x) * 3 + c],
                          part.pixels[(static_cast<size_t>(y - part.offset_y) * part.width +
                                       (x - part.offset_x)) * 3 + c])
                    << "subsampling " << samp << " progressive " << progressive << " 1/" << denom
                    << " region " << r.left << "," << r.top << " " << r.width << "x" << r.height << " at "
                    << x << "," << y;
              }
            }
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 6 * 2 * 4 * 12);
}

// A progressive JPEG with 694 scans: both decode paths refuse it at the same limit
// (the region path used to decode it, however many scans, burning the thread).
TEST(Decode, ScanLimitOnFullAndRegionPaths) {
  const int w = 64, h = 48;
  std::string bomb = testing::EncodeJpegManyScans(Pattern(w, h, 1), w, h, 10);
  const Region region{8, 8, 32, 24};
  Image img;
  for (const Region* r : {static_cast<const Region*>(nullptr), &region}) {
    for (int denom : {1, 2}) {
      Status st = DecodeImage(bomb, "mem://scans.jpg", {}, denom, img, r);
      EXPECT_EQ(st.code(), Code::kResourceExhausted) << st.ToString();
      EXPECT_NE(st.message().find("mem://scans.jpg"), std::string::npos) << st.ToString();
      EXPECT_NE(st.message().find("more than 500 scans, over the limit of 500"), std::string::npos)
          << st.ToString();
    }
  }
  // The same scan script with fewer scans (316) decodes on both paths, to equal pixels.
  std::string fine = testing::EncodeJpegManyScans(Pattern(w, h, 1), w, h, 4);
  Image full, part;
  ASSERT_TRUE(DecodeImage(fine, "mem://fine.jpg", {}, 1, full).ok());
  Status st = DecodeImage(fine, "mem://fine.jpg", {}, 1, part, &region);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(full.width, w);
  for (int y = region.top; y < region.top + region.height; ++y) {
    for (int x = region.left; x < region.left + region.width; ++x) {
      for (int c = 0; c < 3; ++c) {
        const size_t fi = (static_cast<size_t>(y) * full.width + x) * 3 + c;
        const size_t pi = (static_cast<size_t>(y - part.offset_y) * part.width + (x - part.offset_x)) * 3 + c;
        ASSERT_EQ(full.pixels[fi], part.pixels[pi]) << x << "," << y;
      }
    }
  }
}

TEST(Decode, DimensionLimit) {
  DecodeOptions o;
  o.max_side = 50;
  std::string jpg = EncodeJpeg(Pattern(64, 20), 64, 20, 3);
  Image img;
  Status s = DecodeImage(jpg, "big.jpg", o, 1, img);
  EXPECT_EQ(s.code(), Code::kResourceExhausted);
  EXPECT_NE(s.message().find("big.jpg"), std::string::npos);
  EXPECT_NE(s.message().find("64x20"), std::string::npos);
  EXPECT_EQ(ReadImageInfo(EncodePng(Pattern(20, 64), 20, 64, 2), "big.png", o).status().code(),
            Code::kResourceExhausted);
}

}  // namespace
}  // namespace ddp::image
