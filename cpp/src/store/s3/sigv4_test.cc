#include "store/s3/sigv4.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace ddp::store_internal {
namespace {

// The AWS Signature Version 4 test suite (service "service", us-east-1, 2015-08-30) and
// the S3 documentation's examples (AKIAIOSFODNN7EXAMPLE, 2013-05-24): published
// requests with the canonical request, string to sign and signature AWS gives for them.
// S3 signs the path as sent, so the suite's path-normalising cases are left out.
constexpr char kEmpty[] = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
const SigV4Keys kSuiteKeys{"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", ""};
const SigV4Keys kS3Keys{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};

struct Vector {
  std::string name, method, path, query;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string payload_hash;
  std::string canonical_request;  // empty: not published for this case
  std::string string_to_sign;
  std::string signature;
  std::string session_token;
};

// The signed-headers line of a canonical request (the one before the payload hash).
std::string SignedHeadersOf(const std::string& creq) {
  const size_t last = creq.rfind('\n');
  const size_t before = creq.rfind('\n', last - 1);
  return creq.substr(before + 1, last - before - 1);
}

// Signs every vector with one signer and checks what AWS published for it, and the
// Authorization header; returns how many times the signer derived a key.
uint64_t CheckVectors(const std::vector<Vector>& vectors, const char* region, const char* service,
                      const SigV4Keys& keys, const char* host, const char* date) {
  SigV4Signer signer(region, service);
  const std::string credential = "AWS4-HMAC-SHA256 Credential=" + keys.access_key + "/" +
                                 std::string(date, 8) + "/" + region + "/" + service + "/aws4_request";
  for (const Vector& v : vectors) {
    SigV4Request r{v.method, host, v.path, v.query, v.headers, v.payload_hash};
    SigV4Keys k = keys;
    k.session_token = v.session_token;
    Result<SigV4Result> s = signer.Sign(r, k, date);
    if (!s.ok()) {
      ADD_FAILURE() << v.name << ": " << s.status().message();
      continue;
    }
    if (!v.canonical_request.empty()) {
      EXPECT_EQ(s->canonical_request, v.canonical_request) << v.name;
    }
    if (!v.string_to_sign.empty()) {
      EXPECT_EQ(s->string_to_sign, v.string_to_sign) << v.name;
    }
    EXPECT_EQ(s->signature, v.signature) << v.name;
    EXPECT_EQ(s->authorization, credential + ", SignedHeaders=" + SignedHeadersOf(s->canonical_request) +
                                    ", Signature=" + v.signature)
        << v.name;
  }
  return signer.derivations();
}

TEST(SigV4, AwsTestSuite) {
  const std::vector<Vector> vectors = {
      {"get-vanilla", "GET", "/", "", {}, kEmpty,
       "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n" +
           std::string(kEmpty),
       "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n"
       "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63",
       "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31", ""},
      {"get-vanilla-query-order-key-case", "GET", "/", "Param2=value2&Param1=value1", {}, kEmpty,
       "GET\n/\nParam1=value1&Param2=value2\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\n"
       "host;x-amz-date\n" + std::string(kEmpty),
       "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n"
       "816cd5b414d056048ba4f7c5386d6e0533120fb1fcfa93762cf0fc39e2cf19e0",
       "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500", ""},
      {"get-vanilla-query-order-encoded", "GET", "/", "Param-3=Value3&Param=Value2&\xE1\x88\xB4=Value1", {},
       kEmpty, "", "", "371d3713e185cc334048618a97f809c9ffe339c62934c032af5a0e595648fcac", ""},
      {"get-vanilla-query-unreserved", "GET", "/",
       "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz="
       "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
       {}, kEmpty, "", "", "9c3e54bfcdf0b19771a7f523ee5669cdf59bc7cc0884027167c21bb143a40197", ""},
      {"get-vanilla-utf8-query", "GET", "/", "\xE1\x88\xB4=bar", {}, kEmpty, "", "",
       "2cdec8eed098649ff3a119c94853b13c643bcf08f8b0a1d91e12c9027818dd04", ""},
      {"get-unreserved", "GET", "/-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", "", {},
       kEmpty, "", "", "07ef7494c76fa4850883e2b006601f940f8a34d404d0cfa977f52a65bbf5f24f", ""},
      {"get-utf8", "GET", "/\xE1\x88\xB4", "", {}, kEmpty,
       "GET\n/%E1%88%B4\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n" +
           std::string(kEmpty),
       "", "8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85", ""},
      // The same path sent already encoded signs the same (S3 does not encode twice).
      {"get-utf8 (encoded)", "GET", "/%e1%88%b4", "", {}, kEmpty, "", "",
       "8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85", ""},
      {"get-space-unnormalized", "GET", "/example space/", "", {}, kEmpty, "", "",
       "652487583200325589f1fba4c7e578f72c47cb61beeca81406b39ddec1366741", ""},
      {"get-slashes-unnormalized", "GET", "//example//", "", {}, kEmpty, "", "",
       "87cca117541a147f6df867677d98a7d80dff226d2bfca9e4ffa899665623c7e5", ""},
      {"get-relative-unnormalized", "GET", "/example/..", "", {}, kEmpty, "", "",
       "eca7ead57bb5aa5c8e28007acd4ff04e1ff9a0ff3b237ec1554a184887ff9282", ""},
      {"get-header-key-duplicate", "GET", "/", "",
       {{"My-Header1", "value2"}, {"My-Header1", "value2"}, {"My-Header1", "value1"}}, kEmpty,
       "GET\n/\n\nhost:example.amazonaws.com\nmy-header1:value2,value2,value1\nx-amz-date:20150830T123600Z\n\n"
       "host;my-header1;x-amz-date\n" + std::string(kEmpty),
       "", "c9d5ea9f3f72853aea855b47ea873832890dbdd183b4468f858259531a5138ea", ""},
      {"get-header-value-order", "GET", "/", "",
       {{"My-Header1", "value4"}, {"My-Header1", "value1"}, {"My-Header1", "value3"}, {"My-Header1", "value2"}},
       kEmpty, "", "", "08c7e5a9acfcfeb3ab6b2185e75ce8b1deb5e634ec47601a50643f830c755c01", ""},
      {"get-header-value-trim", "GET", "/", "", {{"My-Header1", " value1"}, {"My-Header2", " \"a   b   c\""}},
       kEmpty,
       "GET\n/\n\nhost:example.amazonaws.com\nmy-header1:value1\nmy-header2:\"a b c\"\n"
       "x-amz-date:20150830T123600Z\n\nhost;my-header1;my-header2;x-amz-date\n" + std::string(kEmpty),
       "", "acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736", ""},
      {"get-vanilla-with-session-token", "GET", "/", "", {}, kEmpty,
       "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n"
       "x-amz-security-token:6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267\n\n"
       "host;x-amz-date;x-amz-security-token\n" + std::string(kEmpty),
       "", "07ec1639c89043aa0e3e2de82b96708f198cceab042d4a97044c66dd9f74e7f8",
       "6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267"},
      {"post-vanilla", "POST", "/", "", {}, kEmpty, "", "",
       "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b", ""},
      {"post-vanilla-query", "POST", "/", "Param1=value1", {}, kEmpty, "", "",
       "28038455d6de14eafc1f9222cf5aa6f1a96197d7deb8263271d420d138af7f11", ""},
      {"post-header-value-case", "POST", "/", "", {{"My-Header1", "VALUE1"}}, kEmpty, "", "",
       "cdbc9802e29d2942e5e10b5bccfdd67c5f22c7c4e8ae67b53629efa58b974b7d", ""},
      {"post-x-www-form-urlencoded", "POST", "/", "",
       {{"Content-Type", "application/x-www-form-urlencoded"},
        {"Content-Length", "13"},
        {"x-amz-content-sha256", "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e"}},
       "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e",
       "POST\n/\n\ncontent-length:13\ncontent-type:application/x-www-form-urlencoded\nhost:example.amazonaws.com\n"
       "x-amz-content-sha256:9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e\n"
       "x-amz-date:20150830T123600Z\n\ncontent-length;content-type;host;x-amz-content-sha256;x-amz-date\n"
       "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e",
       "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n"
       "b1edd1d03544c25390e32085d55b57acc9a3961bb59415ff86c45c3d89d16cfb",
       "d3875051da38690788ef43de4db0d8f280229d82040bfac253562e56c3f20e0b", ""},
  };
  // One day, one key: derived once.
  EXPECT_EQ(CheckVectors(vectors, "us-east-1", "service", kSuiteKeys, "example.amazonaws.com", "20150830T123600Z"),
            1u);
}

TEST(SigV4, S3DocumentationExamples) {
  const std::string welcome = Sha256Hex("Welcome to Amazon S3.");
  const std::vector<Vector> vectors = {
      {"GET object, ranged", "GET", "/test.txt", "", {{"Range", "bytes=0-9"}, {"x-amz-content-sha256", kEmpty}},
       kEmpty,
       "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\nx-amz-content-sha256:" +
           std::string(kEmpty) + "\nx-amz-date:20130524T000000Z\n\nhost;range;x-amz-content-sha256;x-amz-date\n" +
           kEmpty,
       "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n"
       "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972",
       "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41", ""},
      {"PUT object", "PUT", "/test%24file.text", "",
       {{"Date", "Fri, 24 May 2013 00:00:00 GMT"},
        {"x-amz-storage-class", "REDUCED_REDUNDANCY"},
        {"x-amz-content-sha256", welcome}},
       welcome, "", "", "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd", ""},
      {"GET bucket lifecycle", "GET", "/", "lifecycle", {{"x-amz-content-sha256", kEmpty}}, kEmpty, "", "",
       "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543", ""},
      {"GET bucket (list objects)", "GET", "/", "max-keys=2&prefix=J", {{"x-amz-content-sha256", kEmpty}}, kEmpty,
       "", "", "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7", ""},
  };
  CheckVectors(vectors, "us-east-1", "s3", kS3Keys, "examplebucket.s3.amazonaws.com", "20130524T000000Z");
  EXPECT_EQ(Sha256Hex(""), kEmpty);
  EXPECT_EQ(welcome, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
}

TEST(SigV4, DerivedKeyIsCachedPerDateAndSecret) {
  SigV4Signer signer("us-east-1", "s3");
  SigV4Request r{"GET", "h", "/k", "", {}, "UNSIGNED-PAYLOAD"};
  const SigV4Keys a{"AK", "secret-a", ""}, b{"AK", "secret-b", ""};
  const std::string s1 = signer.Sign(r, a, "20261123T000001Z")->signature;
  const std::string s2 = signer.Sign(r, a, "20261123T235959Z")->signature;
  EXPECT_EQ(signer.derivations(), 1u);
  EXPECT_NE(s1, s2);  // the time is signed even when the key is reused
  signer.Sign(r, a, "20261124T000000Z").status().IgnoreError();
  EXPECT_EQ(signer.derivations(), 2u);  // a new day
  const std::string sb = signer.Sign(r, b, "20261124T000000Z")->signature;
  EXPECT_EQ(signer.derivations(), 3u);  // a new secret (rotated temporary keys)
  // A key taken from the cache signs exactly as a freshly derived one.
  SigV4Signer fresh("us-east-1", "s3");
  EXPECT_EQ(fresh.Sign(r, a, "20261123T235959Z")->signature, s2);
  EXPECT_EQ(fresh.Sign(r, b, "20261124T000000Z")->signature, sb);
}

TEST(SigV4, SignsFromManyThreads) {
  SigV4Signer signer("eu-west-1", "s3");
  SigV4Request r{"GET", "h:9000", "/b/k", "", {{"Range", "bytes=0-"}}, "UNSIGNED-PAYLOAD"};
  const std::string want = SigV4Signer("eu-west-1", "s3").Sign(r, {"AK", "s", ""}, "20261123T000000Z")->signature;
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const SigV4Keys k{"AK", (i + t) % 2 == 0 ? "s" : "other", ""};
        Result<SigV4Result> s = signer.Sign(r, k, "20261123T000000Z");
        if (!s.ok() || (k.secret_key == "s" && s->signature != want)) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(SigV4, RejectsAMalformedDate) {
  SigV4Signer signer("us-east-1", "s3");
  SigV4Request r{"GET", "h", "/", "", {}, "UNSIGNED-PAYLOAD"};
  Result<SigV4Result> s = signer.Sign(r, {"AK", "s", ""}, "2026-11-23");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kInvalidArgument);
  EXPECT_NE(s.status().message().find("2026-11-23"), std::string::npos);
  EXPECT_EQ(AmzDate(std::chrono::system_clock::time_point(std::chrono::seconds(1440938160))), "20150830T123600Z");
}

}  // namespace
}  // namespace ddp::store_internal
