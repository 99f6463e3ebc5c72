// The conformance suite every store back-end passes.
//
// A back-end's test instantiates StoreConformanceTest with one or more StoreFactory
// values:
//
//   INSTANTIATE_TEST_SUITE_P(File, StoreConformanceTest,
//                            ::testing::Values(StoreFactory{"file", OpenTempFileStore}),
//                            StoreFactoryName);
//
// Each test opens a fresh, empty store through the factory, rooted at a unique name so
// tests sharing one server (S3, HTTP) never see each other's objects.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "ddp/store.h"

namespace ddp::testing {

struct StorePair {
  std::unique_ptr<Store> reader;  // the store under test
  std::unique_ptr<Store> writer;  // where test data is written (reader itself if null)
};

struct StoreFactory {
  std::string name;
  // Opens an empty store rooted at `unique` (a fresh name per test). A
  // kFailedPrecondition error skips the test (e.g. no server configured); any other
  // error fails it.
  std::function<Result<StorePair>(const std::string& unique)> open;
  // False for read-only back-ends (http): Put and Delete on the reader must fail with
  // kUnimplemented, and data is written through StorePair::writer instead.
  bool writable = true;
  // False when the back-end cannot list (checked to fail with kUnimplemented).
  bool lists = true;
};

// gtest prints a parameter by its name.
inline void PrintTo(const StoreFactory& f, std::ostream* os) { *os << f.name; }

// For INSTANTIATE_TEST_SUITE_P's name generator.
std::string StoreFactoryName(const ::testing::TestParamInfo<StoreFactory>& info);

// A fresh name for a test's store root ("conf-<pid>-<counter>-<test name>").
std::string UniqueName();

class StoreConformanceTest : public ::testing::TestWithParam<StoreFactory> {
 protected:
  void SetUp() override;

  // Writes through the writer and fails the test on error.
  void MustPut(const std::string& key, const std::string& data);

  Store& store() { return *pair_.reader; }
  Store& writer() { return pair_.writer ? *pair_.writer : *pair_.reader; }

  StorePair pair_;
};

}  // namespace ddp::testing
