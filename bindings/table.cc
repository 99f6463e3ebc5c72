// Bindings of the table gather: dask_ddp._core.GatherPool (the gather's threads),
// TableWindow (the column buffers of the segments a rank holds, gathered into batches),
// TableBatches (an epoch's batches gathered ahead on the engine's thread), and the host
// cache's files (map_records, write_records, HostLock: table/host_cache.h).
//
// A window keeps its source arrays alive (the shared-memory mappings of the partitions'
// rows); each gather copies the picked rows into new buffers (TableBatches: into buffers
// the caller lent while one is free) with the GIL released, which cross to torch through
// DLPack without a copy (the tensor holds its buffer, or its share of the lent one).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <deque>
#include <memory>
#include <optional>

#include "convert.h"
#include "errors.h"
#include "table/batch_stream.h"
#include "table/gather.h"
#include "table/host_cache.h"
#include "table/pack.h"
#include "table/plan.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ddp::py {
namespace {

using Bytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
// (name, row bytes, record bytes, offset in the record, output, offset in the output row,
//  the records of each segment)
using ColumnSpec =
    std::tuple<std::string, size_t, size_t, size_t, size_t, size_t, std::vector<Bytes>>;
// (DLPack type code, bits, shape after the batch dimension, row bytes)
using OutputSpec = std::tuple<uint8_t, uint8_t, std::vector<size_t>, size_t>;

struct Output {
  nb::dlpack::dtype dtype;
  std::vector<size_t> tail;
  size_t row_bytes;
};

std::vector<Output> MakeOutputs(std::vector<OutputSpec>& specs) {
  std::vector<Output> outputs;
  for (OutputSpec& o : specs) {
    outputs.push_back({nb::dlpack::dtype{std::get<0>(o), std::get<1>(o), 1},
                       std::move(std::get<2>(o)), std::get<3>(o)});
  }
  return outputs;
}

// A torch tensor of n rows holding `data` (its own block, or a lent buffer's part: the
// buffer goes back to the stream once every tensor of its batch is freed).
nb::object ToTensor(std::shared_ptr<uint8_t[]> buffer, const Output& o, size_t n) {
  std::vector<size_t> shape{n};
  shape.insert(shape.end(), o.tail.begin(), o.tail.end());
  uint8_t* data = buffer.get();
  return nb::ndarray<nb::pytorch>(data, shape.size(), shape.data(), OwnerOf(std::move(buffer)),
                                  nullptr, o.dtype)
      .cast();
}

using Int32s = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Int64s = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

class TableWindow {
 public:
  TableWindow(std::vector<ColumnSpec> columns, std::vector<std::string> segment_names,
              std::vector<int64_t> segment_rows, std::vector<OutputSpec> outputs)
      : outputs_(MakeOutputs(outputs)) {
    auto layout = std::make_shared<table::GatherLayout>();
    layout->segment_names = std::move(segment_names);
    layout->segment_rows = std::move(segment_rows);
    for (const Output& o : outputs_) layout->output_row_bytes.push_back(o.row_bytes);
    for (ColumnSpec& c : columns) {
      table::GatherColumn col;
      col.name = std::get<0>(c);
      col.row_bytes = std::get<1>(c);
      col.src_stride = std::get<2>(c);
      col.src_offset = std::get<3>(c);
      col.output = std::get<4>(c);
      col.offset = std::get<5>(c);
      const std::vector<Bytes>& buffers = std::get<6>(c);
      for (size_t s = 0; s < buffers.size(); ++s) {
        const size_t need = s < layout->segment_rows.size()
                                ? static_cast<size_t>(std::max<int64_t>(layout->segment_rows[s], 0)) * col.src_stride
                                : 0;
        if (buffers[s].size() < need) {
          ThrowIfError(InvalidArgumentError(
              "table window: column '" + col.name + "' has " + std::to_string(buffers[s].size()) +
              " bytes in " + (s < layout->segment_names.size() ? layout->segment_names[s] : "?") +
              ", which needs " + std::to_string(need)));
        }
        col.segments.push_back(buffers[s].data());
      }
      keep_.push_back(buffers);
      layout->columns.push_back(std::move(col));
    }
    ThrowIfError(table::ValidateLayout(*layout));
    layout_ = std::move(layout);
  }

  nb::list Gather(table::GatherPool& pool, Int32s segment, Int64s row) {
    const size_t n = row.shape(0);
    std::vector<std::unique_ptr<uint8_t[]>> buffers;
    std::vector<uint8_t*> outs;
    for (const Output& o : outputs_) {
      buffers.emplace_back(new uint8_t[std::max<size_t>(1, n * o.row_bytes)]);
      outs.push_back(buffers.back().get());
    }
    Status status;
    {
      nb::gil_scoped_release release;
      status = table::GatherRows(*layout_, {segment.data(), segment.shape(0)}, {row.data(), n},
                                 outs, &pool);
    }
    ThrowIfError(status);
    nb::list result;
    for (size_t i = 0; i < outputs_.size(); ++i) {
      result.append(ToTensor(std::move(buffers[i]), outputs_[i], n));
    }
    return result;
  }

  size_t num_segments() const { return layout_->segment_rows.size(); }
  const std::shared_ptr<const table::GatherLayout>& layout() const { return layout_; }

 private:
  std::shared_ptr<const table::GatherLayout> layout_;
  std::vector<Output> outputs_;
  std::vector<std::vector<Bytes>> keep_;
};

// How TableBatches hands out a batch: the list of its tensors, a dict by output name, the
// one tensor x, or the pair (x, y).
enum class Form { kList, kDict, kX, kXY };

class TableBatches {
 public:
  TableBatches(nb::object pool, std::vector<OutputSpec> outputs, std::vector<std::string> names,
               const std::string& form, size_t batch_size, size_t prefetch, size_t max_jobs,
               bool ahead)
      : outputs_(MakeOutputs(outputs)), names_(std::move(names)), pool_(std::move(pool)) {
    if (form == "list") form_ = Form::kList;
    else if (form == "dict") form_ = Form::kDict;
    else if (form == "x") form_ = Form::kX;
    else if (form == "xy") form_ = Form::kXY;
    else ThrowIfError(InvalidArgumentError("table batches: form '" + form +
                                           "' is not list, dict, x or xy"));
    const size_t want = form_ == Form::kX ? 1 : form_ == Form::kXY ? 2 : outputs_.size();
    if (outputs_.size() != want || (form_ == Form::kDict && names_.size() != outputs_.size())) {
      ThrowIfError(InvalidArgumentError("table batches: " + std::to_string(outputs_.size()) +
                                        " outputs and " + std::to_string(names_.size()) +
                                        " names do not make a batch of form '" + form + "'"));
    }
    std::vector<size_t> row_bytes;
    for (const Output& o : outputs_) row_bytes.push_back(o.row_bytes);
    stream_ = std::make_unique<table::BatchStream>(
        std::move(row_bytes), batch_size, prefetch, max_jobs,
        nb::cast<table::GatherPool*>(pool_), ahead);
  }

  // Queues the rows (segment[i], row[i]) of `window` (whole batches, or the epoch's last
  // rows); blocks, the GIL released, while the stream holds max_jobs jobs.
  void Push(nb::object window, Int32s segment, Int64s row) {
    const TableWindow& w = nb::cast<const TableWindow&>(window);
    table::BatchJob job;
    job.layout = w.layout();
    job.segment.assign(segment.data(), segment.data() + segment.shape(0));
    job.row.assign(row.data(), row.data() + row.shape(0));
    const uint64_t id = pushed_++;
    keep_.emplace_back(id, std::move(window));
    Status status;
    {
      nb::gil_scoped_release release;
      status = stream_->Push(std::move(job));
    }
    // Not queued: drop its window (unless close() has dropped every window meanwhile).
    if (!status.ok() && !keep_.empty() && keep_.back().first == id) {
      nb::object drop = std::move(keep_.back().second);
      keep_.pop_back();  // before the window's release, which may run Python code
    }
    ThrowIfError(status);
    Release();
  }

  void Finish() { stream_->Finish(); }

  // The next batch, or None after the last; TimeoutError when none came in timeout_s.
  nb::object Next(double timeout_s) {
    table::Batch batch;
    bool end = false;
    Status status;
    {
      nb::gil_scoped_release release;
      status = stream_->Next(&batch, &end, timeout_s);
    }
    Release();
    ThrowIfError(status);
    if (end) return nb::none();
    const size_t n = batch.rows;
    switch (form_) {
      case Form::kX:
        return ToTensor(std::move(batch.outputs[0]), outputs_[0], n);
      case Form::kXY: {
        nb::object x = ToTensor(std::move(batch.outputs[0]), outputs_[0], n);
        nb::object y = ToTensor(std::move(batch.outputs[1]), outputs_[1], n);
        return nb::make_tuple(x, y);
      }
      case Form::kDict: {
        nb::dict d;
        for (size_t i = 0; i < outputs_.size(); ++i) {
          d[nb::str(names_[i].c_str())] = ToTensor(std::move(batch.outputs[i]), outputs_[i], n);
        }
        return d;
      }
      case Form::kList:
        break;
    }
    nb::list l;
    for (size_t i = 0; i < outputs_.size(); ++i) {
      l.append(ToTensor(std::move(batch.outputs[i]), outputs_[i], n));
    }
    return l;
  }

  void Close() {
    {
      nb::gil_scoped_release release;
      stream_->Close();
    }
    std::deque<std::pair<uint64_t, nb::object>> drop;
    drop.swap(keep_);
  }

  uint64_t jobs_done() const { return stream_->jobs_done(); }
  size_t batch_buffer_bytes() const { return stream_->batch_buffer_bytes(); }

  void AdoptBuffers(const std::vector<LentArray>& arrays) {
    std::vector<table::LentBuffer> lent;
    for (const LentArray& a : arrays) lent.push_back({a.data(), a.size(), KeepAlive(a)});
    ThrowIfError(stream_->AdoptBuffers(std::move(lent)));
  }

 private:
  // Drops the windows of finished jobs (their records are no longer read). The deque is
  // left consistent before any window is released: a release may run Python code (a
  // finalizer) that lets another thread of this stream in.
  void Release() {
    const uint64_t done = stream_->jobs_done();
    std::vector<nb::object> drop;
    while (!keep_.empty() && keep_.front().first < done) {
      drop.push_back(std::move(keep_.front().second));
      keep_.pop_front();
    }
  }

  std::vector<Output> outputs_;
  std::vector<std::string> names_;
  Form form_ = Form::kList;
  nb::object pool_;                                  // outlives the stream's thread
  std::deque<std::pair<uint64_t, nb::object>> keep_;  // (job number, its window)
  uint64_t pushed_ = 0;
  std::unique_ptr<table::BatchStream> stream_;       // destroyed first: its thread ends
};

using AnyArray = nb::ndarray<nb::ro, nb::device::cpu>;
// (name, values: rows along the first axis, offset in the record, picked)
using PackSpec = std::tuple<std::string, AnyArray, size_t, bool>;

// Packs columns into records (table/pack.h), the GIL released: rows begin + i, or
// rows[i] when given, of each picked column; row i of the others.
void PackRecordsPy(nb::ndarray<uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> out,
                   std::vector<PackSpec> specs, int64_t begin, std::optional<Int64s> rows,
                   const std::string& where) {
  std::vector<table::PackColumn> cols;
  for (const PackSpec& spec : specs) {
    const AnyArray& a = std::get<1>(spec);
    table::PackColumn c;
    c.name = std::get<0>(spec);
    const size_t item = (a.dtype().bits + 7) / 8;
    size_t width = 1;
    int64_t expect = 1;  // elements between neighbours along the axis checked
    for (size_t d = a.ndim(); d-- > 1;) {
      if (a.shape(d) > 1 && a.stride(d) != expect) {
        ThrowIfError(InvalidArgumentError("table pack: column '" + c.name + "' is not " +
                                          "contiguous inside a row"));
      }
      width *= a.shape(d);
      expect *= static_cast<int64_t>(a.shape(d));
    }
    if (a.ndim() == 0 || (a.shape(0) > 1 && a.stride(0) <= 0)) {
      ThrowIfError(InvalidArgumentError("table pack: column '" + c.name +
                                        "' has no rows along a positive first axis"));
    }
    c.data = static_cast<const uint8_t*>(a.data());
    c.rows = static_cast<int64_t>(a.shape(0));
    c.row_bytes = item * width;
    c.stride = a.shape(0) > 1 ? static_cast<size_t>(a.stride(0)) * item : c.row_bytes;
    c.offset = std::get<2>(spec);
    c.picked = std::get<3>(spec);
    cols.push_back(std::move(c));
  }
  const size_t n = out.shape(0);
  std::span<const int64_t> picked;
  if (rows.has_value()) picked = {rows->data(), rows->shape(0)};
  Status status;
  {
    nb::gil_scoped_release release;
    status = table::PackRecords(cols, out.shape(1), begin, n, picked, {out.data(), n * out.shape(1)},
                                where);
  }
  ThrowIfError(status);
}

using Records = nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using RecordsOut = nb::ndarray<nb::numpy, const uint8_t, nb::ndim<2>>;

// A host cache file mapped read-only, as a uint8 [rows, record bytes] array that owns
// the mapping (unmapped when the last view of it goes).
RecordsOut MapRecords(const std::string& path, size_t record_bytes) {
  Result<std::unique_ptr<table::MappedRecords>> mapped = [&] {
    nb::gil_scoped_release release;
    return table::MappedRecords::Open(path, record_bytes);
  }();
  ThrowIfError(mapped.status());
  table::MappedRecords* m = mapped.value().release();
  nb::capsule owner(m, [](void* p) noexcept { delete static_cast<table::MappedRecords*>(p); });
  const size_t shape[2] = {static_cast<size_t>(m->rows()), m->record_bytes()};
  return RecordsOut(m->records(), 2, shape, owner);
}

void WriteRecordsPy(const std::string& path, Records records) {
  const size_t n = records.shape(0) * records.shape(1);
  Status status;
  {
    nb::gil_scoped_release release;
    status = table::WriteRecordsFile(path, {records.data(), n},
                                     static_cast<int64_t>(records.shape(0)), records.shape(1));
  }
  ThrowIfError(status);
}

void CreateRecordsFilePy(const std::string& tmp, int64_t rows, size_t record_bytes,
                         const nb::bytes& token) {
  const std::string_view t = View(token);
  Status status;
  {
    nb::gil_scoped_release release;
    status = table::CreateRecordsFile(
        tmp, rows, record_bytes, {reinterpret_cast<const uint8_t*>(t.data()), t.size()});
  }
  ThrowIfError(status);
}

void CommitRecordsFilePy(const std::string& tmp, const std::string& path, int64_t rows,
                         size_t record_bytes) {
  Status status;
  {
    nb::gil_scoped_release release;
    status = table::CommitRecordsFile(tmp, path, rows, record_bytes);
  }
  ThrowIfError(status);
}

// A lock held by this process until release() (or its end).
class HostLock {
 public:
  explicit HostLock(std::string path) : path_(std::move(path)) {}
  // True when taken within timeout_s (0: one try); the GIL released while waiting.
  bool Acquire(double timeout_s) {
    if (lock_) return true;
    Result<std::unique_ptr<table::FileLock>> got = [&] {
      nb::gil_scoped_release release;
      return table::FileLock::Acquire(path_, timeout_s);
    }();
    if (!got.ok() && got.status().code() == Code::kDeadlineExceeded) return false;
    ThrowIfError(got.status());
    lock_ = std::move(got.value());
    return true;
  }
  void Release() { lock_.reset(); }
  bool held() const { return lock_ != nullptr; }

 private:
  std::string path_;
  std::unique_ptr<table::FileLock> lock_;
};

uint64_t FreeBytesPy(const std::string& dir) {
  Result<uint64_t> free = table::FreeBytes(dir);
  ThrowIfError(free.status());
  return free.value();
}

using Int64sOut = nb::ndarray<int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

void ShuffleRowsPy(Int64sOut ids, uint64_t seed, uint64_t epoch, uint64_t salt,
                   uint64_t window) {
  nb::gil_scoped_release release;
  table::ShuffleRows({ids.data(), ids.shape(0)}, {seed, epoch, salt, window});
}

void WindowedSequencePy(Int64s counts, Int64s order, size_t window, bool shuffle,
                        uint64_t seed, uint64_t epoch, uint64_t salt, Int64sOut rows,
                        Int64sOut wins) {
  Status status;
  {
    nb::gil_scoped_release release;
    status = table::WindowedSequence({counts.data(), counts.shape(0)},
                                     {order.data(), order.shape(0)}, window, shuffle, seed,
                                     epoch, salt, {rows.data(), rows.shape(0)},
                                     {wins.data(), wins.shape(0)});
  }
  ThrowIfError(status);
}

// A vector handed to numpy without a copy (the array owns it; a move keeps its data).
template <typename T>
nb::object ToNumpy(std::vector<T> v) {
  const size_t shape[1] = {v.size()};
  T* data = v.data();
  return nb::ndarray<nb::numpy, T, nb::ndim<1>>(data, 1, shape, OwnerOf(std::move(v))).cast();
}

nb::tuple RankSequencePy(Int64s counts, Int64s order, size_t window, bool shuffle,
                        uint64_t seed, uint64_t epoch, uint64_t salt, size_t world, size_t rank,
                        bool drop_last) {
  std::vector<int64_t> rows, wins;
  Status status;
  {
    nb::gil_scoped_release release;
    status = table::RankSequence({counts.data(), counts.shape(0)},
                                 {order.data(), order.shape(0)}, window, shuffle, seed, epoch,
                                 salt, world, rank, drop_last, &rows, &wins);
  }
  ThrowIfError(status);
  return nb::make_tuple(ToNumpy(std::move(rows)), ToNumpy(std::move(wins)));
}

nb::tuple IndexWindowPy(Int64s rows, Int64s offsets, bool whole) {
  table::WindowIndex index;
  Status status;
  {
    nb::gil_scoped_release release;
    status = table::IndexWindow({rows.data(), rows.shape(0)},
                                {offsets.data(), offsets.shape(0)}, whole, &index);
  }
  ThrowIfError(status);
  return nb::make_tuple(ToNumpy(std::move(index.partitions)), ToNumpy(std::move(index.sizes)),
                        ToNumpy(std::move(index.seg)), ToNumpy(std::move(index.row)),
                        ToNumpy(std::move(index.piece_rows)));
}

}  // namespace

void init_table(nb::module_& m) {
  nb::class_<table::GatherPool>(m, "GatherPool",
                                "Threads of the table gather (the calling thread takes part).")
      .def(nb::init<int>(), "threads"_a)
      .def_prop_ro("threads", &table::GatherPool::threads, "Threads, the caller included.");

  nb::class_<TableWindow>(
      m, "TableWindow",
      "The column buffers of the table segments a rank holds, gathered into batches.\n\n"
      "columns: (name, row_bytes, record_bytes, record_offset, output, output_offset,\n"
      "[the uint8 records of each segment]);\n"
      "outputs: (DLPack type code, bits, shape after the batch dimension, row_bytes).")
      .def(nb::init<std::vector<ColumnSpec>, std::vector<std::string>, std::vector<int64_t>,
                    std::vector<OutputSpec>>(),
           "columns"_a, "segment_names"_a, "segment_rows"_a, "outputs"_a)
      .def("gather", &TableWindow::Gather, "pool"_a, "segment"_a, "row"_a,
           "Rows row[i] of segments segment[i] as one tensor per output (GIL released).")
      .def_prop_ro("num_segments", &TableWindow::num_segments, "Segments in the window.");

  m.def("pack_records", &PackRecordsPy, "out"_a, "columns"_a, "begin"_a, "rows"_a.none(),
        "where"_a,
        "Pack columns into records (uint8 [rows, record bytes]) in one pass, the GIL\n"
        "released. columns: (name, values, offset in the record, picked); record i takes\n"
        "row begin + i (rows[i] when rows is given) of each picked column, row i of the\n"
        "others. Errors name the column and `where`.");

  m.def("map_records", &MapRecords, "path"_a, "record_bytes"_a,
        "A host cache file of a partition's records mapped read-only: uint8 [rows,\n"
        "record_bytes], owning the mapping. FileNotFoundError when not written yet; an\n"
        "error naming the file when its header or size is wrong.");
  m.def("write_records", &WriteRecordsPy, "path"_a, "records"_a,
        "Write records (uint8 [rows, record bytes]) as the host cache file path (0600):\n"
        "a temporary file beside it, space reserved, then linked to path; a file already\n"
        "there is kept. OSError naming the file when the file system is full.");
  m.def("create_records_file", &CreateRecordsFilePy, "tmp"_a, "rows"_a, "record_bytes"_a,
        "token"_a,
        "Make the temporary host cache file tmp (0600, new) of rows records for another\n"
        "process to write after the header: space reserved, token where the header goes.\n"
        "OSError naming the file when the file system has no room.");
  m.def("commit_records_file", &CommitRecordsFilePy, "tmp"_a, "path"_a, "rows"_a,
        "record_bytes"_a,
        "Write the header of tmp (made by create_records_file, its records written) and\n"
        "link it to path (a file already there is kept); tmp is removed.");
  m.def("free_bytes", &FreeBytesPy, "dir"_a, "Bytes files may still take where dir is.");
  m.def("shuffle_rows", &ShuffleRowsPy, "ids"_a, "seed"_a, "epoch"_a, "salt"_a, "window"_a,
        "Permute ids (int64, in place) uniformly, in the order the key (seed, epoch, salt,\n"
        "window) gives (the GIL released).");
  m.def("windowed_sequence", &WindowedSequencePy, "counts"_a, "order"_a, "window"_a,
        "shuffle"_a, "seed"_a, "epoch"_a, "salt"_a, "rows"_a, "wins"_a,
        "Fill rows and wins with the rows of the partitions order names, window\n"
        "partitions at a time (shuffled inside each window when shuffle) and each one's\n"
        "window. ValueError naming a bad count or order entry.");
  m.def("rank_sequence", &RankSequencePy, "counts"_a, "order"_a, "window"_a, "shuffle"_a,
        "seed"_a, "epoch"_a, "salt"_a, "world"_a, "rank"_a, "drop_last"_a,
        "(rows, wins): rank's entries of the sequence windowed_sequence lays out, padded\n"
        "over world ranks as DistributedSampler pads (or cut, drop_last), without the\n"
        "whole sequence. ValueError naming a bad count, order entry or rank.");
  m.def("index_window", &IndexWindowPy, "rows"_a, "offsets"_a, "whole"_a,
        "A window's rows split by partition: (partitions, sizes, seg, row, piece_rows);\n"
        "piece_rows (not whole) holds each piece's distinct sorted rows end to end.\n"
        "ValueError naming the first position whose row is not in the table.");
  nb::class_<HostLock>(m, "HostLock",
                       "An exclusive lock on a file between the processes of a host (flock;\n"
                       "released by release() or when the process ends).")
      .def(nb::init<std::string>(), "path"_a)
      .def("acquire", &HostLock::Acquire, "timeout_s"_a,
           "True when taken within timeout_s seconds (0: one try), the GIL released.")
      .def("release", &HostLock::Release, "Release the lock (no-op when not held).")
      .def_prop_ro("held", &HostLock::held, "Whether this object holds the lock.");

  nb::class_<TableBatches>(
      m, "TableBatches",
      "An epoch's batches gathered ahead on the engine's thread (GIL released).\n\n"
      "Windows of rows are pushed (push), cut into batches of batch_size rows (a window's\n"
      "last batch may be shorter), gathered at most prefetch batches ahead and handed out\n"
      "in order by next() as form says: 'list' of tensors, 'dict' by names, 'x', or 'xy'.\n"
      "ahead=False: no thread; next() gathers each batch in the calling thread.")
      .def(nb::init<nb::object, std::vector<OutputSpec>, std::vector<std::string>,
                    const std::string&, size_t, size_t, size_t, bool>(),
           "pool"_a, "outputs"_a, "names"_a, "form"_a, "batch_size"_a, "prefetch"_a,
           "max_jobs"_a, "ahead"_a = true)
      .def("push", &TableBatches::Push, "window"_a, "segment"_a, "row"_a,
           "Queue rows row[i] of segments segment[i] of window (blocks while max_jobs\n"
           "windows are queued; the GIL released).")
      .def("finish", &TableBatches::Finish, "No more windows: next() returns None after them.")
      .def("next", &TableBatches::Next, "timeout_s"_a,
           "The next batch, None after the last; TimeoutError after timeout_s without one.")
      .def("close", &TableBatches::Close, "Stop the thread; push and next return at once.")
      .def_prop_ro("jobs_done", &TableBatches::jobs_done, "Windows whose batches are out.")
      .def_prop_ro("batch_buffer_bytes", &TableBatches::batch_buffer_bytes,
                   "Bytes of one batch's outputs (each at a 64-byte boundary): what each lent\n"
                   "buffer must hold.")
      .def("adopt_buffers", &TableBatches::AdoptBuffers, "buffers"_a,
           "Lend the stream memory for batches (1-D uint8 CPU arrays, 8-byte aligned, of at\n"
           "least batch_buffer_bytes each, e.g. pinned torch tensors' numpy views): used while\n"
           "one is free, each back once its batch's tensors are freed; dropped after close().");
}

}  // namespace ddp::py
