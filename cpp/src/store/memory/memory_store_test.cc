#include "ddp/store.h"
#include "store/conformance_testutil.h"

namespace ddp {
namespace {

using ::ddp::testing::StoreConformanceTest;
using ::ddp::testing::StoreFactory;
using ::ddp::testing::StorePair;

Result<StorePair> OpenNamed(const std::string& unique) {
  DDP_ASSIGN_OR_RETURN(auto s, OpenStore("memory://" + unique));
  return StorePair{std::move(s), nullptr};
}

Result<StorePair> OpenWithPrefix(const std::string& unique) {
  DDP_ASSIGN_OR_RETURN(auto s, OpenStore("memory://shared-for-prefixes/" + unique + "/root"));
  return StorePair{std::move(s), nullptr};
}

INSTANTIATE_TEST_SUITE_P(Memory, StoreConformanceTest,
                         ::testing::Values(StoreFactory{"named", OpenNamed},
                                           StoreFactory{"prefixed", OpenWithPrefix}),
                         ::ddp::testing::StoreFactoryName);

TEST(MemoryStoreTest, SameNameSharesObjectsAnonymousStoresDoNot) {
  auto a = OpenStore("memory://shared-name");
  auto b = OpenStore("memory://shared-name/");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Put("k", "v").ok());
  auto got = (*b)->Get("k");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, "v");

  auto x = OpenStore("memory://");
  auto y = OpenStore("memory://");
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_NE((*x)->url(), (*y)->url());
  ASSERT_TRUE((*x)->Put("k", "v").ok());
  EXPECT_EQ((*y)->Get("k").status().code(), Code::kNotFound);
}

TEST(MemoryStoreTest, PrefixedStoreSeesOnlyItsPrefix) {
  auto whole = OpenStore("memory://prefix-test");
  auto sub = OpenStore("memory://prefix-test/a/b");
  ASSERT_TRUE(whole.ok() && sub.ok());
  ASSERT_TRUE((*whole)->Put("a/b/x", "1").ok());
  ASSERT_TRUE((*whole)->Put("a/bc", "2").ok());
  auto l = (*sub)->List("");
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->size(), 1u);
  EXPECT_EQ((*l)[0].key, "x");
  EXPECT_EQ((*sub)->url(), "memory://prefix-test/a/b");
}

}  // namespace
}  // namespace ddp
