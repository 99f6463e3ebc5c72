#include "shards/tar.h"

#include <gtest/gtest.h>

#include "shards/tar_testutil.h"

namespace ddp::shards {
namespace {

using testing::GnuLongMember;
using testing::PaxMember;
using testing::TarEnd;
using testing::TarMember;

constexpr char kUrl[] = "s3://bucket/shard-000001.tar";

std::string_view ImageOf(const std::string& tar, const TarSample& s) {
  return std::string_view(tar).substr(s.image_offset, s.image_size);
}

TEST(TarTest, GroupsConsecutiveMembersByKey) {
  const std::string tar = TarMember("a/000.jpg", "JPEGDATA0") + TarMember("a/000.cls", "3\n") +
                          TarMember("a/000.json", "{}") + TarMember("a/001.cls", " 7 ") +
                          TarMember("a/001.PNG", std::string(700, 'p')) + TarMember("002.seg.jpeg", "mask") + TarMember("002.jpeg", "J2") +
                          TarEnd();
  Result<TarShard> r = ParseTar(tar, kUrl);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->samples.size(), 3u);
  EXPECT_EQ(r->samples[0].key, "a/000");
  EXPECT_EQ(ImageOf(tar, r->samples[0]), "JPEGDATA0");
  EXPECT_EQ(r->samples[0].label, 3);
  EXPECT_EQ(r->samples[1].key, "a/001");
  EXPECT_EQ(ImageOf(tar, r->samples[1]), std::string(700, 'p'));
  EXPECT_EQ(r->samples[1].label, 7);
  EXPECT_EQ(r->samples[2].key, "002");  // the key ends at the first dot of the file name
  EXPECT_EQ(ImageOf(tar, r->samples[2]), "J2");  // "seg.jpeg" is another extension
  EXPECT_EQ(r->samples[2].label, -1);   // no label member
  EXPECT_EQ(r->skipped, 0);
}

TEST(TarTest, PaxGnuAndUstarPrefixLongNames) {
  const std::string dir(120, 'd');
  const std::string tar = PaxMember(dir + "/k1.jpg", "I1") + PaxMember(dir + "/k1.cls", "1") +
                          GnuLongMember(dir + "/k2.jpg", "I2") + TarMember("p/" + dir + "/k3.jpg", "I3") +
                          TarMember("pax_global_header", "10 a=bcdef\n", 'g') + TarEnd();
  Result<TarShard> r = ParseTar(tar, kUrl);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->samples.size(), 3u);
  EXPECT_EQ(r->samples[0].key, dir + "/k1");
  EXPECT_EQ(r->samples[0].label, 1);
  EXPECT_EQ(ImageOf(tar, r->samples[0]), "I1");
  EXPECT_EQ(r->samples[1].key, dir + "/k2");
  EXPECT_EQ(ImageOf(tar, r->samples[1]), "I2");
  EXPECT_EQ(r->samples[2].key, "p/" + dir + "/k3");
}

TEST(TarTest, EmptyShards) {
  for (const std::string& tar : {std::string(), TarEnd(), std::string(512, '\0')}) {
    Result<TarShard> r = ParseTar(tar, kUrl);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(r->samples.empty());
  }
}

TEST(TarTest, TruncatedMemberNamesShardAndOffset) {
  const std::string good = TarMember("000.jpg", "A") + TarMember("000.cls", "0");
  const std::string tar = good + TarMember("001.jpg", std::string(2000, 'x'));
  const std::string cut = tar.substr(0, good.size() + 512 + 1000);
  Result<TarShard> r = ParseTar(cut, kUrl);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kDataLoss);
  EXPECT_NE(r.status().message().find(kUrl), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("byte " + std::to_string(good.size())), std::string::npos)
      << r.status().ToString();
  EXPECT_NE(r.status().message().find("cut short"), std::string::npos);

  // Cut inside a header.
  Result<TarShard> h = ParseTar(tar.substr(0, good.size() + 100), kUrl);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("inside a header"), std::string::npos) << h.status().ToString();

  Result<TarShard> s = ParseTar(cut, kUrl, {.skip_errors = true});
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->samples.size(), 1u);
  EXPECT_EQ(s->samples[0].key, "000");
  EXPECT_EQ(s->skipped, 1);
}

TEST(TarTest, CorruptHeaderIsAnError) {
  std::string tar = TarMember("000.jpg", "A") + TarMember("001.jpg", "B") + TarEnd();
  tar[1024 + 3] ^= 0x20;  // the second header's name: the checksum no longer matches
  Result<TarShard> r = ParseTar(tar, kUrl);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kDataLoss);
  EXPECT_NE(r.status().message().find("byte 1024"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("checksum"), std::string::npos);
  Result<TarShard> s = ParseTar(tar, kUrl, {.skip_errors = true});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->samples.size(), 1u);
  EXPECT_EQ(s->skipped, 1);
  // Not a tar at all.
  Result<TarShard> junk = ParseTar(std::string(2048, 'j'), kUrl);
  EXPECT_EQ(junk.status().code(), Code::kDataLoss);
}

TEST(TarTest, SampleWithoutImage) {
  const std::string tar = TarMember("000.jpg", "A") + TarMember("001.cls", "1") + TarMember("001.txt", "t") +
                          TarMember("002.jpg", "C") + TarEnd();
  Result<TarShard> r = ParseTar(tar, kUrl);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("'001' has no image"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("byte 1024"), std::string::npos) << r.status().ToString();
  Result<TarShard> s = ParseTar(tar, kUrl, {.skip_errors = true});
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->samples.size(), 2u);
  EXPECT_EQ(s->samples[1].key, "002");
  EXPECT_EQ(s->skipped, 1);
}

TEST(TarTest, LabelsFromClsOrJsonField) {
  const std::string tar = TarMember("0.jpg", "A") + TarMember("0.cls", "x1") + TarEnd();
  Result<TarShard> r = ParseTar(tar, kUrl);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'0.cls' is not an integer"), std::string::npos) << r.status().ToString();

  const std::string js = TarMember("0.jpg", "A") + TarMember("0.json", R"({"name": "x", "label" : 42})") +
                         TarMember("1.jpg", "B") + TarMember("1.json", R"({"label": -3})") + TarEnd();
  Result<TarShard> j = ParseTar(js, kUrl, {.label_field = "label"});
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_EQ(j->samples[0].label, 42);
  EXPECT_EQ(j->samples[1].label, -3);
  Result<TarShard> missing = ParseTar(js, kUrl, {.label_field = "cls"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no integer field \"cls\""), std::string::npos);
  // Without a label field, json is ignored.
  Result<TarShard> plain = ParseTar(js, kUrl);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->samples[0].label, -1);
}

TEST(TarTest, FieldsNameTheMembersOfASample) {
  const std::string tar = TarMember("0.JPG", "A") + TarMember("0.cls", "1") + TarMember("0.txt", "x") +
                          TarMember("1.png", "B") + TarMember("1.cls", "2") + TarMember("2.cls", "3") + TarEnd();
  const TarParseOptions o{.fields = {"jpg;png", "cls"}};
  TarStream stream(kUrl, o);
  stream.Append(tar);
  stream.Finish();
  auto a = stream.Next();
  ASSERT_TRUE(a.ok() && *a) << a.status().ToString();
  EXPECT_EQ((*a)->fields, (std::vector<std::string>{"A", "1"}));
  auto b = stream.Next();
  ASSERT_TRUE(b.ok() && *b);
  EXPECT_EQ((*b)->fields, (std::vector<std::string>{"B", "2"}));
  auto c = stream.Next();
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("sample '2' has no 'jpg;png' member"), std::string::npos) << c.status().ToString();
  Result<TarShard> skipping = ParseTar(tar, kUrl, {.skip_errors = true, .fields = {"jpg;png", "cls"}});
  ASSERT_TRUE(skipping.ok());
  EXPECT_EQ(skipping->samples.size(), 2u);
  EXPECT_EQ(skipping->skipped, 1);
  EXPECT_EQ(FieldOf({"npy", "jpg;png"}, "PNG"), 1);
  EXPECT_EQ(FieldOf({"npy"}, "np"), -1);
}

TEST(TarTest, DirectoriesAndLinksAreIgnored) {
  const std::string tar = TarMember("d/", "", '5') + TarMember("d/0.jpg", "A") + TarMember("d/0.lnk", "", '2') +
                          TarEnd();
  Result<TarShard> r = ParseTar(tar, kUrl);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->samples.size(), 1u);
}

// Feeds `tar` to a TarStream in pieces of `piece` bytes (taking samples in between) and
// returns the samples, or the first error.
Result<TarShard> Streamed(const std::string& tar, size_t piece, const TarParseOptions& o = {},
                          size_t* max_buffered = nullptr) {
  TarStream stream(kUrl, o);
  TarShard out;
  for (size_t at = 0;; at += piece) {
    if (at < tar.size()) {
      stream.Append(std::string_view(tar).substr(at, piece));
    } else {
      stream.Finish();
    }
    for (;;) {
      DDP_ASSIGN_OR_RETURN(std::optional<TarSample> s, stream.Next());
      if (max_buffered) *max_buffered = std::max(*max_buffered, stream.buffered());
      if (!s) break;
      out.samples.push_back(std::move(*s));
    }
    if (stream.done()) break;
    if (at >= tar.size()) return InternalError("the stream did not end after Finish()");
  }
  out.skipped = stream.skipped();
  return out;
}

TEST(TarStreamTest, AnyPieceSizeGivesWhatTheWholeShardGives) {
  const std::string dir(120, 'd');
  const std::string good = TarMember("a/000.jpg", std::string(1500, 'i')) + TarMember("a/000.cls", "3") +
                           PaxMember(dir + "/k1.png", "I1") + PaxMember(dir + "/k1.cls", "1") +
                           GnuLongMember(dir + "/k2.jpg", std::string(3000, 'j')) + TarMember("x/", "", '5') +
                           TarMember("003.jpeg", "J3");
  const std::vector<std::string> tars = {
      good + TarEnd(), good,                                      // with and without the end marker
      good + TarMember("004.jpg", std::string(2000, 'x')).substr(0, 1300),  // a member cut short
      good + TarMember("004.jpg", "y").substr(0, 100),            // cut inside a header
      good + TarMember("005.cls", "5") + TarEnd(),                // a sample without an image
      good + TarMember("006.jpg", "y").substr(0, 600),            // ends inside a member's padding
  };
  for (const std::string& tar : tars) {
    for (bool skip : {false, true}) {
      const TarParseOptions o{.skip_errors = skip};
      Result<TarShard> whole = ParseTar(tar, kUrl, o);
      for (size_t piece : {1u, 7u, 511u, 512u, 513u, 4096u, 1u << 20}) {
        SCOPED_TRACE(::testing::Message() << "piece " << piece << " size " << tar.size() << " skip " << skip);
        Result<TarShard> streamed = Streamed(tar, piece, o);
        ASSERT_EQ(streamed.ok(), whole.ok()) << streamed.status().ToString() << " / " << whole.status().ToString();
        if (!whole.ok()) {
          EXPECT_EQ(streamed.status().message(), whole.status().message());
          continue;
        }
        ASSERT_EQ(streamed->samples.size(), whole->samples.size());
        EXPECT_EQ(streamed->skipped, whole->skipped);
        for (size_t i = 0; i < whole->samples.size(); ++i) {
          const TarSample& a = streamed->samples[i];
          const TarSample& b = whole->samples[i];
          EXPECT_EQ(a.key, b.key);
          EXPECT_EQ(a.label, b.label);
          EXPECT_EQ(a.ordinal, static_cast<int64_t>(i));
          EXPECT_EQ(a.image_offset, b.image_offset);
          EXPECT_EQ(a.image, std::string_view(tar).substr(b.image_offset, b.image_size));
        }
      }
    }
  }
}

TEST(TarStreamTest, HoldsOnlyWhatItKeeps) {
  std::string tar;
  for (int i = 0; i < 64; ++i) {
    tar += TarMember(std::to_string(1000 + i) + ".jpg", std::string(100000, static_cast<char>('a' + i % 26)));
    tar += TarMember(std::to_string(1000 + i) + ".cls", std::to_string(i));
  }
  tar += TarEnd();
  // Samples not kept: only a header's worth of bytes (plus a piece) is ever held.
  TarStream skipping(kUrl, {});
  skipping.SetKeep([](int64_t ordinal) { return ordinal == 40; });
  size_t most = 0;
  int64_t n = 0;
  for (size_t at = 0; at < tar.size(); at += 4096) {
    skipping.Append(std::string_view(tar).substr(at, 4096));
    for (;;) {
      auto s = skipping.Next();
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      most = std::max(most, skipping.buffered());
      if (!*s) break;
      EXPECT_EQ((*s)->image.size(), (*s)->ordinal == 40 ? 100000u : 0u);
      ++n;
    }
  }
  skipping.Finish();
  ASSERT_TRUE(skipping.Next().ok());
  EXPECT_TRUE(skipping.done());
  EXPECT_EQ(n, 64);
  EXPECT_LT(most, 100000u + 2 * 4096u + 1024u);
  // Kept samples taken as they come: one image plus a piece at a time.
  size_t kept = 0;
  ASSERT_TRUE(Streamed(tar, 4096, {}, &kept).ok());
  EXPECT_LT(kept, 2 * 100000u + 2 * 4096u + 1024u);
}

}  // namespace
}  // namespace ddp::shards
