// http:// and https://: read-only stores over plain web servers.
//
// GET, ranged GET and HEAD map directly. HTTP has no listing, so List reads a listing
// file, "_index.txt" at the base URL: one key per line, optionally "\tSIZE" after it;
// blank lines and '#' comments are skipped. Sizes missing from it are fetched with HEAD
// requests (batched). Without the file, List is kUnimplemented and says so.
#include <algorithm>

#include "store/backends.h"
#include "store/http/curl_client.h"
#include "store/http/object_get.h"
#include "store/key.h"

namespace ddp::store_internal {
namespace {

constexpr std::string_view kListingFile = "_index.txt";

class HttpStore final : public Store {
 public:
  HttpStore(std::string base, std::unique_ptr<CurlClient> client, int max_in_flight)
      : base_(std::move(base)),
        display_(RedactUrl(base_)),
        client_(std::move(client)),
        max_in_flight_(max_in_flight) {}

  std::string url() const override { return display_; }

  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override {
    HttpRequest req = Request("GET", kListingFile);
    DDP_ASSIGN_OR_RETURN(HttpResponse resp, client_->Perform(req));
    if (resp.status == 404) {
      return UnimplementedError(
          display_ + ": cannot list: HTTP has no listing and there is no listing file " +
          KeyUrl(kListingFile) +
          " (write one key per line, optionally followed by a tab and the size in bytes)");
    }
    if (resp.status / 100 != 2) return client_->ErrorFor(req, resp);
    std::vector<ObjectInfo> out;
    std::vector<size_t> unsized;
    size_t line_no = 0;
    std::string_view text = resp.body;
    while (!text.empty()) {
      size_t nl = text.find('\n');
      std::string_view line = text.substr(0, nl);
      text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty() || line.front() == '#') continue;
      std::string_view key = line, size_text;
      if (size_t tab = line.find('\t'); tab != std::string_view::npos) {
        key = line.substr(0, tab);
        size_text = line.substr(tab + 1);
      }
      if (!key.starts_with(prefix)) continue;
      Status valid = ValidateKey(key, display_, /*strict=*/false);
      if (!valid.ok()) {
        return valid.WithContext(KeyUrl(kListingFile) + " line " + std::to_string(line_no));
      }
      ObjectInfo info{std::string(key), 0};
      if (size_text.empty()) {
        unsized.push_back(out.size());
      } else {
        char* end = nullptr;
        std::string st(size_text);
        info.size = std::strtoull(st.c_str(), &end, 10);
        if (end == st.c_str() || *end != '\0') {
          return InvalidArgumentError(KeyUrl(kListingFile) + " line " + std::to_string(line_no) +
                                      ": size '" + st + "' is not a number");
        }
      }
      out.push_back(std::move(info));
    }
    DDP_RETURN_IF_ERROR(FillSizes(&out, unsized));
    std::sort(out.begin(), out.end(),
              [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
    return out;
  }

  Result<ObjectInfo> Stat(std::string_view key) override {
    DDP_RETURN_IF_ERROR(ValidateKey(key, display_, /*strict=*/false));
    DDP_ASSIGN_OR_RETURN(uint64_t size, SizeOf(key));
    return ObjectInfo{std::string(key), size};
  }

  Result<std::string> Get(std::string_view key, ByteRange range) override {
    DDP_RETURN_IF_ERROR(ValidateKey(key, display_, /*strict=*/false));
    return GetObjectRange(*client_, Request("GET", key), range, [&] { return SizeOf(key); });
  }

  Status Put(std::string_view key, std::string_view) override {
    return UnimplementedError(KeyUrl(key) + ": http(s) stores are read-only (put)");
  }

  Status Delete(std::string_view key) override {
    return UnimplementedError(KeyUrl(key) + ": http(s) stores are read-only (delete)");
  }

  Status GetManyCancellable(std::span<const std::string> keys, const GetCallback& cb,
                            int max_in_flight, const std::atomic<bool>& cancel) override {
    std::vector<HttpRequest> requests;
    requests.reserve(keys.size());
    std::vector<Status> invalid(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      invalid[i] = ValidateKey(keys[i], display_, /*strict=*/false);
      requests.push_back(Request("GET", invalid[i].ok() ? keys[i] : std::string_view("")));
    }
    // Invalid keys fail at once; the rest go to the batch.
    std::vector<HttpRequest> valid;
    std::vector<size_t> index_of;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!invalid[i].ok()) {
        cb(i, invalid[i]);
      } else {
        valid.push_back(std::move(requests[i]));
        index_of.push_back(i);
      }
    }
    return client_->PerformMany(
        valid, max_in_flight > 0 ? max_in_flight : max_in_flight_,
        [&](size_t j, Result<HttpResponse> r) {
          if (!r.ok()) return cb(index_of[j], r.status());
          cb(index_of[j], BodyForRange(*client_, valid[j], std::move(r).value(), ByteRange{}));
        },
        &cancel);
  }

 private:
  HttpRequest Request(std::string method, std::string_view key) const {
    HttpRequest r;
    r.method = std::move(method);
    r.url = base_ + "/" + UriEncode(key, /*keep_slash=*/true);
    r.what = KeyUrl(key);
    return r;
  }

  Result<uint64_t> SizeOf(std::string_view key) {
    HttpRequest req = Request("HEAD", key);
    DDP_ASSIGN_OR_RETURN(HttpResponse resp, client_->Perform(req));
    if (resp.status / 100 != 2) return client_->ErrorFor(req, resp);
    return ContentLength(req, resp);
  }

  Status FillSizes(std::vector<ObjectInfo>* infos, const std::vector<size_t>& which) {
    if (which.empty()) return Status::Ok();
    std::vector<HttpRequest> heads;
    for (size_t i : which) heads.push_back(Request("HEAD", (*infos)[i].key));
    Status first_error;
    auto on_head = [&](size_t j, Result<HttpResponse> r) {
      if (!first_error.ok()) return;
      if (!r.ok()) {
        first_error = r.status();
      } else if (r->status / 100 != 2) {
        first_error = client_->ErrorFor(heads[j], *r);
      } else {
        Result<uint64_t> size = ContentLength(heads[j], *r);
        if (size.ok()) {
          (*infos)[which[j]].size = *size;
        } else {
          first_error = size.status();
        }
      }
    };
    Status batch = client_->PerformMany(heads, max_in_flight_, on_head);
    DDP_RETURN_IF_ERROR(batch);
    return first_error.WithContext("listing " + display_ + " (sizes by HEAD)");
  }

  std::string base_;     // scheme://[user:pass@]host[:port][/base], no trailing '/'
  std::string display_;  // base_ without credentials
  std::unique_ptr<CurlClient> client_;
  int max_in_flight_;
};

}  // namespace

Result<std::unique_ptr<Store>> OpenHttpStore(std::string_view url, const StoreOptions& options) {
  std::string base(url);
  size_t host_start = base.find("://") + 3;
  if (base.find_first_of("?#", host_start) != std::string::npos) {
    return InvalidArgumentError("http store URL '" + RedactUrl(base) +
                                "' must not have a query or fragment");
  }
  while (base.size() > host_start && base.back() == '/') base.pop_back();
  size_t host_end = base.find('/', host_start);
  std::string host = base.substr(host_start, host_end == std::string::npos ? std::string::npos
                                                                           : host_end - host_start);
  if (host.empty() || host.front() == ':' || host.back() == '@') {
    return InvalidArgumentError("http store URL '" + RedactUrl(base) + "' has no host");
  }
  ClientConfig cfg = ClientConfigFor(options);
  DDP_ASSIGN_OR_RETURN(auto client, CurlClient::Create(std::move(cfg)));
  return std::unique_ptr<Store>(
      new HttpStore(std::move(base), std::move(client), std::max(1, options.max_in_flight)));
}

}  // namespace ddp::store_internal
