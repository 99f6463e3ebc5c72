// Bindings of the table gather: dask_ddp._core.GatherPool (the gather's threads) and
// TableWindow (the column buffers of the segments a rank holds, gathered into batches).
//
// A window keeps its source arrays alive (the shared-memory mappings of the partitions'
// rows); each gather copies the picked rows into new buffers with the GIL released, which
// cross to torch through DLPack without a copy (the tensor owns its buffer).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "errors.h"
#include "table/gather.h"

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

class TableWindow {
 public:
  TableWindow(std::vector<ColumnSpec> columns, std::vector<std::string> segment_names,
              std::vector<int64_t> segment_rows, std::vector<OutputSpec> outputs) {
    layout_.segment_names = std::move(segment_names);
    layout_.segment_rows = std::move(segment_rows);
    for (OutputSpec& o : outputs) {
      Output out;
      out.dtype = nb::dlpack::dtype{std::get<0>(o), std::get<1>(o), 1};
      out.tail = std::move(std::get<2>(o));
      out.row_bytes = std::get<3>(o);
      layout_.output_row_bytes.push_back(out.row_bytes);
      outputs_.push_back(std::move(out));
    }
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
        const size_t need = s < layout_.segment_rows.size()
                                ? static_cast<size_t>(std::max<int64_t>(layout_.segment_rows[s], 0)) * col.src_stride
                                : 0;
        if (buffers[s].size() < need) {
          ThrowIfError(InvalidArgumentError(
              "table window: column '" + col.name + "' has " + std::to_string(buffers[s].size()) +
              " bytes in " + (s < layout_.segment_names.size() ? layout_.segment_names[s] : "?") +
              ", which needs " + std::to_string(need)));
        }
        col.segments.push_back(buffers[s].data());
      }
      keep_.push_back(buffers);
      layout_.columns.push_back(std::move(col));
    }
    ThrowIfError(table::ValidateLayout(layout_));
  }

  nb::list Gather(table::GatherPool& pool, nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> segment,
                  nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> row) {
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
      status = table::GatherRows(layout_, {segment.data(), segment.shape(0)}, {row.data(), n},
                                 outs, &pool);
    }
    ThrowIfError(status);
    nb::list result;
    for (size_t i = 0; i < outputs_.size(); ++i) {
      const Output& o = outputs_[i];
      std::vector<size_t> shape{n};
      shape.insert(shape.end(), o.tail.begin(), o.tail.end());
      uint8_t* data = buffers[i].release();
      nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<uint8_t*>(p); });
      result.append(nb::ndarray<nb::pytorch>(data, shape.size(), shape.data(), owner, nullptr,
                                             o.dtype).cast());
    }
    return result;
  }

  size_t num_segments() const { return layout_.segment_rows.size(); }

 private:
  table::GatherLayout layout_;
  std::vector<Output> outputs_;
  std::vector<std::vector<Bytes>> keep_;
};

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
}

}  // namespace ddp::py
