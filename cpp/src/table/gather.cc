#include "table/gather.h"

#include <algorithm>
#include <cstring>

namespace ddp::table {
namespace {

// Rows copied per task: large enough that a task outweighs its scheduling, small enough
// that a batch spreads over the threads.
constexpr size_t kRowsPerTask = 512;
// Rows ahead whose source lines are prefetched: the picked rows are random, so each is a
// cache miss; asking for the next ones early overlaps the misses.
constexpr size_t kAhead = 12;

inline const uint8_t* Source(const GatherColumn& c, std::span<const int32_t> segment,
                             std::span<const int64_t> row, size_t i) {
  return c.segments[static_cast<size_t>(segment[i])] +
         static_cast<size_t>(row[i]) * c.src_stride + c.src_offset;
}

inline void Prefetch(const GatherColumn& c, std::span<const int32_t> segment,
                     std::span<const int64_t> row, size_t i, size_t end) {
  if (i + kAhead < end) {
    const uint8_t* p = Source(c, segment, row, i + kAhead);
    for (size_t k = 0; k < c.row_bytes; k += 64) __builtin_prefetch(p + k);
    __builtin_prefetch(p + c.row_bytes - 1);
  }
}

template <size_t N>
void CopyFixed(uint8_t* dst, size_t dst_stride, const GatherColumn& c,
               std::span<const int32_t> segment, std::span<const int64_t> row, size_t begin,
               size_t end) {
  for (size_t i = begin; i < end; ++i) {
    Prefetch(c, segment, row, i, end);
    std::memcpy(dst + i * dst_stride, Source(c, segment, row, i), N);
  }
}

void CopyRows(uint8_t* out, size_t out_row_bytes, const GatherColumn& c,
              std::span<const int32_t> segment, std::span<const int64_t> row, size_t begin,
              size_t end) {
  uint8_t* dst = out + c.offset;
  switch (c.row_bytes) {
    case 1: return CopyFixed<1>(dst, out_row_bytes, c, segment, row, begin, end);
    case 2: return CopyFixed<2>(dst, out_row_bytes, c, segment, row, begin, end);
    case 4: return CopyFixed<4>(dst, out_row_bytes, c, segment, row, begin, end);
    case 8: return CopyFixed<8>(dst, out_row_bytes, c, segment, row, begin, end);
    case 16: return CopyFixed<16>(dst, out_row_bytes, c, segment, row, begin, end);
    // Vectors of 8, 16, 32 and 64 float32 (or half as many float64): inline moves, not a
    // call to memcpy per row.
    case 32: return CopyFixed<32>(dst, out_row_bytes, c, segment, row, begin, end);
    case 64: return CopyFixed<64>(dst, out_row_bytes, c, segment, row, begin, end);
    case 128: return CopyFixed<128>(dst, out_row_bytes, c, segment, row, begin, end);
    case 256: return CopyFixed<256>(dst, out_row_bytes, c, segment, row, begin, end);
    default:
      for (size_t i = begin; i < end; ++i) {
        Prefetch(c, segment, row, i, end);
        std::memcpy(dst + i * out_row_bytes, Source(c, segment, row, i), c.row_bytes);
      }
  }
}

}  // namespace

Status ValidateLayout(const GatherLayout& layout) {
  const size_t nseg = layout.segment_rows.size();
  if (layout.segment_names.size() != nseg) {
    return InvalidArgumentError("table gather: " + std::to_string(layout.segment_names.size()) +
                                " segment names for " + std::to_string(nseg) + " segments");
  }
  for (size_t s = 0; s < nseg; ++s) {
    if (layout.segment_rows[s] < 0) {
      return InvalidArgumentError("table gather: " + layout.segment_names[s] +
                                  " has a negative row count");
    }
  }
  std::vector<size_t> covered(layout.output_row_bytes.size(), 0);
  for (const GatherColumn& c : layout.columns) {
    if (c.segments.size() != nseg) {
      return InvalidArgumentError("table gather: column '" + c.name + "' has " +
                                  std::to_string(c.segments.size()) + " buffers for " +
                                  std::to_string(nseg) + " segments");
    }
    if (c.row_bytes == 0) {
      return InvalidArgumentError("table gather: column '" + c.name + "' has empty rows");
    }
    if (c.src_offset + c.row_bytes > c.src_stride) {
      return InvalidArgumentError("table gather: column '" + c.name + "' (" +
                                  std::to_string(c.row_bytes) + " bytes at offset " +
                                  std::to_string(c.src_offset) + ") does not fit in a record of " +
                                  std::to_string(c.src_stride) + " bytes");
    }
    if (c.output >= layout.output_row_bytes.size()) {
      return InvalidArgumentError("table gather: column '" + c.name + "' goes to output " +
                                  std::to_string(c.output) + " of " +
                                  std::to_string(layout.output_row_bytes.size()));
    }
    if (c.offset + c.row_bytes > layout.output_row_bytes[c.output]) {
      return InvalidArgumentError(
          "table gather: column '" + c.name + "' (" + std::to_string(c.row_bytes) +
          " bytes at offset " + std::to_string(c.offset) + ") does not fit in a row of " +
          std::to_string(layout.output_row_bytes[c.output]) + " bytes of output " +
          std::to_string(c.output));
    }
    for (size_t s = 0; s < nseg; ++s) {
      if (c.segments[s] == nullptr && layout.segment_rows[s] > 0) {
        return InvalidArgumentError("table gather: column '" + c.name + "' has no buffer in " +
                                    layout.segment_names[s]);
      }
    }
    covered[c.output] += c.row_bytes;
  }
  for (size_t o = 0; o < covered.size(); ++o) {
    if (covered[o] != layout.output_row_bytes[o]) {
      return InvalidArgumentError("table gather: the columns of output " + std::to_string(o) +
                                  " fill " + std::to_string(covered[o]) + " of its " +
                                  std::to_string(layout.output_row_bytes[o]) + " row bytes");
    }
  }
  return Status::Ok();
}

Status GatherRows(const GatherLayout& layout, std::span<const int32_t> segment,
                  std::span<const int64_t> row, std::span<uint8_t* const> outputs,
                  GatherPool* pool) {
  if (segment.size() != row.size()) {
    return InvalidArgumentError("table gather: " + std::to_string(segment.size()) +
                                " segment indices for " + std::to_string(row.size()) + " rows");
  }
  if (outputs.size() != layout.output_row_bytes.size()) {
    return InvalidArgumentError("table gather: " + std::to_string(outputs.size()) +
                                " output buffers for " +
                                std::to_string(layout.output_row_bytes.size()) + " outputs");
  }
  const size_t n = row.size();
  const size_t nseg = layout.segment_rows.size();
  for (size_t i = 0; i < n; ++i) {
    const int32_t s = segment[i];
    if (s < 0 || static_cast<size_t>(s) >= nseg) {
      return OutOfRangeError("table gather: batch row " + std::to_string(i) + " names segment " +
                             std::to_string(s) + " of " + std::to_string(nseg));
    }
    const int64_t r = row[i];
    if (r < 0 || r >= layout.segment_rows[static_cast<size_t>(s)]) {
      return OutOfRangeError("table gather: batch row " + std::to_string(i) + " reads row " +
                             std::to_string(r) + " of " + layout.segment_names[static_cast<size_t>(s)] +
                             ", which holds " +
                             std::to_string(layout.segment_rows[static_cast<size_t>(s)]) + " rows");
    }
  }
  if (n == 0 || layout.columns.empty()) return Status::Ok();
  const size_t chunks = (n + kRowsPerTask - 1) / kRowsPerTask;
  const size_t tasks = chunks * layout.columns.size();
  auto run = [&](size_t t) {
    const GatherColumn& c = layout.columns[t / chunks];
    const size_t begin = (t % chunks) * kRowsPerTask;
    const size_t end = std::min(n, begin + kRowsPerTask);
    CopyRows(outputs[c.output], layout.output_row_bytes[c.output], c, segment, row, begin, end);
  };
  if (pool != nullptr) DDP_RETURN_IF_ERROR(pool->CheckProcess());
  if (pool == nullptr || tasks == 1) {
    for (size_t t = 0; t < tasks; ++t) run(t);
  } else {
    pool->ParallelFor(tasks, run);
  }
  return Status::Ok();
}

GatherPool::GatherPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { Work(); });
}

GatherPool::~GatherPool() {
  if (!owner_.here()) {
    // A fork()ed child: the workers are the parent's threads (common/process.h).
    Leak(std::move(workers_));
    ForgetWaiters(wake_);
    ForgetWaiters(done_);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

bool GatherPool::RunOne(std::unique_lock<std::mutex>& lock) {
  if (fn_ == nullptr || next_ >= end_) return false;
  const size_t i = next_++;
  const std::function<void(size_t)>* fn = fn_;
  ++running_;
  lock.unlock();
  (*fn)(i);
  lock.lock();
  if (--running_ == 0 && next_ >= end_) done_.notify_all();
  return true;
}

void GatherPool::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    wake_.wait(lock, [&] { return stop_ || (fn_ != nullptr && next_ < end_); });
    if (stop_) return;
    while (RunOne(lock)) {
    }
  }
}

Status GatherPool::CheckProcess() const {
  return owner_.Check("the table's gather pool", "build a new Loader in this process");
}

void GatherPool::ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  std::unique_lock<std::mutex> lock(mu_);
  // One loop at a time: a second caller waits until the pool is free.
  done_.wait(lock, [&] { return fn_ == nullptr; });
  fn_ = &fn;
  next_ = 0;
  end_ = n;
  wake_.notify_all();
  while (RunOne(lock)) {
  }
  done_.wait(lock, [&] { return running_ == 0 && next_ >= end_; });
  fn_ = nullptr;
  done_.notify_all();
}

}  // namespace ddp::table
