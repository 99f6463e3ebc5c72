#include "throughput.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace ddp::bench {

Result<double> DecodeThroughput(std::span<const std::string> blobs, int num_threads, int rounds,
                                int scale_denom) {
  if (num_threads < 1 || rounds < 1) return InvalidArgumentError("num_threads and rounds must be >= 1");
  const size_t total = blobs.size() * static_cast<size_t>(rounds);
  std::atomic<size_t> next{0};
  std::mutex mu;
  Status first_error;
  auto work = [&] {
    image::Image img;
    for (size_t i; (i = next.fetch_add(1)) < total;) {
      const size_t k = i % blobs.size();
      Status s = image::DecodeImage(blobs[k], "blob #" + std::to_string(k), {}, scale_denom, img);
      if (!s.ok()) {
        std::lock_guard<std::mutex> g(mu);
        if (first_error.ok()) first_error = s;
      }
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < num_threads; ++t) threads.emplace_back(work);
  for (auto& t : threads) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!first_error.ok()) return first_error;
  return static_cast<double>(total) / std::max(secs, 1e-9);
}

}  // namespace ddp::bench
