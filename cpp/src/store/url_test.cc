#include "store/url.h"

#include <gtest/gtest.h>

namespace ddp {
namespace {

void ExpectParse(std::string_view url, std::string_view scheme, std::string_view location,
                 bool local) {
  Result<StoreUrl> r = ParseStoreUrl(url);
  ASSERT_TRUE(r.ok()) << url << ": " << r.status().ToString();
  EXPECT_EQ(r->scheme, scheme) << url;
  EXPECT_EQ(r->location, location) << url;
  EXPECT_EQ(r->local, local) << url;
}

TEST(StoreUrl, FileUrlsAndPlainPaths) {
  ExpectParse("file:///data/x", "file", "/data/x", true);
  // RFC 8089: "localhost" is the local machine (Python used to read "localhost/x").
  ExpectParse("file://localhost/data/x", "file", "/data/x", true);
  ExpectParse("file://localhost", "file", "/", true);
  ExpectParse("FILE:///x", "file", "/x", true);
  ExpectParse("/abs/path", "file", "/abs/path", true);
  ExpectParse("relative/dir", "file", "relative/dir", true);
  ExpectParse("./a://b", "file", "./a://b", true);  // no scheme has '/' or '.' first
  ExpectParse("dir/x://y", "file", "dir/x://y", true);
}

TEST(StoreUrl, RemoteAndMemory) {
  ExpectParse("s3://bucket/prefix", "s3", "s3://bucket/prefix", false);
  ExpectParse("S3://bucket", "s3", "S3://bucket", false);
  ExpectParse("http://host:8080/base", "http", "http://host:8080/base", false);
  ExpectParse("https://host/base", "https", "https://host/base", false);
  ExpectParse("memory://name/pre", "memory", "name/pre", false);
  ExpectParse("memory://", "memory", "", false);
}

TEST(StoreUrl, ErrorsNameTheInput) {
  for (std::string_view bad : {"", "ftp://host/x", "gs://b/k", "file://otherhost/x"}) {
    Result<StoreUrl> r = ParseStoreUrl(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().ToString();
  }
  Status ftp = ParseStoreUrl("ftp://user:hunter2@host/x").status();
  EXPECT_NE(ftp.message().find("unsupported URL scheme 'ftp'"), std::string::npos) << ftp.ToString();
  EXPECT_NE(ftp.message().find("ftp://host/x"), std::string::npos) << ftp.ToString();
  EXPECT_EQ(ftp.message().find("hunter2"), std::string::npos) << ftp.ToString();
  for (const char* scheme : {"file://", "s3://", "http://", "https://", "memory://"}) {
    EXPECT_NE(ftp.message().find(scheme), std::string::npos) << ftp.ToString();
  }
  Status host = ParseStoreUrl("file://server/share").status();
  EXPECT_NE(host.message().find("file://server/share"), std::string::npos) << host.ToString();
  // OpenStore goes through the same parser.
  EXPECT_EQ(OpenStore("ftp://h/x").status().message(), ParseStoreUrl("ftp://h/x").status().message());
}

TEST(StoreUrl, EveryBackendIsRegisteredOnce) {
  using store_internal::Backends;
  using store_internal::FindBackend;
  EXPECT_EQ(Backends().size(), 5u);
  for (const auto& b : Backends()) EXPECT_EQ(FindBackend(b.scheme), &b);
  EXPECT_EQ(FindBackend("ftp"), nullptr);
  auto mem = OpenStore("memory://url-test");
  ASSERT_TRUE(mem.ok()) << mem.status().ToString();
  EXPECT_EQ((*mem)->url(), "memory://url-test");
}

TEST(StoreUrl, RedactRemovesUserInfoOnly) {
  EXPECT_EQ(RedactUrl("https://u:p@host:1/x@y"), "https://host:1/x@y");
  EXPECT_EQ(RedactUrl("https://host/x@y"), "https://host/x@y");
  EXPECT_EQ(RedactUrl("s3://AKIA:secret@bucket/p"), "s3://bucket/p");
  EXPECT_EQ(RedactUrl("http://u:p@host"), "http://host");
  EXPECT_EQ(RedactUrl("http://host?a=b@c"), "http://host?a=b@c");
  EXPECT_EQ(RedactUrl("http://u:p@host?a=b@c"), "http://host?a=b@c");
  EXPECT_EQ(RedactUrl("/plain/a@b"), "/plain/a@b");
}

}  // namespace
}  // namespace ddp
