#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "ddp/store.h"
#include "store/conformance_testutil.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;
using ::ddp::testing::StoreConformanceTest;
using ::ddp::testing::StoreFactory;
using ::ddp::testing::StorePair;

// A temporary directory removed at exit of the test binary. The path lives on the heap:
// a static fs::path would be destroyed before the atexit handler that needs it runs.
const fs::path& TempRoot() {
  static const fs::path* const root = [] {
    std::string tmpl = (fs::temp_directory_path() / "ddp-file-store-XXXXXX").string();
    char* made = ::mkdtemp(tmpl.data());
    if (made == nullptr) std::abort();
    return new fs::path(made);
  }();
  static const bool registered = [] {
    return std::atexit([] {
      std::error_code ec;
      fs::remove_all(*root, ec);
    }) == 0;
  }();
  (void)registered;
  return *root;
}

Result<StorePair> OpenPlainPath(const std::string& unique) {
  DDP_ASSIGN_OR_RETURN(auto s, OpenStore((TempRoot() / unique).string()));
  return StorePair{std::move(s), nullptr};
}

Result<StorePair> OpenFileUrl(const std::string& unique) {
  DDP_ASSIGN_OR_RETURN(auto s, OpenStore("file://" + (TempRoot() / unique).string()));
  return StorePair{std::move(s), nullptr};
}

INSTANTIATE_TEST_SUITE_P(File, StoreConformanceTest,
                         ::testing::Values(StoreFactory{"plain_path", OpenPlainPath},
                                           StoreFactory{"file_url", OpenFileUrl}),
                         ::ddp::testing::StoreFactoryName);

TEST(FileStoreTest, UrlIsAbsoluteAndNormalised) {
  auto s = OpenStore("file://" + TempRoot().string() + "/x/../y/");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ((*s)->url(), "file://" + TempRoot().string() + "/y");
}

TEST(FileStoreTest, RejectsKeysThatEscapeTheRoot) {
  auto s = OpenStore((TempRoot() / "escape").string());
  ASSERT_TRUE(s.ok());
  for (std::string key : {"../outside", "a/../../b", "/abs", "a//b", "./a", "a\\b"}) {
    EXPECT_EQ((*s)->Put(key, "x").code(), Code::kInvalidArgument) << key;
    auto g = (*s)->Get(key);
    EXPECT_EQ(g.status().code(), Code::kInvalidArgument) << key;
    EXPECT_NE(g.status().message().find(key), std::string::npos) << g.status().ToString();
  }
  EXPECT_FALSE(fs::exists(TempRoot() / "outside"));
  for (std::string prefix : {"../", "a/../../", "/etc/"}) {
    auto l = (*s)->List(prefix);
    EXPECT_EQ(l.status().code(), Code::kInvalidArgument) << prefix;
  }
}

TEST(FileStoreTest, PutCreatesParentsAndLeavesNoTemporaryFiles) {
  fs::path root = TempRoot() / "put-parents";
  auto s = OpenStore(root.string());
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*s)->Put("a/b/c/d.bin", "payload").ok());
  ASSERT_TRUE((*s)->Put("a/b/c/d.bin", "payload2").ok());
  std::ifstream in(root / "a/b/c/d.bin", std::ios::binary);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "payload2");
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(root)) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
  struct stat st;
  ASSERT_EQ(::stat((root / "a/b/c/d.bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
}

TEST(FileStoreTest, ListSkipsTemporaryFilesAndDirectories) {
  fs::path root = TempRoot() / "list-skips";
  fs::create_directories(root / "d/empty-dir");
  std::ofstream(root / "d/.x.ddp-tmp-abcdef") << "partial";
  std::ofstream(root / "d/real") << "ok";
  auto s = OpenStore(root.string());
  ASSERT_TRUE(s.ok());
  auto l = (*s)->List("");
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->size(), 1u);
  EXPECT_EQ((*l)[0].key, "d/real");
}

TEST(FileStoreTest, UnwritableDirectoryIsPermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  fs::path root = TempRoot() / "readonly";
  fs::create_directories(root);
  fs::permissions(root, fs::perms::owner_read | fs::perms::owner_exec);
  auto s = OpenStore(root.string());
  ASSERT_TRUE(s.ok());
  Status p = (*s)->Put("k", "v");
  EXPECT_EQ(p.code(), Code::kPermissionDenied) << p.ToString();
  fs::permissions(root, fs::perms::owner_all);
}

TEST(FileStoreTest, RootThatIsAFileIsAnError) {
  fs::path f = TempRoot() / "a-file";
  std::ofstream(f) << "x";
  auto s = OpenStore(f.string());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("a-file"), std::string::npos);
}

TEST(FileStoreTest, DirectoryKeyIsNotAnObject) {
  auto s = OpenStore((TempRoot() / "dirkey").string());
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*s)->Put("d/x", "1").ok());
  EXPECT_EQ((*s)->Get("d").status().code(), Code::kNotFound);
  EXPECT_EQ((*s)->Stat("d").status().code(), Code::kNotFound);
}

TEST(OpenStoreTest, RejectsBadUrls) {
  struct Case {
    std::string url;
    Code code;
  };
  for (const Case& c : std::vector<Case>{{"", Code::kInvalidArgument},
                                         {"gs://bucket/x", Code::kInvalidArgument},
                                         {"file://relative/path", Code::kInvalidArgument},
                                         {"memory://name/../x", Code::kInvalidArgument}}) {
    auto s = OpenStore(c.url);
    ASSERT_FALSE(s.ok()) << c.url;
    EXPECT_EQ(s.status().code(), c.code) << c.url << ": " << s.status().ToString();
    if (!c.url.empty()) {
      EXPECT_NE(s.status().message().find(c.url.substr(0, 6)), std::string::npos)
          << s.status().ToString();
    }
  }
}

}  // namespace
}  // namespace ddp
