#include "shards/prefetch.h"

#include <gtest/gtest.h>

#include "common/process_testutil.h"

namespace ddp::shards {
namespace {

std::shared_ptr<Store> Objects(const std::string& name) {
  auto store = std::shared_ptr<Store>(OpenStore("memory://" + name).value());
  EXPECT_TRUE(store->Put("a", std::string(10000, 'a')).ok());
  EXPECT_TRUE(store->Put("b", std::string(4096, 'b')).ok());  // a multiple of the chunk
  EXPECT_TRUE(store->Put("empty", "").ok());
  return store;
}

// Object k's chunks until its end.
std::string ReadAll(ChunkPrefetcher& p, size_t k) {
  const std::atomic<bool> never{false};
  std::string out;
  for (;;) {
    auto c = p.Next(k, never);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok() || !*c) break;
    EXPECT_LE((*c)->size(), 1024u);
    out += **c;
  }
  p.Release(k);
  return out;
}

TEST(ChunkPrefetcherTest, ObjectsInOrderInChunks) {
  auto store = Objects("prefetch-order");
  ChunkPrefetcher p(store, {"a", "b", "empty", "a"}, {.chunk_bytes = 1024, .objects_ahead = 2, .chunks_ahead = 2});
  EXPECT_EQ(ReadAll(p, 0), std::string(10000, 'a'));
  EXPECT_EQ(ReadAll(p, 1), std::string(4096, 'b'));
  EXPECT_EQ(ReadAll(p, 2), "");
  EXPECT_EQ(ReadAll(p, 3), std::string(10000, 'a'));
  EXPECT_EQ(p.waiting_bytes(), 0u);
  EXPECT_EQ(p.fetched_bytes(), 24096u);
}

TEST(ChunkPrefetcherTest, ReleaseStopsReadingAndErrorsNameTheObject) {
  auto store = Objects("prefetch-release");
  ChunkPrefetcher p(store, {"a", "missing", "b"}, {.chunk_bytes = 1024, .objects_ahead = 1, .chunks_ahead = 1});
  const std::atomic<bool> never{false};
  ASSERT_TRUE(p.Next(0, never).ok());
  p.Release(0);  // 9 KiB of "a" are never fetched
  auto missing = p.Next(1, never);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  EXPECT_NE(missing.status().message().find("missing"), std::string::npos) << missing.status().ToString();
  p.Release(1);
  EXPECT_EQ(ReadAll(p, 2), std::string(4096, 'b'));
  EXPECT_LT(p.fetched_bytes(), 3u * 1024 + 4096);
  const std::atomic<bool> cancel{true};
  ChunkPrefetcher q(store, {"a"}, {.chunk_bytes = 1024, .objects_ahead = 1, .chunks_ahead = 1});
  q.Release(0);
  EXPECT_EQ(q.Next(0, cancel).status().code(), Code::kCancelled);
}

TEST(ChunkPrefetcherTest, AForkedChildLeavesTheReadersToTheParent) {
  auto store = Objects("prefetch-fork");
  // The readers have filled their chunks and wait on the condition variable.
  auto* p = new ChunkPrefetcher(store, {"a", "a", "a"}, {.chunk_bytes = 1024, .objects_ahead = 3, .chunks_ahead = 1});
  const std::atomic<bool> never{false};
  ASSERT_TRUE(p->Next(0, never).ok());
  const ForkedChildEnd end = RunInForkedChild([&] {
    delete p;
    return 0;
  });
  EXPECT_FALSE(end.hung);
  EXPECT_EQ(end.signal, 0);
  EXPECT_EQ(end.exit_code, 0);
  EXPECT_EQ(ReadAll(*p, 0).size(), 10000u - 1024u);
  delete p;
}

}  // namespace
}  // namespace ddp::shards
