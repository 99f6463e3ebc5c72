// The object store: one interface over file://, s3://, http(s):// and memory://.
//
// A Store is opened on a root URL ("s3://bucket/prefix", "/data/images",
// "file:///data", "http://host/base", "memory://name"); keys are relative to that
// root and use '/' as separator. All methods are thread-safe and blocking; callers that
// hold the Python GIL release it first.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/status.h"

namespace ddp {

struct ObjectInfo {
  std::string key;    // relative to the store root
  uint64_t size = 0;  // bytes
};

// A byte range [offset, offset + length); length unset means "to the end".
struct ByteRange {
  uint64_t offset = 0;
  std::optional<uint64_t> length;
  bool IsFull() const { return offset == 0 && !length.has_value(); }
};

struct RetryOptions {
  int max_attempts = 5;            // total attempts, including the first
  double initial_backoff_s = 0.05; // jittered exponential back-off
  double max_backoff_s = 5.0;
};

struct StoreOptions {
  RetryOptions retry;
  // S3: unsigned requests (public buckets); the seed's `anon=True`.
  bool anonymous = false;
  // Overrides of the AWS environment conventions; empty means "from the environment".
  std::string endpoint_url;
  std::string region;
  // https: a PEM file of CA certificates to trust instead of the system's; empty means
  // AWS_CA_BUNDLE from the environment if set, else the system store.
  std::string ca_bundle;
  // Objects larger than this are uploaded with S3 multipart upload.
  uint64_t multipart_threshold = 16ull << 20;
  uint64_t multipart_part_size = 8ull << 20;
  // Batched get: requests kept in flight at once.
  int max_in_flight = 64;
  double connect_timeout_s = 10.0;
  // A transfer slower than 1 byte/s for this long is aborted (and retried).
  double low_speed_timeout_s = 30.0;
  // http(s) and s3: the largest answer body accepted (an object, a range, a listing
  // page). A server announcing or sending more fails the request with kResourceExhausted
  // naming the URL and this limit, before the memory is allocated.
  uint64_t max_body_bytes = 2ull << 30;
};

// Called once per requested key by GetMany, as each object completes, in completion
// order. `index` is the position of the key in the request. May be called from a
// thread other than the caller's; calls are never concurrent with each other.
using GetCallback = std::function<void(size_t index, Result<std::string> data)>;

class Store {
 public:
  virtual ~Store() = default;

  // The root URL this store was opened on (normalised, no credentials).
  virtual std::string url() const = 0;

  // Every object whose key starts with `prefix` (all pages), sorted by key.
  virtual Result<std::vector<ObjectInfo>> List(std::string_view prefix) = 0;
  virtual Result<ObjectInfo> Stat(std::string_view key) = 0;
  // The whole object or a byte range of it. A range past the end is kOutOfRange;
  // fewer bytes than announced is kDataLoss, never silently short data.
  virtual Result<std::string> Get(std::string_view key, ByteRange range = {}) = 0;
  // Atomic from a reader's view: the object is either the old or the new content.
  virtual Status Put(std::string_view key, std::string_view data) = 0;
  // Deleting a missing key is OK (as in S3).
  virtual Status Delete(std::string_view key) = 0;

  // Fetch many whole objects, keeping up to `max_in_flight` requests in flight (0: the
  // store's option), calling `cb` for each as it completes. Returns when all are done.
  // Per-object failures go to the callback; the return value reports only failures of
  // the batch itself.
  virtual Status GetMany(std::span<const std::string> keys, const GetCallback& cb,
                         int max_in_flight = 0);

  // As GetMany, but stops early once `cancel` becomes true (set from any thread): no new
  // request starts, those in flight are abandoned, every key not delivered yet gets
  // kCancelled through `cb`, and the call returns kCancelled. GetMany calls this with a
  // flag that never becomes true; back-ends override this one.
  virtual Status GetManyCancellable(std::span<const std::string> keys, const GetCallback& cb,
                                    int max_in_flight, const std::atomic<bool>& cancel);

  // A full URL for `key` (root + '/' + key), for error messages and listings.
  std::string KeyUrl(std::string_view key) const;
};

// A store URL taken apart: the one parser every layer uses.
struct StoreUrl {
  std::string scheme;    // lower case: "file", "s3", "http", "https", "memory"
  // file: the local path, absolute or relative as given ("file:///x" and
  // "file://localhost/x" are "/x"; a plain path is itself); memory: the name and
  // prefix after "memory://"; s3 and http(s): the whole URL as given.
  std::string location;
  bool local = false;    // the local file system
};

// Parses `url`: "scheme://..." for a registered scheme (case-insensitive), or a plain
// path (no "://", or a "://" after a character no scheme may hold, such as '/').
// kInvalidArgument, naming the URL (credentials redacted), for an empty URL, an
// unknown scheme (naming it and the supported ones) and a file URL naming a host.
Result<StoreUrl> ParseStoreUrl(std::string_view url);

// `url` with any "user:password@" of its authority removed, for messages, logs and
// Store::url(); anything without an authority is returned as is.
std::string RedactUrl(std::string_view url);

// Opens the store for a URL, chosen by scheme (see ParseStoreUrl): file:// or a plain
// path, s3://, http:// and https:// (read-only), memory:// (process-wide named
// in-memory stores).
Result<std::unique_ptr<Store>> OpenStore(std::string_view url, const StoreOptions& options = {});

}  // namespace ddp
