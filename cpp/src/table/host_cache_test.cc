#include "table/host_cache.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace ddp::table {
namespace {

namespace fs = std::filesystem;

class HostCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ddp-host-cache-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string Path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  // 5 records of 12 bytes: record r holds bytes r * 12 + i.
  static std::vector<uint8_t> Records() {
    std::vector<uint8_t> v(60);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i);
    return v;
  }
  std::vector<std::string> Names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename());
    return out;
  }

  std::string dir_;
};

TEST_F(HostCacheTest, WrittenThenMappedByAnyReader) {
  const auto recs = Records();
  const std::string path = Path("t-p3.rec");
  ASSERT_TRUE(WriteRecordsFile(path, recs, 5, 12).ok());
  auto m = MappedRecords::Open(path, 12);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->rows(), 5);
  EXPECT_EQ((*m)->record_bytes(), 12u);
  EXPECT_EQ(std::vector<uint8_t>((*m)->records(), (*m)->records() + 60), recs);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_size, static_cast<off_t>(kHostCacheHeaderBytes + 60));
  // No temporary file is left beside it.
  EXPECT_EQ(Names(), std::vector<std::string>{"t-p3.rec"});
}

TEST_F(HostCacheTest, ACreatedFileWrittenByAnotherProcessIsCommittedInPlace) {
  const auto recs = Records();
  const std::string tmp = Path("t-p1.rec.tmp.x"), path = Path("t-p1.rec");
  const std::vector<uint8_t> token{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  ASSERT_TRUE(CreateRecordsFile(tmp, 5, 12, token).ok());
  struct stat st {};
  ASSERT_EQ(::stat(tmp.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_size, static_cast<off_t>(kHostCacheHeaderBytes + 60));
  EXPECT_FALSE(fs::exists(path));
  // Another process finds the token, then writes the records after the header.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    FILE* f = std::fopen(tmp.c_str(), "r+b");
    uint8_t got[16] = {};
    const bool ok = f != nullptr && std::fread(got, 1, 16, f) == 16 &&
                    std::equal(token.begin(), token.end(), got) &&
                    std::fseek(f, static_cast<long>(kHostCacheHeaderBytes), SEEK_SET) == 0 &&
                    std::fwrite(recs.data(), 1, recs.size(), f) == recs.size() &&
                    std::fclose(f) == 0;
    std::_Exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_TRUE(CommitRecordsFile(tmp, path, 5, 12).ok());
  auto m = MappedRecords::Open(path, 12);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->rows(), 5);
  EXPECT_EQ(std::vector<uint8_t>((*m)->records(), (*m)->records() + 60), recs);
  EXPECT_EQ(Names(), std::vector<std::string>{"t-p1.rec"});
}

TEST_F(HostCacheTest, ACommitKeepsAFileAnotherRankCommittedFirst) {
  const auto recs = Records();
  const std::string path = Path("t-p2.rec");
  ASSERT_TRUE(WriteRecordsFile(path, recs, 5, 12).ok());
  const std::string tmp = Path("t-p2.rec.tmp.y");
  ASSERT_TRUE(CreateRecordsFile(tmp, 5, 12, {}).ok());
  ASSERT_TRUE(CommitRecordsFile(tmp, path, 5, 12).ok());
  auto m = MappedRecords::Open(path, 12);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(std::vector<uint8_t>((*m)->records(), (*m)->records() + 60), recs);
  EXPECT_EQ(Names(), std::vector<std::string>{"t-p2.rec"});
}

TEST_F(HostCacheTest, ACreatedFileOfOtherRowsIsRefusedAtCommitAndRemoved) {
  const std::string tmp = Path("t-p4.rec.tmp.z"), path = Path("t-p4.rec");
  ASSERT_TRUE(CreateRecordsFile(tmp, 5, 12, {}).ok());
  Status s = CommitRecordsFile(tmp, path, 4, 12);
  EXPECT_EQ(s.code(), Code::kDataLoss);
  EXPECT_NE(s.message().find(tmp), std::string::npos) << s.message();
  EXPECT_TRUE(Names().empty());
  // Creating over an existing name, or with a token longer than the header, is refused.
  ASSERT_TRUE(CreateRecordsFile(tmp, 1, 12, {}).ok());
  EXPECT_FALSE(CreateRecordsFile(tmp, 1, 12, {}).ok());
  EXPECT_EQ(CreateRecordsFile(Path("other"), 1, 12, std::vector<uint8_t>(65, 0)).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(CommitRecordsFile(Path("missing"), path, 1, 12).code(), Code::kNotFound);
}

TEST_F(HostCacheTest, AnEmptyPartitionIsAFile) {
  ASSERT_TRUE(WriteRecordsFile(Path("e.rec"), {}, 0, 8).ok());
  auto m = MappedRecords::Open(Path("e.rec"), 8);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->rows(), 0);
}

TEST_F(HostCacheTest, AMissingFileIsNotFoundNamingIt) {
  auto m = MappedRecords::Open(Path("absent.rec"), 12);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kNotFound);
  EXPECT_NE(m.status().message().find("absent.rec"), std::string::npos);
}

TEST_F(HostCacheTest, TheFirstWriterIsKept) {
  auto recs = Records();
  ASSERT_TRUE(WriteRecordsFile(Path("p.rec"), recs, 5, 12).ok());
  auto first = MappedRecords::Open(Path("p.rec"), 12);
  ASSERT_TRUE(first.ok());
  std::vector<uint8_t> other(60, 0xab);
  ASSERT_TRUE(WriteRecordsFile(Path("p.rec"), other, 5, 12).ok());
  auto again = MappedRecords::Open(Path("p.rec"), 12);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->records()[1], 1);  // the first file's records
  EXPECT_EQ((*first)->records()[1], 1);
  EXPECT_EQ(Names().size(), 1u);
}

TEST_F(HostCacheTest, AWrongRecordSizeOrDamagedFileIsDataLossNamingIt) {
  ASSERT_TRUE(WriteRecordsFile(Path("p.rec"), Records(), 5, 12).ok());
  auto m = MappedRecords::Open(Path("p.rec"), 16);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kDataLoss);
  EXPECT_NE(m.status().message().find("p.rec"), std::string::npos);
  EXPECT_NE(m.status().message().find("expected 16"), std::string::npos);

  ASSERT_EQ(::truncate(Path("p.rec").c_str(), 70), 0);  // cut short
  m = MappedRecords::Open(Path("p.rec"), 12);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kDataLoss);

  std::ofstream(Path("junk.rec")) << std::string(100, 'x');
  m = MappedRecords::Open(Path("junk.rec"), 12);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("bad magic"), std::string::npos);
}

TEST_F(HostCacheTest, RecordsThatDoNotMatchTheirCountAreRefused) {
  auto s = WriteRecordsFile(Path("p.rec"), Records(), 4, 12);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("p.rec"), std::string::npos);
  EXPECT_TRUE(Names().empty());
}

TEST_F(HostCacheTest, AnUnwritableDirectoryNamesTheFile) {
  auto s = WriteRecordsFile(Path("no/such/dir/p.rec"), Records(), 5, 12);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no/such/dir/p.rec"), std::string::npos);
}

TEST_F(HostCacheTest, TheLockIsExclusiveAndBounded) {
  const std::string path = Path("p.lock");
  auto held = FileLock::Acquire(path, 0);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  auto other = FileLock::Acquire(path, 0.05);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), Code::kDeadlineExceeded);
  EXPECT_NE(other.status().message().find("p.lock"), std::string::npos);
  held.value().reset();
  EXPECT_TRUE(FileLock::Acquire(path, 0).ok());
}

TEST_F(HostCacheTest, ALockDiesWithItsProcess) {
  const std::string path = Path("p.lock");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto lock = FileLock::Acquire(path, 0);
    char c = lock.ok() ? 'y' : 'n';
    if (::write(ready[1], &c, 1) != 1) ::_exit(2);
    ::pause();  // killed holding the lock
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  EXPECT_FALSE(FileLock::Acquire(path, 0).ok());
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  auto lock = FileLock::Acquire(path, 5);
  EXPECT_TRUE(lock.ok()) << lock.status().ToString();
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST_F(HostCacheTest, FreeBytesOfADirectory) {
  auto free = FreeBytes(dir_);
  ASSERT_TRUE(free.ok());
  EXPECT_GT(*free, 0u);
  auto missing = FreeBytes(Path("absent"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("absent"), std::string::npos);
}

}  // namespace
}  // namespace ddp::table
