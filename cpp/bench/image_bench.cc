// Micro-benchmarks of the image pipeline's stages on a photo-like 500x375 JPEG (q90):
// full decode, DCT-scaled decode, region decode, and the transform (crop, resize, flip,
// normalise, CHW write) alone, and whole samples over a folder of real JPEGs
// (BM_SampleFiles). Run: build with -DDDP_BUILD_BENCH=ON, then ./image_bench.
#include <benchmark/benchmark.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "image/decode.h"
#include "image/transforms.h"

namespace {

using namespace ddp::image;

// Smooth gradients, a few edges and noise: compresses like a photo at q90.
std::string PhotoJpeg(int w, int h) {
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 3);
  std::mt19937 rng(1);
  std::normal_distribution<float> noise(0, 6);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) {
        float v = 128 + 60 * std::sin(x * 0.03f + c) + 50 * std::cos(y * 0.045f - c) + noise(rng);
        if ((x / 40 + y / 30) % 5 == 0) v += 40;
        px[(static_cast<size_t>(y) * w + x) * 3 + c] = static_cast<uint8_t>(std::clamp(v, 0.f, 255.f));
      }
    }
  }
  tjhandle tj = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  if (tjCompress2(tj, px.data(), w, 0, h, TJPF_RGB, &out, &size, TJSAMP_420, 90, 0) != 0) std::abort();
  std::string s(reinterpret_cast<char*>(out), size);
  tjFree(out);
  tjDestroy(tj);
  return s;
}

const std::string& Jpeg() {
  static const std::string j = PhotoJpeg(500, 375);
  return j;
}

Pipeline Train() {
  TransformOp rrc, flip, tt, norm;
  rrc.kind = OpKind::kRandomResizedCrop;
  rrc.height = rrc.width = 224;
  flip.kind = OpKind::kHorizontalFlip;
  tt.kind = OpKind::kToTensor;
  norm.kind = OpKind::kNormalize;
  norm.mean = {0.485, 0.456, 0.406};
  norm.std = {0.229, 0.224, 0.225};
  return Pipeline::Create({rrc, flip, tt, norm}).value();
}

void BM_DecodeFull(benchmark::State& state) {
  Image img;
  for (auto _ : state) {
    if (!DecodeImage(Jpeg(), "bench", {}, static_cast<int>(state.range(0)), img).ok()) state.SkipWithError("decode");
    benchmark::DoNotOptimize(img.pixels.data());
  }
}
BENCHMARK(BM_DecodeFull)->Arg(1)->Arg(2)->Arg(4);

void BM_DecodeRegion(benchmark::State& state) {
  // A typical RandomResizedCrop box: about half the area, away from the top.
  Region r{100, 120, 280, 200};
  Image img;
  for (auto _ : state) {
    if (!DecodeImage(Jpeg(), "bench", {}, 1, img, &r).ok()) state.SkipWithError("decode");
    benchmark::DoNotOptimize(img.pixels.data());
  }
}
BENCHMARK(BM_DecodeRegion);

void BM_TransformOnly(benchmark::State& state) {
  Pipeline p = Train();
  Image img;
  if (!DecodeImage(Jpeg(), "bench", {}, 1, img).ok()) std::abort();
  std::vector<float> out(3 * 224 * 224);
  uint64_t i = 0;
  for (auto _ : state) {
    Rng rng = Rng::ForSample(0, 0, i++);
    SamplePlan plan = p.Plan(img.width, img.height, rng, false);
    if (!p.Apply(img, plan, out.data()).ok()) state.SkipWithError("apply");
    benchmark::DoNotOptimize(out.data());
  }
}
BENCHMARK(BM_TransformOnly);

void BM_Sample(benchmark::State& state) {
  // What a loader thread does per sample: header, plan, (region) decode, transform.
  Pipeline p = Train();
  Image img;
  std::vector<float> out(3 * 224 * 224);
  const bool region = state.range(0) != 0;
  uint64_t i = 0;
  for (auto _ : state) {
    ImageInfo info = ReadImageInfo(Jpeg(), "bench").value();
    Rng rng = Rng::ForSample(0, 0, i++);
    SamplePlan plan = p.Plan(info.width, info.height, rng, true, region);
    if (!DecodeImage(Jpeg(), "bench", {}, plan.scale_denom, img, plan.region ? &*plan.region : nullptr).ok())
      state.SkipWithError("decode");
    if (!p.Apply(img, plan, out.data()).ok()) state.SkipWithError("apply");
    benchmark::DoNotOptimize(out.data());
  }
}
BENCHMARK(BM_Sample)->Arg(0)->Arg(1);

// The JPEGs under $DDP_IMAGE_BENCH_DIR (e.g. bench_loader.py's --data), read once.
const std::vector<std::string>& DirJpegs() {
  static const std::vector<std::string> blobs = [] {
    std::vector<std::string> out;
    const char* dir = std::getenv("DDP_IMAGE_BENCH_DIR");
    if (dir == nullptr) return out;
    std::vector<std::filesystem::path> paths;
    std::error_code ec;
    for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      if (it->path().extension() == ".jpg") paths.push_back(it->path());
    }
    std::sort(paths.begin(), paths.end());
    for (const auto& p : paths) {
      std::ifstream in(p, std::ios::binary);
      std::ostringstream bytes;
      bytes << in.rdbuf();
      out.push_back(std::move(bytes).str());
    }
    return out;
  }();
  return blobs;
}

// One Loader sample (header, plan with region and scaled decode, decode, transform into
// float CHW), not inlined so that a profiler gives its cost per call: e.g.
//   DDP_IMAGE_BENCH_DIR=/tmp/bench_images valgrind --tool=callgrind image_bench
//       --benchmark_filter=BM_SampleFiles --benchmark_min_time=0.001
// then callgrind_annotate --inclusive=yes: SampleOnce's count over its calls is the
// instructions per image, DecodeImage's and Pipeline::Apply's its two parts.
__attribute__((noinline)) bool SampleOnce(const Pipeline& p, const std::string& jpeg, uint64_t i, Image& img,
                                          float* out) {
  ddp::Result<ImageInfo> info = ReadImageInfo(jpeg, "bench");
  if (!info.ok()) return false;
  Rng rng = Rng::ForSample(0, 0, i);
  const SamplePlan plan = p.Plan(info->width, info->height, rng, true, true);
  if (!DecodeImage(jpeg, "bench", {}, plan.scale_denom, img, plan.region ? &*plan.region : nullptr).ok()) {
    return false;
  }
  return p.Apply(img, plan, out).ok();
}

void BM_SampleFiles(benchmark::State& state) {
  const std::vector<std::string>& blobs = DirJpegs();
  if (blobs.empty()) {
    state.SkipWithError("set DDP_IMAGE_BENCH_DIR to a folder of .jpg files (bench_loader.py --data)");
    return;
  }
  Pipeline p = Train();
  Image img;
  std::vector<float> out(3 * 224 * 224);
  uint64_t i = 0;
  // One iteration is one pass over every file; items/s is images/s.
  for (auto _ : state) {
    for (const std::string& jpeg : blobs) {
      if (!SampleOnce(p, jpeg, i++, img, out.data())) state.SkipWithError("sample");
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(i));
}
BENCHMARK(BM_SampleFiles);

void BM_TransformToUint8(benchmark::State& state) {
  TransformOp rrc, tt;
  rrc.kind = OpKind::kRandomResizedCrop;
  rrc.height = rrc.width = 224;
  tt.kind = OpKind::kPILToTensor;
  rrc.antialias = state.range(0) != 0;
  Pipeline p = Pipeline::Create({rrc, tt}).value();
  Image img;
  if (!DecodeImage(Jpeg(), "bench", {}, 1, img).ok()) std::abort();
  std::vector<uint8_t> out(3 * 224 * 224);
  uint64_t i = 0;
  for (auto _ : state) {
    Rng rng = Rng::ForSample(0, 0, i++);
    SamplePlan plan = p.Plan(img.width, img.height, rng, false);
    if (!p.Apply(img, plan, out.data()).ok()) state.SkipWithError("apply");
    benchmark::DoNotOptimize(out.data());
  }
}
BENCHMARK(BM_TransformToUint8)->Arg(0)->Arg(1);

}  // namespace

BENCHMARK_MAIN();
