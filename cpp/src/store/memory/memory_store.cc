// memory://name: process-wide named in-memory stores, for tests and examples.
//
// Opening the same name twice gives two handles on the same objects (as two handles on
// one bucket would); "memory://" alone opens a fresh anonymous store. As with a bucket,
// "memory://name/some/prefix" roots the store at a prefix of that name's objects.
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "store/backends.h"
#include "store/key.h"

namespace ddp::store_internal {
namespace {

// The objects of one named store. Values are immutable once stored, so a Get copies
// out under the lock and a Put swaps the whole value in (atomic for readers).
struct MemoryBucket {
  std::mutex mu;
  std::map<std::string, std::string, std::less<>> objects;
};

std::shared_ptr<MemoryBucket> BucketNamed(const std::string& name) {
  static std::mutex mu;
  static auto* buckets = new std::unordered_map<std::string, std::shared_ptr<MemoryBucket>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& b = (*buckets)[name];
  if (!b) b = std::make_shared<MemoryBucket>();
  return b;
}

class MemoryStore final : public Store {
 public:
  MemoryStore(const std::string& name, std::string prefix, std::shared_ptr<MemoryBucket> bucket)
      : url_("memory://" + name + (prefix.empty() ? "" : "/" + prefix)),
        root_(prefix.empty() ? "" : prefix + "/"),
        bucket_(std::move(bucket)) {}

  std::string url() const override { return url_; }

  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override {
    std::vector<ObjectInfo> out;
    std::string full = root_ + std::string(prefix);
    std::lock_guard<std::mutex> lock(bucket_->mu);
    for (auto it = bucket_->objects.lower_bound(full); it != bucket_->objects.end(); ++it) {
      if (!std::string_view(it->first).starts_with(full)) break;
      out.push_back({it->first.substr(root_.size()), it->second.size()});
    }
    return out;
  }

  Result<ObjectInfo> Stat(std::string_view key) override {
    DDP_RETURN_IF_ERROR(ValidateKey(key, url_, /*strict=*/false));
    std::lock_guard<std::mutex> lock(bucket_->mu);
    auto it = bucket_->objects.find(root_ + std::string(key));
    if (it == bucket_->objects.end()) return NotFound(key);
    return ObjectInfo{std::string(key), it->second.size()};
  }

  Result<std::string> Get(std::string_view key, ByteRange range) override {
    DDP_RETURN_IF_ERROR(ValidateKey(key, url_, /*strict=*/false));
    std::lock_guard<std::mutex> lock(bucket_->mu);
    auto it = bucket_->objects.find(root_ + std::string(key));
    if (it == bucket_->objects.end()) return NotFound(key);
    DDP_ASSIGN_OR_RETURN(ResolvedRange r, ResolveRange(range, it->second.size(), KeyUrl(key)));
    return it->second.substr(r.offset, r.length);
  }

  Status Put(std::string_view key, std::string_view data) override {
    DDP_RETURN_IF_ERROR(ValidateKey(key, url_, /*strict=*/false));
    std::string value(data);
    std::lock_guard<std::mutex> lock(bucket_->mu);
    bucket_->objects.insert_or_assign(root_ + std::string(key), std::move(value));
    return Status::Ok();
  }

  Status Delete(std::string_view key) override {
    DDP_RETURN_IF_ERROR(ValidateKey(key, url_, /*strict=*/false));
    std::lock_guard<std::mutex> lock(bucket_->mu);
    auto it = bucket_->objects.find(root_ + std::string(key));
    if (it != bucket_->objects.end()) bucket_->objects.erase(it);
    return Status::Ok();
  }

 private:
  Status NotFound(std::string_view key) const {
    return NotFoundError(KeyUrl(key) + ": no such object");
  }

  std::string url_;
  std::string root_;  // "" or "prefix/"
  std::shared_ptr<MemoryBucket> bucket_;
};

}  // namespace

Result<std::unique_ptr<Store>> OpenMemoryStore(std::string_view name, const StoreOptions& options) {
  std::string n(name);
  while (!n.empty() && n.back() == '/') n.pop_back();
  std::string prefix;
  if (size_t slash = n.find('/'); slash != std::string::npos) {
    prefix = n.substr(slash + 1);
    n.resize(slash);
    DDP_RETURN_IF_ERROR(ValidateKey(prefix, "memory://" + n, /*strict=*/true)
                            .WithContext("invalid prefix in memory store URL"));
  }
  if (n.empty()) {
    if (!prefix.empty()) {
      return InvalidArgumentError("memory store URL 'memory://" + std::string(name) +
                                  "' has a prefix but no name");
    }
    static std::atomic<uint64_t> counter{0};
    n = "anonymous-" + std::to_string(counter.fetch_add(1) + 1);
  }
  return std::unique_ptr<Store>(new MemoryStore(n, std::move(prefix), BucketNamed(n)));
}

}  // namespace ddp::store_internal
