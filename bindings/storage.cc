// Bindings of the object store (ddp/store.h): dask_ddp._core.Store, ObjectInfo,
// open_store() and the streaming iterator behind Store.get_many.
//
// Every call that touches storage runs with the GIL released; only the conversion of
// results into Python objects holds it.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "ddp/store.h"
#include "errors.h"
#include "storage.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace ddp::py {
namespace {

nb::bytes ToBytes(const std::string& s) { return nb::bytes(s.data(), s.size()); }

// A contiguous read-only view of any object with the buffer protocol (bytes, bytearray,
// memoryview, numpy arrays). The exporter keeps the memory valid (and a bytearray from
// resizing) until release, so the view may be read with the GIL released.
class BufferView {
 public:
  explicit BufferView(nb::handle obj) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_SIMPLE) != 0) {
      PyErr_Clear();
      throw nb::type_error(
          ("data must be bytes, bytearray or a contiguous buffer, not " +
           std::string(nb::type_name(obj.type()).c_str()))
              .c_str());
    }
  }
  ~BufferView() { PyBuffer_Release(&view_); }
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;
  std::string_view data() const {
    return {static_cast<const char*>(view_.buf), static_cast<size_t>(view_.len)};
  }

 private:
  Py_buffer view_{};
};

// Runs Store::GetMany on a background thread and hands completed objects to Python one
// at a time through a bounded queue: the fetch keeps going while Python consumes, and
// a slow consumer applies back-pressure instead of buffering the whole batch.
class GetManyIterator {
 public:
  GetManyIterator(std::shared_ptr<Store> store, std::vector<std::string> keys, int max_in_flight)
      : state_(std::make_shared<State>()) {
    state_->keys = std::move(keys);
    state_->capacity = std::max<size_t>(16, static_cast<size_t>(std::max(max_in_flight, 1)) * 2);
    std::shared_ptr<State> st = state_;
    thread_ = std::thread([st, store = std::move(store), max_in_flight] {
      Status batch = store->GetManyCancellable(
          st->keys,
          [&st](size_t index, Result<std::string> data) {
            std::unique_lock<std::mutex> lock(st->mu);
            st->cv.wait(lock, [&] { return st->cancelled || st->queue.size() < st->capacity; });
            if (st->cancelled) return;  // the consumer left: drop what still arrives
            st->queue.emplace_back(index, std::move(data));
            st->cv.notify_all();
          },
          max_in_flight, st->cancel);
      std::lock_guard<std::mutex> lock(st->mu);
      st->batch_status = std::move(batch);
      st->finished = true;
      st->cv.notify_all();
    });
  }

  ~GetManyIterator() {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->cancelled = true;
      state_->cancel = true;  // stops the fetch itself, not just the hand-off
      state_->cv.notify_all();
    }
    // The worker never takes the GIL, but release it anyway while waiting for it: the
    // remaining requests may take a moment to drain.
    if (thread_.joinable()) {
      nb::gil_scoped_release release;
      thread_.join();
    }
  }

  // The next (key, bytes); raises the key's error, or StopIteration at the end.
  nb::tuple Next() {
    std::optional<std::pair<size_t, Result<std::string>>> item;
    Status batch;
    {
      nb::gil_scoped_release release;
      std::unique_lock<std::mutex> lock(state_->mu);
      state_->cv.wait(lock, [&] { return !state_->queue.empty() || state_->finished; });
      if (!state_->queue.empty()) {
        item.emplace(std::move(state_->queue.front()));
        state_->queue.pop_front();
        state_->cv.notify_all();
      } else {
        batch = state_->batch_status;
      }
    }
    if (!item) {
      ThrowIfError(batch);
      throw nb::stop_iteration();
    }
    const std::string& key = state_->keys[item->first];
    Result<std::string>& r = item->second;
    if (!r.ok()) throw StatusError(r.status());
    return nb::make_tuple(key, ToBytes(*r));
  }

 private:
  struct State {
    std::vector<std::string> keys;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::pair<size_t, Result<std::string>>> queue;
    size_t capacity = 16;
    bool cancelled = false;
    std::atomic<bool> cancel{false};
    bool finished = false;
    Status batch_status;
  };
  std::shared_ptr<State> state_;
  std::thread thread_;
};

std::vector<ObjectInfo> StoreList(const PyStore& s, const std::string& prefix) {
  Result<std::vector<ObjectInfo>> r = [&] {
    nb::gil_scoped_release release;
    return s.store->List(prefix);
  }();
  return ValueOrThrow(std::move(r));
}

ObjectInfo StoreStat(const PyStore& s, const std::string& key) {
  Result<ObjectInfo> r = [&] {
    nb::gil_scoped_release release;
    return s.store->Stat(key);
  }();
  return ValueOrThrow(std::move(r));
}

nb::bytes StoreGet(const PyStore& s, const std::string& key, uint64_t offset, std::optional<uint64_t> length) {
  Result<std::string> r = [&] {
    nb::gil_scoped_release release;
    return s.store->Get(key, ByteRange{offset, length});
  }();
  return ToBytes(ValueOrThrow(std::move(r)));
}

void StorePut(const PyStore& s, const std::string& key, nb::handle data) {
  BufferView view(data);
  Status st;
  {
    nb::gil_scoped_release release;
    st = s.store->Put(key, view.data());
  }
  ThrowIfError(st);
}

void StoreDelete(const PyStore& s, const std::string& key) {
  Status st;
  {
    nb::gil_scoped_release release;
    st = s.store->Delete(key);
  }
  ThrowIfError(st);
}

GetManyIterator* StoreGetMany(const PyStore& s, std::vector<std::string> keys, int max_in_flight) {
  return new GetManyIterator(s.store, std::move(keys), max_in_flight);
}

PyStore OpenStoreFor(const std::string& url, bool anonymous, const std::string& endpoint_url,
                     const std::string& region, const std::string& ca_bundle, int max_attempts,
                     double initial_backoff, double max_backoff, uint64_t multipart_threshold,
                     uint64_t multipart_part_size, int max_in_flight, double connect_timeout,
                     double low_speed_timeout, uint64_t max_body_bytes) {
  StoreOptions o;
  o.anonymous = anonymous;
  o.endpoint_url = endpoint_url;
  o.region = region;
  o.ca_bundle = ca_bundle;
  o.retry.max_attempts = max_attempts;
  o.retry.initial_backoff_s = initial_backoff;
  o.retry.max_backoff_s = max_backoff;
  o.multipart_threshold = multipart_threshold;
  o.multipart_part_size = multipart_part_size;
  o.max_in_flight = max_in_flight;
  o.connect_timeout_s = connect_timeout;
  o.low_speed_timeout_s = low_speed_timeout;
  o.max_body_bytes = max_body_bytes;
  Result<std::unique_ptr<Store>> r = [&] {
    nb::gil_scoped_release release;
    return OpenStore(url, o);
  }();
  return PyStore{std::shared_ptr<Store>(ValueOrThrow(std::move(r)))};
}

void DefObjectInfo(nb::module_& m) {
  nb::class_<ObjectInfo>(m, "ObjectInfo", "An object's key (relative to the store root) and size.")
      .def(nb::init<>())
      .def("__init__",
           [](ObjectInfo* self, std::string key, uint64_t size) {
             new (self) ObjectInfo{std::move(key), size};
           },
           "key"_a, "size"_a)
      .def_rw("key", &ObjectInfo::key, "The key, relative to the store root.")
      .def_rw("size", &ObjectInfo::size, "Size in bytes.")
      .def(
          "__eq__",
          [](const ObjectInfo& a, nb::handle other) -> nb::object {
            ObjectInfo* b = nullptr;
            if (!nb::try_cast<ObjectInfo*>(other, b) || b == nullptr) {
              return nb::borrow(Py_NotImplemented);
            }
            return nb::bool_(a.key == b->key && a.size == b->size);
          },
          nb::sig("def __eq__(self, other: object, /) -> bool"))
      .def("__repr__", [](const ObjectInfo& o) -> std::string {
        std::string key_repr = nb::repr(nb::str(o.key.c_str(), o.key.size())).c_str();
        return "ObjectInfo(key=" + key_repr + ", size=" + std::to_string(o.size) + ")";
      });
}

void DefStore(nb::module_& m) {
  nb::class_<GetManyIterator>(m, "GetManyIterator",
                              "Iterator of (key, bytes) in completion order (see Store.get_many).")
      .def("__iter__", [](nb::handle self) { return self; })
      .def("__next__", &GetManyIterator::Next);

  nb::class_<PyStore>(m, "Store", "An object store opened on a root URL (see open_store).")
      .def_prop_ro("url", [](const PyStore& s) { return s.store->url(); },
                   "The root URL (normalised, no credentials).")
      .def("list", &StoreList, "prefix"_a = "", "Every object whose key starts with `prefix`, sorted by key.")
      .def("stat", &StoreStat, "key"_a, "The object's size; FileNotFoundError if missing.")
      .def("get", &StoreGet, "key"_a, "offset"_a = 0, "length"_a = nb::none(),
           "The object's bytes, or `length` bytes from `offset` (None: to the end).")
      .def("put", &StorePut, "key"_a, "data"_a, "Write an object (atomically replacing any old one).")
      .def("delete", &StoreDelete, "key"_a, "Delete an object; deleting a missing key is not an error.")
      .def("get_many", &StoreGetMany, "keys"_a, "max_in_flight"_a = 0, nb::rv_policy::take_ownership,
           "Fetch many objects concurrently; an iterator of (key, bytes) in completion order.");
}

void DefUrls(nb::module_& m) {
  m.def(
      "parse_url",
      [](const std::string& url) {
        StoreUrl u = ValueOrThrow(ParseStoreUrl(url));
        return std::make_tuple(u.scheme, u.location, u.local);
      },
      "url"_a,
      "The engine's parse of a store URL: (scheme, location, local). `location` is the "
      "local path for file URLs and plain paths (file:///x and file://localhost/x are "
      "'/x'), the name for memory://, the URL itself for s3:// and http(s)://. ValueError "
      "names an unknown scheme or a file URL naming a host.");
  m.def("redact_url", [](const std::string& url) { return RedactUrl(url); }, "url"_a,
        "The URL without any 'user:password@' in its authority, for messages and logs.");

  const StoreOptions defaults;
  m.def("open_store", &OpenStoreFor, "url"_a, nb::kw_only(), "anonymous"_a = defaults.anonymous,
        "endpoint_url"_a = "", "region"_a = "", "ca_bundle"_a = "", "max_attempts"_a = defaults.retry.max_attempts,
        "initial_backoff"_a = defaults.retry.initial_backoff_s, "max_backoff"_a = defaults.retry.max_backoff_s,
        "multipart_threshold"_a = defaults.multipart_threshold,
        "multipart_part_size"_a = defaults.multipart_part_size, "max_in_flight"_a = defaults.max_in_flight,
        "connect_timeout"_a = defaults.connect_timeout_s, "low_speed_timeout"_a = defaults.low_speed_timeout_s,
        "max_body_bytes"_a = defaults.max_body_bytes,
        "Open the store for a URL: file:// or a plain path, s3://, http(s)://, memory://.");
}

}  // namespace

void init_storage(nb::module_& m) {
  DefObjectInfo(m);
  DefStore(m);
  DefUrls(m);
}

}  // namespace ddp::py
