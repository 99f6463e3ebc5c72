// The http(s):// back-end: the conformance suite against a live server when
// DDP_TEST_HTTP_URL (the server's base URL) and DDP_TEST_HTTP_ROOT (the directory it
// serves) are set, e.g. by tests/test_storage_http.py; server-less tests otherwise.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/process_testutil.h"
#include "ddp/store.h"
#include "store/conformance_testutil.h"
#include "store/http/curl_client.h"

namespace ddp {
namespace {

using ::ddp::testing::StoreConformanceTest;
using ::ddp::testing::StoreFactory;
using ::ddp::testing::StorePair;

// Writes through a file store in the served directory and keeps its "_index.txt"
// listing current, as a site publishing a dataset over HTTP would.
class IndexingWriter final : public Store {
 public:
  explicit IndexingWriter(std::unique_ptr<Store> files) : files_(std::move(files)) {}
  std::string url() const override { return files_->url(); }
  Result<std::vector<ObjectInfo>> List(std::string_view p) override { return files_->List(p); }
  Result<ObjectInfo> Stat(std::string_view k) override { return files_->Stat(k); }
  Result<std::string> Get(std::string_view k, ByteRange r) override { return files_->Get(k, r); }
  Status Put(std::string_view key, std::string_view data) override {
    DDP_RETURN_IF_ERROR(files_->Put(key, data));
    return Reindex();
  }
  Status Delete(std::string_view key) override {
    DDP_RETURN_IF_ERROR(files_->Delete(key));
    return Reindex();
  }

 private:
  Status Reindex() {
    DDP_ASSIGN_OR_RETURN(auto all, files_->List(""));
    std::string index;
    int n = 0;
    for (const ObjectInfo& o : all) {
      if (o.key == "_index.txt") continue;
      // Every other entry without its size, so List's HEAD path is exercised too.
      index += o.key;
      if (n++ % 2 == 0) index += "\t" + std::to_string(o.size);
      index += "\n";
    }
    return files_->Put("_index.txt", index);
  }
  std::unique_ptr<Store> files_;
};

Result<StorePair> OpenLiveHttp(const std::string& unique) {
  const char* url = std::getenv("DDP_TEST_HTTP_URL");
  const char* root = std::getenv("DDP_TEST_HTTP_ROOT");
  if (url == nullptr || root == nullptr) {
    return FailedPreconditionError(
        "no live server: set DDP_TEST_HTTP_URL and DDP_TEST_HTTP_ROOT to run these");
  }
  StoreOptions o;
  o.retry.initial_backoff_s = 0.01;
  DDP_ASSIGN_OR_RETURN(auto reader, OpenStore(std::string(url) + "/" + unique, o));
  DDP_ASSIGN_OR_RETURN(auto files, OpenStore(std::string(root) + "/" + unique));
  DDP_RETURN_IF_ERROR(files->Put("_index.txt", "# no objects yet\n"));
  return StorePair{std::move(reader), std::make_unique<IndexingWriter>(std::move(files))};
}

INSTANTIATE_TEST_SUITE_P(Http, StoreConformanceTest,
                         ::testing::Values(StoreFactory{"live", OpenLiveHttp, /*writable=*/false}),
                         ::ddp::testing::StoreFactoryName);

// A port nothing listens on (bound, then closed).
int ClosedPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::abort();
  }
  int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

TEST(HttpStoreTest, RefusedConnectionIsRetriedThenUnavailable) {
  StoreOptions o;
  o.retry.max_attempts = 3;
  o.retry.initial_backoff_s = 0.05;
  std::string base = "http://127.0.0.1:" + std::to_string(ClosedPort()) + "/data";
  auto s = OpenStore(base, o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto t0 = std::chrono::steady_clock::now();
  auto got = (*s)->Get("a/b.jpg");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), Code::kUnavailable) << got.status().ToString();
  EXPECT_NE(got.status().message().find(base + "/a/b.jpg"), std::string::npos)
      << got.status().ToString();
  EXPECT_NE(got.status().message().find("after 3 attempts"), std::string::npos)
      << got.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));

  std::vector<std::string> keys = {"x", "y", "z"};
  int calls = 0;
  Status batch = (*s)->GetMany(keys, [&](size_t i, Result<std::string> r) {
    ++calls;
    EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status().ToString();
    EXPECT_NE(r.status().message().find("/data/" + keys[i]), std::string::npos);
  });
  EXPECT_TRUE(batch.ok()) << batch.ToString();
  EXPECT_EQ(calls, 3);
}

// A real HTTP server on 127.0.0.1 answering every request with one canned answer
// (status line, headers and body as given), then closing the connection.
class CannedServer {
 public:
  explicit CannedServer(std::string answer) : answer_(std::move(answer)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        ::listen(fd_, 16) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      std::abort();
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~CannedServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  void Serve() {
    while (!stop_) {
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string request;
      char buf[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {
        ssize_t n = ::recv(c, buf, sizeof(buf), 0);
        if (n <= 0) break;
        request.append(buf, static_cast<size_t>(n));
      }
      size_t sent = 0;
      while (sent < answer_.size()) {
        ssize_t n = ::send(c, answer_.data() + sent, answer_.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += static_cast<size_t>(n);
      }
      ::close(c);
    }
  }
  std::string answer_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

void ExpectBodyLimitError(const Status& st, const std::string& url, const std::string& limit) {
  EXPECT_EQ(st.code(), Code::kResourceExhausted) << st.ToString();
  EXPECT_NE(st.message().find(url), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("limit of " + limit + " bytes"), std::string::npos) << st.ToString();
}

TEST(HttpStoreTest, HugeContentLengthFailsBeforeAllocating) {
  // 16 GiB - 1 announced, 3 bytes sent: refused from the header, under the default limit.
  CannedServer server("HTTP/1.1 200 OK\r\nContent-Length: 17179869183\r\n\r\nabc");
  StoreOptions o;
  o.retry.max_attempts = 2;
  auto s = OpenStore(server.url() + "/d", o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto got = (*s)->Get("big.bin");
  ASSERT_FALSE(got.ok());
  ExpectBodyLimitError(got.status(), server.url() + "/d/big.bin", std::to_string(2ull << 30));
  EXPECT_NE(got.status().message().find("17179869183"), std::string::npos) << got.status().ToString();
  std::vector<std::string> keys = {"a", "b"};
  int calls = 0;
  Status batch = (*s)->GetMany(keys, [&](size_t i, Result<std::string> r) {
    ++calls;
    ASSERT_FALSE(r.ok());
    ExpectBodyLimitError(r.status(), server.url() + "/d/" + keys[i], std::to_string(2ull << 30));
  });
  EXPECT_TRUE(batch.ok()) << batch.ToString();
  EXPECT_EQ(calls, 2);
}

TEST(HttpStoreTest, OversizeBodyWithoutLengthIsCutAtTheLimit) {
  // No Content-Length: the body runs to the connection's end; 1 MiB against a 64 KiB cap.
  CannedServer server("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + std::string(1 << 20, 'x'));
  StoreOptions o;
  o.max_body_bytes = 64 << 10;
  auto s = OpenStore(server.url(), o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto got = (*s)->Get("k");
  ASSERT_FALSE(got.ok());
  ExpectBodyLimitError(got.status(), server.url() + "/k", "65536");
  // Within the limit the same answer is fine.
  o.max_body_bytes = 2 << 20;
  auto roomy = OpenStore(server.url(), o);
  ASSERT_TRUE(roomy.ok());
  auto ok = (*roomy)->Get("k");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->size(), size_t{1} << 20);
}

TEST(HttpStoreTest, IsReadOnlyAndRejectsBadUrls) {
  auto s = OpenStore("http://127.0.0.1:1/x");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->Put("k", "v").code(), Code::kUnimplemented);
  EXPECT_EQ((*s)->Delete("k").code(), Code::kUnimplemented);
  for (std::string bad : {"http://", "https:///path", "http://host/x?q=1"}) {
    auto r = OpenStore(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().ToString();
  }
}

TEST(HttpStoreTest, CredentialsInTheUrlNeverReachMessages) {
  StoreOptions o;
  o.retry.max_attempts = 1;
  auto s = OpenStore("http://user:s3cret@127.0.0.1:" + std::to_string(ClosedPort()) + "/d", o);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->url().find("s3cret"), std::string::npos) << (*s)->url();
  auto got = (*s)->Get("k");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().message().find("s3cret"), std::string::npos) << got.status().ToString();
}

TEST(CurlClientTest, UriEncodeAndRedact) {
  using store_internal::UriEncode;
  EXPECT_EQ(UriEncode("a b/c+d~e_f.g-h", true), "a%20b/c%2Bd~e_f.g-h");
  EXPECT_EQ(UriEncode("a/b", false), "a%2Fb");
  EXPECT_EQ(UriEncode("\xc3\xa9", true), "%C3%A9");
  EXPECT_EQ(RedactUrl("https://u:p@host:1/x@y"), "https://host:1/x@y");
  EXPECT_EQ(RedactUrl("https://host/x@y"), "https://host/x@y");
}

TEST(CurlClientTest, AForkedChildGetsAnErrorNamingTheRequestAndLeaksTheHandles) {
  using store_internal::CurlClient;
  using store_internal::HttpRequest;
  using store_internal::HttpResponse;
  auto* client = CurlClient::Create(store_internal::ClientConfig{}).value().release();
  const ForkedChildEnd end = RunInForkedChild([&] {
    HttpRequest r;
    r.url = "http://127.0.0.1:9/x";
    r.what = "http://127.0.0.1:9/x";
    Result<HttpResponse> one = client->Perform(r);
    if (one.ok() || one.status().code() != Code::kOtherProcess) return 1;
    if (one.status().message().find(r.what) == std::string::npos ||
        one.status().message().find("fork()") == std::string::npos) {
      return 2;
    }
    std::vector<HttpRequest> many(3, r);
    int called = 0;
    const Status st = client->PerformMany(many, 2, [&](size_t, Result<HttpResponse> got) {
      if (!got.ok() && got.status().code() == Code::kOtherProcess) ++called;
    });
    if (st.code() != Code::kOtherProcess || called != 3) return 3;
    delete client;
    return 0;
  });
  EXPECT_FALSE(end.hung);
  EXPECT_EQ(end.signal, 0);
  EXPECT_EQ(end.exit_code, 0);
  delete client;
}

}  // namespace
}  // namespace ddp
