#include "store/http/curl_client.h"

#include <curl/curl.h>
#include <pthread.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <queue>
#include <thread>

#include "store/retry.h"
#include "store/text.h"

namespace ddp::store_internal {
namespace {

using Clock = std::chrono::steady_clock;

// curl_global_init is not thread-safe: it runs once, under g_init_mu. fork() takes
// g_init_mu first (the handlers below, registered as the library loads, before any
// thread can start an init), so a child never finds an init half done; a function-local
// static would leave its guard taken in a child forked during the first init, and the
// child's first store would wait for it for ever.
std::mutex g_init_mu;
bool g_init_done = false;
CURLcode g_init_rc = CURLE_OK;
const int g_atfork_rc = pthread_atfork([] { g_init_mu.lock(); }, [] { g_init_mu.unlock(); },
                                       [] { g_init_mu.unlock(); });

Status GlobalInit() {
  if (g_atfork_rc != 0) {
    return InternalError(std::string("pthread_atfork for libcurl's init failed: ") +
                         std::strerror(g_atfork_rc));
  }
  std::lock_guard<std::mutex> lock(g_init_mu);
  if (!g_init_done) {
    g_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
    g_init_done = true;
  }
  if (g_init_rc != CURLE_OK) {
    return InternalError(std::string("curl_global_init failed: ") + curl_easy_strerror(g_init_rc));
  }
  return Status::Ok();
}

// One attempt's state; lives while the transfer runs.
struct Transfer {
  size_t index = 0;
  int attempt = 0;  // 1 for the first
  CURL* easy = nullptr;
  const HttpRequest* request = nullptr;
  HttpResponse response;
  curl_slist* headers = nullptr;
  std::array<char, CURL_ERROR_SIZE> errbuf{};
  uint64_t max_body = 0;  // ClientConfig::max_body_bytes
  Status abort;           // why a callback aborted the transfer, if one did

  ~Transfer() { curl_slist_free_all(headers); }
};

// libcurl's callbacks are called from its C frames: nothing may propagate out of them.
// Each one catches everything, records why in the Transfer and returns the value that
// makes libcurl abort the transfer (CURLE_WRITE_ERROR); Evaluate reports the reason.
void AbortTransfer(Transfer* t, Status why) {
  if (t->abort.ok()) t->abort = std::move(why);
}

Status BodyTooLarge(const Transfer& t, std::string_view what_size) {
  const HttpRequest& r = *t.request;
  return ResourceExhaustedError(r.what + ": " + r.method + " " + RedactUrl(r.url) + ": answer body " +
                                std::string(what_size) + " is over the limit of " +
                                std::to_string(t.max_body) + " bytes (store option max_body_bytes)");
}

// Runs a callback's body; anything it throws aborts the transfer (returns 0) with the
// reason recorded, never unwinding into libcurl.
template <typename Body>
size_t Guarded(Transfer* t, const char* receiving, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::exception& e) {
    AbortTransfer(t, ResourceExhaustedError(t->request->what + ": " + RedactUrl(t->request->url) +
                                            ": receiving the " + receiving + " failed: " + e.what()));
  } catch (...) {
    AbortTransfer(t, InternalError(t->request->what + ": receiving the " + receiving + " failed"));
  }
  return 0;
}

size_t OnBody(char* data, size_t size, size_t n, void* user) noexcept {
  auto* t = static_cast<Transfer*>(user);
  return Guarded(t, "body", [&]() -> size_t {
    const size_t len = size * n;
    if (t->response.body.size() + len > t->max_body) {
      AbortTransfer(t, BodyTooLarge(*t, "of more than " + std::to_string(t->response.body.size() + len) +
                                            " bytes"));
      return 0;
    }
    t->response.body.append(data, len);
    return len;
  });
}

size_t OnHeader(char* data, size_t size, size_t n, void* user) noexcept {
  auto* t = static_cast<Transfer*>(user);
  return Guarded(t, "headers", [&]() -> size_t {
    std::string_view line(data, size * n);
    if (line.starts_with("HTTP/")) {  // a new status line (after 100 Continue): start over
      t->response.headers.clear();
      return size * n;
    }
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) return size * n;
    std::string name = Lower(Trim(line.substr(0, colon)));
    std::string value(Trim(line.substr(colon + 1)));
    if (name == "content-length" && t->request->method != "HEAD") {
      // Allocate the body once, within the limit; the value is checked again when the
      // transfer ends.
      char* end = nullptr;
      unsigned long long len = std::strtoull(value.c_str(), &end, 10);
      if (end != value.c_str()) {
        if (len > t->max_body) {
          AbortTransfer(t, BodyTooLarge(*t, "announced as " + value + " bytes (Content-Length)"));
          return 0;
        }
        t->response.body.reserve(len);
      }
    }
    t->response.headers.emplace_back(std::move(name), std::move(value));
    return size * n;
  });
}

// What a failed transport means and whether another attempt may succeed.
struct CurlFailure {
  Code code;
  bool retryable;
};

CurlFailure ClassifyCurl(CURLcode rc) {
  switch (rc) {
    case CURLE_OPERATION_TIMEDOUT: return {Code::kDeadlineExceeded, true};
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM: return {Code::kUnavailable, true};
    case CURLE_PARTIAL_FILE: return {Code::kDataLoss, true};  // body shorter than announced
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_URL_MALFORMAT: return {Code::kInvalidArgument, false};
    case CURLE_OUT_OF_MEMORY: return {Code::kResourceExhausted, false};
    case CURLE_ABORTED_BY_CALLBACK: return {Code::kCancelled, false};
    default: return {Code::kUnavailable, false};  // TLS, proxy, protocol errors
  }
}

}  // namespace

const std::string* HttpResponse::Header(std::string_view lower_name) const {
  for (const auto& [k, v] : headers) {
    if (k == lower_name) return &v;
  }
  return nullptr;
}

ClientConfig ClientConfigFor(const StoreOptions& options) {
  ClientConfig cfg;
  cfg.retry = options.retry;
  cfg.connect_timeout_s = options.connect_timeout_s;
  cfg.low_speed_timeout_s = options.low_speed_timeout_s;
  cfg.ca_bundle = options.ca_bundle;
  cfg.max_body_bytes = options.max_body_bytes;
  return cfg;
}

Code CodeForHttpStatus(long status) {
  switch (status) {
    case 400: return Code::kInvalidArgument;
    case 401: return Code::kUnauthenticated;
    case 403: return Code::kPermissionDenied;
    case 404:
    case 410: return Code::kNotFound;
    case 405:
    case 501: return Code::kUnimplemented;
    case 408: return Code::kDeadlineExceeded;
    case 409:
    case 412: return Code::kFailedPrecondition;
    case 416: return Code::kOutOfRange;
    case 429: return Code::kUnavailable;
    default: break;
  }
  if (status >= 500) return Code::kUnavailable;
  if (status >= 300 && status < 400) return Code::kFailedPrecondition;  // redirects not followed
  if (status >= 400) return Code::kInvalidArgument;
  return Code::kInternal;
}

Status HttpStatusError(const HttpRequest& request, long status, std::string_view detail) {
  std::string m = request.what + ": HTTP " + std::to_string(status);
  if (!detail.empty()) {
    m += " ";
    m += detail;
  }
  m += " (" + request.method + " " + RedactUrl(request.url) + ")";
  return {CodeForHttpStatus(status), std::move(m)};
}

std::string UriEncode(std::string_view s, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() + s.size() / 4);
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// ---- Impl ----------------------------------------------------------------------------

struct CurlClient::Impl {
  CURLSH* share = nullptr;
  std::array<std::mutex, CURL_LOCK_DATA_LAST> share_locks;

  std::mutex pool_mu;
  std::vector<CURL*> easy_pool;
  // A multi handle with the easy handles it uses; its connection cache persists
  // between batches.
  struct MultiContext {
    CURLM* multi = nullptr;
    std::vector<CURL*> easies;
  };
  std::vector<MultiContext> multi_pool;

  ~Impl() {
    for (CURL* e : easy_pool) curl_easy_cleanup(e);
    for (MultiContext& m : multi_pool) {
      for (CURL* e : m.easies) curl_easy_cleanup(e);
      curl_multi_cleanup(m.multi);
    }
    if (share) curl_share_cleanup(share);
  }

  // Called from libcurl's C frames: noexcept, so a failing lock (std::system_error, which
  // only a broken mutex throws) terminates instead of unwinding through C.
  static void Lock(CURL*, curl_lock_data data, curl_lock_access, void* user) noexcept {
    static_cast<Impl*>(user)->share_locks[static_cast<size_t>(data)].lock();
  }
  static void Unlock(CURL*, curl_lock_data data, void* user) noexcept {
    static_cast<Impl*>(user)->share_locks[static_cast<size_t>(data)].unlock();
  }

  CURL* TakeEasy() {
    {
      std::lock_guard<std::mutex> lock(pool_mu);
      if (!easy_pool.empty()) {
        CURL* e = easy_pool.back();
        easy_pool.pop_back();
        return e;
      }
    }
    return curl_easy_init();
  }
  void ReturnEasy(CURL* e) {
    std::lock_guard<std::mutex> lock(pool_mu);
    easy_pool.push_back(e);
  }
  MultiContext TakeMulti() {
    {
      std::lock_guard<std::mutex> lock(pool_mu);
      if (!multi_pool.empty()) {
        MultiContext m = std::move(multi_pool.back());
        multi_pool.pop_back();
        return m;
      }
    }
    return MultiContext{curl_multi_init(), {}};
  }
  void ReturnMulti(MultiContext m) {
    std::lock_guard<std::mutex> lock(pool_mu);
    multi_pool.push_back(std::move(m));
  }
};

CurlClient::CurlClient(ClientConfig config)
    : config_(std::move(config)), impl_(std::make_unique<Impl>()) {}

CurlClient::~CurlClient() {
  if (owner_.here()) return;  // impl_ frees the handles
  // A fork()ed child: the handles' connections are the parent's sockets, and closing them
  // would end the parent's TLS sessions (a close_notify on the shared socket); the share's
  // locks may be held by a parent's thread. Leaked (common/process.h).
  Leak(std::move(impl_));
}

Status CurlClient::CheckProcess(const std::string& what) const {
  return owner_.Check("the store", "open it again in this process (dask_ddp.storage.open)")
      .WithContext(what);
}

Result<std::unique_ptr<CurlClient>> CurlClient::Create(ClientConfig config) {
  DDP_RETURN_IF_ERROR(GlobalInit());
  DDP_RETURN_IF_ERROR(ValidateRetryOptions(config.retry));
  if (config.ca_bundle.empty()) {
    if (const char* env = std::getenv("AWS_CA_BUNDLE"); env != nullptr) config.ca_bundle = env;
  }
  std::unique_ptr<CurlClient> c(new CurlClient(std::move(config)));
  Impl* impl = c->impl_.get();
  impl->share = curl_share_init();
  if (impl->share == nullptr) return InternalError("curl_share_init failed");
  bool ok = curl_share_setopt(impl->share, CURLSHOPT_LOCKFUNC, &Impl::Lock) == CURLSHE_OK &&
            curl_share_setopt(impl->share, CURLSHOPT_UNLOCKFUNC, &Impl::Unlock) == CURLSHE_OK &&
            curl_share_setopt(impl->share, CURLSHOPT_USERDATA, impl) == CURLSHE_OK &&
            curl_share_setopt(impl->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS) == CURLSHE_OK &&
            curl_share_setopt(impl->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION) ==
                CURLSHE_OK;
  if (!ok) return InternalError("configuring the curl share handle failed");
  return c;
}

Status CurlClient::ErrorFor(const HttpRequest& request, const HttpResponse& response) const {
  if (config_.http_error) return config_.http_error(request, response);
  return HttpStatusError(request, response.status, "");
}

namespace {

bool HasHeader(const std::vector<std::string>& headers, std::string_view lower_name) {
  for (const std::string& h : headers) {
    size_t colon = h.find(':');
    if (colon != std::string::npos && Lower(std::string_view(h).substr(0, colon)) == lower_name) {
      return true;
    }
  }
  return false;
}

// Sets every option of one attempt on a (reset) easy handle. Returns the option libcurl
// refused, if any (kInternal), or why the signing keys cannot be had. A reused handle can
// refuse an option after a failed transfer (libcurl 7.88 rejects CURLOPT_BUFFERSIZE after
// a failed name resolution): ConfigureOrRenew then starts over on a new handle.
Status Configure(CURL* e, Transfer* t, const ClientConfig& cfg, CURLSH* share) {
  const HttpRequest& r = *t->request;
  curl_easy_reset(e);
  Status ok;
  auto set = [&](CURLoption opt, auto value) {
    if (!ok.ok()) return;
    CURLcode rc = curl_easy_setopt(e, opt, value);
    if (rc != CURLE_OK) {
      ok = InternalError(r.what + ": libcurl refused option " +
                         std::to_string(static_cast<int>(opt)) + ": " + curl_easy_strerror(rc));
    }
  };
  set(CURLOPT_URL, r.url.c_str());
  set(CURLOPT_NOSIGNAL, 1L);
  set(CURLOPT_SHARE, share);
  set(CURLOPT_ERRORBUFFER, t->errbuf.data());
  set(CURLOPT_WRITEFUNCTION, &OnBody);
  set(CURLOPT_WRITEDATA, static_cast<void*>(t));
  set(CURLOPT_HEADERFUNCTION, &OnHeader);
  set(CURLOPT_HEADERDATA, static_cast<void*>(t));
  set(CURLOPT_BUFFERSIZE, 256L * 1024L);
  set(CURLOPT_TCP_NODELAY, 1L);
  set(CURLOPT_TCP_KEEPALIVE, 1L);
  set(CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(cfg.connect_timeout_s * 1000));
  // Abort a transfer that moves less than 1 byte/s for this long (then retry it).
  set(CURLOPT_LOW_SPEED_LIMIT, 1L);
  set(CURLOPT_LOW_SPEED_TIME, std::max(1L, static_cast<long>(cfg.low_speed_timeout_s)));
  set(CURLOPT_FOLLOWLOCATION, 0L);
  set(CURLOPT_PATH_AS_IS, 1L);  // keys may hold "..", which must not be squashed
  set(CURLOPT_PROTOCOLS_STR, "http,https");
  if (!cfg.ca_bundle.empty()) set(CURLOPT_CAINFO, cfg.ca_bundle.c_str());
  if (cfg.no_proxy) set(CURLOPT_NOPROXY, "*");

  std::vector<std::string> headers = cfg.extra_headers;
  headers.insert(headers.end(), r.headers.begin(), r.headers.end());
  if (r.method == "HEAD") {
    set(CURLOPT_NOBODY, 1L);
  } else if (r.method == "GET") {
    set(CURLOPT_HTTPGET, 1L);
  } else if (r.method == "PUT" || r.method == "POST") {
    if (r.method == "PUT") set(CURLOPT_CUSTOMREQUEST, "PUT");
    set(CURLOPT_POST, 1L);
    set(CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(r.body.size()));
    set(CURLOPT_POSTFIELDS, r.body.empty() ? "" : r.body.data());
    // Not form-encoded. libcurl adds "Expect: 100-continue" to large bodies (unsigned,
    // which servers accept); the wait for "100 Continue" is cut short.
    if (!HasHeader(r.headers, "content-type")) headers.emplace_back("Content-Type: application/octet-stream");
    set(CURLOPT_EXPECT_100_TIMEOUT_MS, 1L);
  } else {
    set(CURLOPT_CUSTOMREQUEST, r.method.c_str());
  }
  if (cfg.sign) {
    if (!cfg.signing_keys) return FailedPreconditionError(r.what + ": signed request without keys");
    Result<SigningKeys> keys = cfg.signing_keys();
    if (!keys.ok()) return keys.status().WithContext(r.what);
    Result<std::vector<std::string>> signed_headers = cfg.sign(r, headers, *keys);
    if (!signed_headers.ok()) return signed_headers.status().WithContext(r.what);
    headers.insert(headers.end(), signed_headers->begin(), signed_headers->end());
  }
  for (const std::string& h : headers) t->headers = curl_slist_append(t->headers, h.c_str());
  set(CURLOPT_HTTPHEADER, t->headers);
  return ok;
}

// Configure, on a new easy handle (replacing *e) if the reused one refuses an option.
Status ConfigureOrRenew(CURL** e, Transfer* t, const ClientConfig& cfg, CURLSH* share) {
  Status first = Configure(*e, t, cfg, share);
  if (first.code() != Code::kInternal) return first;  // OK, or no signing keys
  curl_easy_cleanup(*e);
  *e = curl_easy_init();
  if (*e == nullptr) return ResourceExhaustedError(t->request->what + ": curl_easy_init failed");
  return Configure(*e, t, cfg, share);
}

// The outcome of one finished attempt.
struct Outcome {
  Status error;      // OK: the response is final and usable by the caller
  bool retry = false;
};

Outcome Evaluate(CURLcode rc, Transfer* t, CURL* e, const CurlClient& client) {
  const HttpRequest& r = *t->request;
  if (!t->abort.ok()) return {t->abort, false};  // a callback's reason, never retried
  if (rc != CURLE_OK) {
    CurlFailure f = ClassifyCurl(rc);
    std::string detail = t->errbuf[0] != '\0' ? t->errbuf.data() : curl_easy_strerror(rc);
    std::string m = r.what + ": " + r.method + " " + RedactUrl(r.url) + " failed: " + detail;
    if (rc == CURLE_PARTIAL_FILE) {
      m += " (connection closed after " + std::to_string(t->response.body.size()) +
           " body bytes; the answer announced more)";
    }
    return {Status(f.code, std::move(m)), f.retryable};
  }
  long status = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
  t->response.status = status;
  if (status / 100 != 2) {
    const ClientConfig& cfg = client.config();
    bool retry = cfg.retryable_answer ? cfg.retryable_answer(t->response)
                                      : IsRetryableHttpStatus(status);
    if (retry) return {client.ErrorFor(r, t->response), true};
  }
  if (status / 100 == 2 && r.method != "HEAD") {
    // libcurl reports a body shorter than Content-Length as CURLE_PARTIAL_FILE; check
    // again so a short read can never pass as data.
    if (const std::string* cl = t->response.Header("content-length")) {
      unsigned long long want = std::strtoull(cl->c_str(), nullptr, 10);
      if (want != t->response.body.size()) {
        return {DataLossError(r.what + ": " + r.method + " " + RedactUrl(r.url) + ": received " +
                              std::to_string(t->response.body.size()) + " of " +
                              std::to_string(want) + " announced bytes"),
                true};
      }
    }
  }
  return {Status::Ok(), false};
}

Status WithAttempts(const Status& s, int attempts) {
  if (attempts <= 1) return s;
  return Status(s.code(), s.message() + " (gave up after " + std::to_string(attempts) +
                              " attempts)");
}

std::chrono::duration<double> Backoff(int retry, const RetryOptions& o) {
  return std::chrono::duration<double>(BackoffSeconds(retry, o, RandomUnit()));
}

}  // namespace

Result<HttpResponse> CurlClient::Perform(const HttpRequest& request) {
  DDP_RETURN_IF_ERROR(CheckProcess(request.what));
  CURL* e = impl_->TakeEasy();
  if (e == nullptr) return ResourceExhaustedError(request.what + ": curl_easy_init failed");
  Status last;
  for (int attempt = 1; attempt <= config_.retry.max_attempts; ++attempt) {
    if (attempt > 1) std::this_thread::sleep_for(Backoff(attempt - 1, config_.retry));
    Transfer t;
    t.attempt = attempt;
    t.request = &request;
    t.max_body = config_.max_body_bytes;
    if (Status st = ConfigureOrRenew(&e, &t, config_, impl_->share); !st.ok()) {
      if (e != nullptr) curl_easy_cleanup(e);
      return st;
    }
    CURLcode rc = curl_easy_perform(e);
    Outcome o = Evaluate(rc, &t, e, *this);
    if (o.error.ok()) {
      impl_->ReturnEasy(e);
      return std::move(t.response);
    }
    last = o.error;
    if (!o.retry) {
      impl_->ReturnEasy(e);
      return last;
    }
  }
  impl_->ReturnEasy(e);
  return WithAttempts(last, config_.retry.max_attempts);
}

Status CurlClient::PerformMany(std::span<const HttpRequest> requests, int max_in_flight,
                               const DoneCallback& done, const std::atomic<bool>* cancel) {
  if (requests.empty()) return Status::Ok();
  if (Status st = CheckProcess(requests[0].what); !st.ok()) {
    for (size_t i = 0; i < requests.size(); ++i) done(i, CheckProcess(requests[i].what));
    return st;
  }
  max_in_flight = std::max(1, max_in_flight);
  Impl::MultiContext ctx = impl_->TakeMulti();
  if (ctx.multi == nullptr) return ResourceExhaustedError("curl_multi_init failed");
  CURLMcode mc =
      curl_multi_setopt(ctx.multi, CURLMOPT_MAXCONNECTS, static_cast<long>(max_in_flight));
  if (mc != CURLM_OK) {
    impl_->ReturnMulti(std::move(ctx));
    return InternalError(std::string("curl_multi_setopt: ") + curl_multi_strerror(mc));
  }

  std::vector<int> attempts(requests.size(), 0);
  std::deque<size_t> ready;
  for (size_t i = 0; i < requests.size(); ++i) ready.push_back(i);
  using Delayed = std::pair<Clock::time_point, size_t>;
  std::priority_queue<Delayed, std::vector<Delayed>, std::greater<>> delayed;
  std::vector<std::unique_ptr<Transfer>> active;  // owned while in flight
  std::vector<CURL*> idle = std::move(ctx.easies);
  size_t remaining = requests.size();
  Status batch;

  auto finish = [&](size_t index, Result<HttpResponse> r) {
    --remaining;
    done(index, std::move(r));
  };
  auto start = [&](size_t index) -> Status {
    CURL* e;
    if (!idle.empty()) {
      e = idle.back();
      idle.pop_back();
    } else {
      e = curl_easy_init();
      if (e == nullptr) return ResourceExhaustedError(requests[index].what + ": curl_easy_init failed");
    }
    auto t = std::make_unique<Transfer>();
    t->index = index;
    t->easy = e;
    t->attempt = ++attempts[index];
    t->request = &requests[index];
    t->max_body = config_.max_body_bytes;
    Status st = ConfigureOrRenew(&e, t.get(), config_, impl_->share);
    t->easy = e;
    if (st.ok() && (curl_easy_setopt(e, CURLOPT_PRIVATE, t.get()) != CURLE_OK ||
                    curl_multi_add_handle(ctx.multi, e) != CURLM_OK)) {
      st = InternalError(requests[index].what + ": starting a curl transfer failed");
    }
    if (!st.ok()) {
      if (e != nullptr) idle.push_back(e);
      return st;
    }
    active.push_back(std::move(t));
    return Status::Ok();
  };

  while (remaining > 0) {
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
      batch = CancelledError("batched request of " + std::to_string(requests.size()) +
                             " objects cancelled");
      break;
    }
    Clock::time_point now = Clock::now();
    while (!delayed.empty() && delayed.top().first <= now) {
      ready.push_back(delayed.top().second);
      delayed.pop();
    }
    while (!ready.empty() && static_cast<int>(active.size()) < max_in_flight) {
      size_t index = ready.front();
      ready.pop_front();
      if (Status st = start(index); !st.ok()) finish(index, std::move(st));
    }
    int running = 0;
    mc = curl_multi_perform(ctx.multi, &running);
    if (mc != CURLM_OK) {
      batch = InternalError(std::string("curl_multi_perform: ") + curl_multi_strerror(mc));
      break;
    }
    int queued = 0;
    while (CURLMsg* msg = curl_multi_info_read(ctx.multi, &queued)) {
      if (msg->msg != CURLMSG_DONE) continue;
      CURL* e = msg->easy_handle;
      CURLcode rc = msg->data.result;
      Transfer* t = nullptr;
      curl_easy_getinfo(e, CURLINFO_PRIVATE, &t);
      curl_multi_remove_handle(ctx.multi, e);
      idle.push_back(e);
      auto it = std::find_if(active.begin(), active.end(),
                             [t](const std::unique_ptr<Transfer>& a) { return a.get() == t; });
      std::unique_ptr<Transfer> owned = std::move(*it);
      *it = std::move(active.back());
      active.pop_back();
      Outcome o = Evaluate(rc, owned.get(), e, *this);
      if (o.error.ok()) {
        finish(owned->index, std::move(owned->response));
      } else if (o.retry && owned->attempt < config_.retry.max_attempts) {
        delayed.emplace(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           Backoff(owned->attempt, config_.retry)),
                        owned->index);
      } else {
        finish(owned->index, o.retry ? WithAttempts(o.error, owned->attempt) : o.error);
      }
    }
    if (remaining == 0) break;
    int timeout_ms = 1000;
    if (active.empty() && ready.empty() && !delayed.empty()) {
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(delayed.top().first -
                                                                        Clock::now());
      timeout_ms = static_cast<int>(std::clamp<int64_t>(wait.count(), 0, 1000));
    } else if (!delayed.empty()) {
      timeout_ms = 10;  // wake up for a retry coming due while others are in flight
    }
    if (!ready.empty() && static_cast<int>(active.size()) < max_in_flight) continue;
    mc = curl_multi_poll(ctx.multi, nullptr, 0, timeout_ms, nullptr);
    if (mc != CURLM_OK) {
      batch = InternalError(std::string("curl_multi_poll: ") + curl_multi_strerror(mc));
      break;
    }
  }
  if (!batch.ok()) {
    // Cancelled, or a failure of the multi interface itself (out of memory, a broken
    // poll): every request not done yet gets the batch error. After a failure the multi
    // context is dropped instead of pooled, its handles being in an unknown state.
    bool cancelled = batch.code() == Code::kCancelled;
    for (std::unique_ptr<Transfer>& t : active) {
      curl_multi_remove_handle(ctx.multi, t->easy);
      if (cancelled) {
        idle.push_back(t->easy);
      } else {
        curl_easy_cleanup(t->easy);
      }
      finish(t->index, Status(batch.code(), t->request->what + ": " + batch.message()));
    }
    for (size_t index : ready) {
      finish(index, Status(batch.code(), requests[index].what + ": " + batch.message()));
    }
    while (!delayed.empty()) {
      size_t index = delayed.top().second;
      finish(index, Status(batch.code(), requests[index].what + ": " + batch.message()));
      delayed.pop();
    }
    if (!cancelled) {
      for (CURL* e : idle) curl_easy_cleanup(e);
      curl_multi_cleanup(ctx.multi);
      return batch;
    }
  }
  ctx.easies = std::move(idle);
  impl_->ReturnMulti(std::move(ctx));
  return batch;
}

}  // namespace ddp::store_internal
