// s3://bucket[/prefix]: Amazon S3 and compatible servers over libcurl, configured by the
// AWS conventions (see s3_config.h). Requests are signed by sigv4.h, not by libcurl's
// CURLOPT_AWS_SIGV4: a reviewed exception to the architecture page's "libcurl signs", because
// libcurl derives the signing key again for every request (see sigv4.h).
//
// Query strings are written already in canonical form (parameters sorted, values
// URI-encoded).
#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <unordered_set>

#include "store/backends.h"
#include "store/http/curl_client.h"
#include "store/http/object_get.h"
#include "store/key.h"
#include "store/retry.h"
#include "store/s3/credentials/aws_credentials.h"
#include "store/s3/credentials/chain.h"
#include "store/s3/s3_config.h"
#include "store/s3/s3_xml.h"
#include "store/s3/sigv4.h"
#include "store/text.h"

namespace ddp::store_internal {
namespace {

constexpr uint64_t kMinPartSize = 5ull << 20;  // S3's minimum for all parts but the last
constexpr uint64_t kMaxParts = 10000;
// Pages of one listing at most (1000 keys each: a billion objects).
constexpr size_t kMaxListPages = 1000000;

// Maps an S3 error answer to a Status naming the object, the HTTP status and the S3
// error code and message from the XML body.
Status S3Error(const HttpRequest& request, const HttpResponse& response) {
  std::string code, message;
  std::string detail;
  if (ParseS3Error(response.body, &code, &message)) {
    detail = code;
    if (!message.empty()) detail += ": " + message;
  }
  Status s = HttpStatusError(request, response.status, detail);
  if (code == "NoSuchKey" || code == "NoSuchBucket" || code == "NoSuchUpload") {
    return {Code::kNotFound, s.message()};
  }
  if (code == "AccessDenied" || code == "InvalidAccessKeyId" || code == "SignatureDoesNotMatch" ||
      code == "ExpiredToken" || code == "InvalidToken" || code == "AllAccessDisabled") {
    return {Code::kPermissionDenied, s.message()};
  }
  if (code == "RequestTimeout") return {Code::kDeadlineExceeded, s.message()};
  if (IsRetryableS3Error(0, code)) return {Code::kUnavailable, s.message()};  // throttled
  return s;
}

// Whether an S3 error answer is worth another attempt (see IsRetryableS3Error). An
// answer saying temporary credentials expired also is, after dropping them, so the next
// attempt signs with fresh ones (the clock of the server may run ahead of ours).
bool S3Retryable(const HttpResponse& response, CredentialsProvider* refreshing) {
  std::string code, message;
  if (!ParseS3Error(response.body, &code, &message)) code.clear();  // no S3 error code: the status decides
  if (refreshing != nullptr && IsExpiredCredentialsCode(code)) {
    refreshing->Invalidate();
    return true;
  }
  return IsRetryableS3Error(response.status, code);
}

// The provider of the keys to sign with: fixed ones, or temporary ones fetched from
// `source` and refreshed before they expire. The first fetch happens here, so a store
// that cannot get credentials fails to open with the reason.
Result<std::shared_ptr<CredentialsProvider>> MakeProvider(std::string_view url,
                                                          const S3Config& config,
                                                          const StoreOptions& options) {
  if (config.credentials) {
    return std::shared_ptr<CredentialsProvider>(
        std::make_shared<StaticCredentials>(*config.credentials));
  }
  const CredentialSource& source = *config.credential_source;
  // An empty ca_bundle falls back to AWS_CA_BUNDLE in CurlClient::Create.
  DDP_ASSIGN_OR_RETURN(CredentialFetch fetch, MakeCredentialFetch(source, options.ca_bundle));
  auto provider = std::make_shared<RefreshingCredentials>(std::move(fetch));
  Result<AwsCredentials> first = provider->Get();
  if (!first.ok()) {
    if (std::holds_alternative<ImdsSource>(source)) {
      // Instance metadata is only the last resort, tried because nothing was set: off
      // EC2 the real problem is the missing configuration.
      return NoCredentialsError(url, ProcessEnv(), first.status().message());
    }
    return first.status().WithContext("getting AWS credentials for " + RedactUrl(url));
  }
  return std::shared_ptr<CredentialsProvider>(std::move(provider));
}

class S3Store final : public Store {
 public:
  S3Store(S3Config config, std::unique_ptr<CurlClient> client, const StoreOptions& options)
      : config_(std::move(config)),
        bucket_url_(config_.BucketUrl()),
        url_("s3://" + config_.bucket + (config_.prefix.empty() ? "" : "/" + config_.prefix)),
        root_(config_.prefix.empty() ? "" : config_.prefix + "/"),
        client_(std::move(client)),
        options_(options) {}

  std::string url() const override { return url_; }

  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override {
    std::vector<ObjectInfo> out;
    std::string full = root_ + std::string(prefix);
    std::string token;
    // Every token a listing handed out: a server that repeats one (or never ends) would
    // make this loop for ever, its memory growing; a page cap bounds any other misstep.
    std::unordered_set<std::string> seen;
    size_t pages = 0;
    while (true) {
      if (++pages > kMaxListPages) {
        return DataLossError("listing " + KeyUrl(prefix) + ": the server sent more than " +
                             std::to_string(kMaxListPages) + " pages; giving up");
      }
      // Parameters in canonical (sorted) order.
      std::string query = "?";
      if (!token.empty()) query += "continuation-token=" + UriEncode(token, false) + "&";
      query += "list-type=2&prefix=" + UriEncode(full, false);
      HttpRequest req;
      req.url = bucket_url_ + "/" + query;
      req.what = "listing " + KeyUrl(prefix);
      DDP_ASSIGN_OR_RETURN(HttpResponse resp, client_->Perform(req));
      if (resp.status / 100 != 2) return client_->ErrorFor(req, resp);
      DDP_ASSIGN_OR_RETURN(ListPage page, ParseListObjectsV2(resp.body, req.what));
      for (ObjectInfo& o : page.objects) {
        if (!o.key.starts_with(root_)) continue;  // never, unless the server misbehaves
        o.key.erase(0, root_.size());
        out.push_back(std::move(o));
      }
      if (!page.truncated) break;
      if (!seen.insert(page.next_token).second) {
        return DataLossError("listing " + KeyUrl(prefix) +
                             ": the server repeated a continuation token (after " +
                             std::to_string(pages) + " pages); the listing would never end");
      }
      token = page.next_token;
    }
    std::sort(out.begin(), out.end(),
              [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
    return out;
  }

  Result<ObjectInfo> Stat(std::string_view key) override {
    DDP_RETURN_IF_ERROR(ValidateKey(key, url_, /*strict=*/false));
    DDP_ASSIGN_OR_RETURN(uint64_t size, SizeOf(key));
    return ObjectInfo{std::string(key), size};
  }

  Result<std::string> Get(std::string_view key, ByteRange range) override {
    DDP_RETURN_IF_ERROR(ValidateKey(key, url_, /*strict=*/false));
    return GetObjectRange(*client_, ObjectRequest("GET", key), range, [&] { return SizeOf(key); });
  }

  Status Put(std::string_view key, std::string_view data) override {
    DDP_RETURN_IF_ERROR(ValidateKey(key, url_, /*strict=*/false));
    if (data.size() > options_.multipart_threshold) return PutMultipart(key, data);
    HttpRequest req = ObjectRequest("PUT", key);
    req.body = data;
    DDP_ASSIGN_OR_RETURN(HttpResponse resp, client_->Perform(req));
    if (resp.status / 100 != 2) return client_->ErrorFor(req, resp);
    return Status::Ok();
  }

  Status Delete(std::string_view key) override {
    DDP_RETURN_IF_ERROR(ValidateKey(key, url_, /*strict=*/false));
    HttpRequest req = ObjectRequest("DELETE", key);
    DDP_ASSIGN_OR_RETURN(HttpResponse resp, client_->Perform(req));
    if (resp.status / 100 == 2) return Status::Ok();
    Status s = client_->ErrorFor(req, resp);
    // A missing key is fine (S3 itself answers 204); a missing bucket is not.
    if (resp.status == 404 && s.message().find("NoSuchBucket") == std::string::npos) {
      return Status::Ok();
    }
    return s;
  }

  Status GetManyCancellable(std::span<const std::string> keys, const GetCallback& cb,
                            int max_in_flight, const std::atomic<bool>& cancel) override {
    std::vector<HttpRequest> requests;
    std::vector<size_t> index_of;
    requests.reserve(keys.size());
    index_of.reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      Status valid = ValidateKey(keys[i], url_, /*strict=*/false);
      if (!valid.ok()) {
        cb(i, valid);
        continue;
      }
      requests.push_back(ObjectRequest("GET", keys[i]));
      index_of.push_back(i);
    }
    return client_->PerformMany(
        requests, max_in_flight > 0 ? max_in_flight : options_.max_in_flight,
        [&](size_t j, Result<HttpResponse> r) {
          if (!r.ok()) return cb(index_of[j], r.status());
          cb(index_of[j],
             BodyForRange(*client_, requests[j], std::move(r).value(), ByteRange{}));
        },
        &cancel);
  }

 private:
  HttpRequest ObjectRequest(std::string method, std::string_view key,
                            std::string_view query = "") const {
    HttpRequest r;
    r.method = std::move(method);
    r.url = bucket_url_ + "/" + UriEncode(root_, true) + UriEncode(key, true);
    if (!query.empty()) {
      r.url += "?";
      r.url += query;
    }
    r.what = KeyUrl(key);
    return r;
  }

  Result<uint64_t> SizeOf(std::string_view key) {
    HttpRequest req = ObjectRequest("HEAD", key);
    DDP_ASSIGN_OR_RETURN(HttpResponse resp, client_->Perform(req));
    if (resp.status / 100 != 2) return client_->ErrorFor(req, resp);
    return ContentLength(req, resp);
  }

  // Checks a 2xx answer that may still carry an <Error> (CompleteMultipartUpload).
  Status CheckAnswer(const HttpRequest& req, const HttpResponse& resp) const {
    std::string code, message;
    if (resp.status / 100 != 2 || ParseS3Error(resp.body, &code, &message)) {
      return client_->ErrorFor(req, resp);
    }
    return Status::Ok();
  }

  Status PutMultipart(std::string_view key, std::string_view data) {
    uint64_t part = std::max<uint64_t>(options_.multipart_part_size, kMinPartSize);
    part = std::max<uint64_t>(part, (data.size() + kMaxParts - 1) / kMaxParts);
    size_t n_parts = static_cast<size_t>((data.size() + part - 1) / part);

    HttpRequest init = ObjectRequest("POST", key, "uploads=");
    init.what = KeyUrl(key) + " (initiating multipart upload)";
    DDP_ASSIGN_OR_RETURN(HttpResponse init_resp, client_->Perform(init));
    DDP_RETURN_IF_ERROR(CheckAnswer(init, init_resp));
    DDP_ASSIGN_OR_RETURN(std::string upload_id, ParseUploadId(init_resp.body, init.what));
    std::string id_q = "uploadId=" + UriEncode(upload_id, false);

    std::vector<HttpRequest> parts(n_parts);
    for (size_t i = 0; i < n_parts; ++i) {
      parts[i] = ObjectRequest("PUT", key, "partNumber=" + std::to_string(i + 1) + "&" + id_q);
      parts[i].what = KeyUrl(key) + " (part " + std::to_string(i + 1) + " of " +
                      std::to_string(n_parts) + ")";
      size_t off = i * part;
      parts[i].body = data.substr(off, std::min<uint64_t>(part, data.size() - off));
    }
    std::vector<std::pair<int, std::string>> etags(n_parts);
    Status failed;
    Status batch = client_->PerformMany(
        parts, std::min<int>(8, std::max(1, options_.max_in_flight)),
        [&](size_t i, Result<HttpResponse> r) {
          if (!failed.ok()) return;
          if (!r.ok()) {
            failed = r.status();
            return;
          }
          if (Status s = CheckAnswer(parts[i], *r); !s.ok()) {
            failed = s;
            return;
          }
          const std::string* etag = r->Header("etag");
          if (etag == nullptr) {
            failed = DataLossError(parts[i].what + ": the answer has no ETag");
            return;
          }
          etags[i] = {static_cast<int>(i + 1), *etag};
        });
    if (!batch.ok() && failed.ok()) failed = batch;
    if (failed.ok()) {
      std::string body = CompleteMultipartXml(etags);
      HttpRequest complete = ObjectRequest("POST", key, id_q);
      complete.what = KeyUrl(key) + " (completing multipart upload)";
      complete.body = body;
      Result<HttpResponse> resp = client_->Perform(complete);
      failed = resp.ok() ? CheckAnswer(complete, *resp) : resp.status();
      if (failed.ok()) return Status::Ok();
    }
    // Abort so the parts stop costing storage; the upload's own error is what matters.
    HttpRequest abort = ObjectRequest("DELETE", key, id_q);
    abort.what = KeyUrl(key) + " (aborting multipart upload)";
    client_->Perform(abort).status().IgnoreError();
    return failed;
  }

  S3Config config_;
  std::string bucket_url_;
  std::string url_;
  std::string root_;  // "" or "prefix/"
  std::unique_ptr<CurlClient> client_;
  StoreOptions options_;
};

// The headers that sign `r` for S3: Host (sent as signed, not left to libcurl),
// x-amz-date (now), x-amz-content-sha256 (UNSIGNED-PAYLOAD: bodies are not hashed; TLS
// protects them), x-amz-security-token with temporary keys, and Authorization over
// those and every header the request carries.
Result<std::vector<std::string>> SignS3(SigV4Signer& signer, const HttpRequest& r,
                                        const std::vector<std::string>& headers, const SigningKeys& keys) {
  std::string_view rest = r.url;
  const size_t scheme = rest.find("://");
  if (scheme == std::string_view::npos) return InvalidArgumentError("SigV4: no scheme in " + RedactUrl(r.url));
  rest.remove_prefix(scheme + 3);
  const size_t slash = rest.find_first_of("/?");
  std::string_view host = rest.substr(0, slash);
  if (const size_t at = host.rfind('@'); at != std::string_view::npos) host.remove_prefix(at + 1);
  rest = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
  const size_t q = rest.find('?');
  const std::string_view path = rest.substr(0, q);
  const std::string_view query = q == std::string_view::npos ? std::string_view() : rest.substr(q + 1);

  constexpr std::string_view kPayload = "UNSIGNED-PAYLOAD";
  SigV4Request req{r.method, host, path, query, {}, kPayload};
  req.headers.reserve(headers.size() + 1);
  for (const std::string& h : headers) {
    const size_t colon = h.find(':');
    if (colon == std::string::npos) continue;  // "Name;" (sent empty): not signed
    std::string_view value = Trim(std::string_view(h).substr(colon + 1));
    if (value.empty()) continue;  // "Name:" removes a header libcurl would add
    req.headers.emplace_back(h.substr(0, colon), std::string(value));
  }
  req.headers.emplace_back("x-amz-content-sha256", std::string(kPayload));
  DDP_ASSIGN_OR_RETURN(SigV4Result s,
                       signer.Sign(req, {keys.access_key, keys.secret_key, keys.session_token},
                                   AmzDate(std::chrono::system_clock::now())));
  std::vector<std::string> out;
  out.reserve(5);
  out.push_back("Host: " + std::string(host));
  out.push_back("x-amz-date: " + s.amz_date);
  out.push_back("x-amz-content-sha256: " + std::string(kPayload));
  if (!keys.session_token.empty()) out.push_back("x-amz-security-token: " + keys.session_token);
  out.push_back("Authorization: " + s.authorization);
  return out;
}

}  // namespace

Result<std::unique_ptr<Store>> OpenS3Store(std::string_view url, const StoreOptions& options) {
  DDP_ASSIGN_OR_RETURN(S3Config config, ResolveS3Config(url, options, ProcessEnv()));
  DDP_RETURN_IF_ERROR(ValidateRetryOptions(options.retry));
  if (options.multipart_part_size == 0) {
    return InvalidArgumentError("multipart_part_size must be > 0 for " + RedactUrl(url));
  }
  ClientConfig cfg = ClientConfigFor(options);
  cfg.http_error = &S3Error;
  cfg.retryable_answer = [](const HttpResponse& r) { return S3Retryable(r, nullptr); };
  if (config.credentials || config.credential_source) {
    DDP_ASSIGN_OR_RETURN(std::shared_ptr<CredentialsProvider> provider,
                         MakeProvider(url, config, options));
    cfg.sign = [signer = std::make_shared<SigV4Signer>(config.region, "s3")](
                   const HttpRequest& r, const std::vector<std::string>& headers,
                   const SigningKeys& keys) { return SignS3(*signer, r, headers, keys); };
    cfg.signing_keys = [provider]() -> Result<SigningKeys> {
      DDP_ASSIGN_OR_RETURN(AwsCredentials c, provider->Get());
      return SigningKeys{std::move(c.access_key), std::move(c.secret_key),
                         std::move(c.session_token)};
    };
    if (config.credential_source) {
      cfg.retryable_answer = [provider](const HttpResponse& r) {
        return S3Retryable(r, provider.get());
      };
    }
  }
  DDP_ASSIGN_OR_RETURN(auto client, CurlClient::Create(std::move(cfg)));
  return std::unique_ptr<Store>(new S3Store(std::move(config), std::move(client), options));
}

}  // namespace ddp::store_internal
