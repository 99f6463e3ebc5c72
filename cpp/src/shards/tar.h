// WebDataset tar shards: a tar parser (ustar, pax extended headers, GNU long names) that
// groups consecutive members sharing a key into samples.
//
// A member "dir/abc.seg.jpg" has key "dir/abc" and extension "seg.jpg" (everything after
// the first '.' of the last path component), as the webdataset library splits names.
// Consecutive members with the same key form one sample: its image is the member with
// extension jpg, jpeg or png (case-insensitive), its label the integer text of the "cls"
// member (or, when `label_field` is set, that integer field of the "json" member); other
// members are ignored. A sample without an image, a corrupt header (bad checksum, bad
// size field), a member cut short by the end of the shard, or a bad label is an error
// naming the shard's URL and the member's byte offset; with `skip_errors` it is left out
// and counted instead (a cut-short tail ends the shard).
//
// TarStream parses a shard as its bytes arrive (in pieces of any size) and yields each
// sample once its last member is complete; it holds the bytes of the member being read
// and of the samples it kept, never the whole shard. ParseTar runs it over a shard held
// in memory.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/status.h"

namespace ddp::shards {

struct TarSample {
  std::string key;
  // With TarParseOptions::fields: each field's member bytes (when kept), in field order.
  std::vector<std::string> fields;
  uint64_t image_offset = 0;  // of the image member's data within the shard
  uint64_t image_size = 0;
  int64_t label = -1;         // -1: no label member
  int64_t ordinal = 0;        // among the shard's good samples
  std::string image;          // the image's bytes (TarStream, when kept)
};

struct TarParseOptions {
  bool skip_errors = false;
  std::string label_field = {};  // empty: the label comes from the "cls" member
  // Set: the members that make a sample, by extension (case-insensitive; alternatives
  // separated by ';', e.g. "jpg;jpeg;png"), every one required; no image or label rule.
  std::vector<std::string> fields = {};
};

// The field of `fields` an extension belongs to (-1: none).
int FieldOf(const std::vector<std::string>& fields, std::string_view ext);
// An integer in text (surrounding whitespace allowed), as a .cls member holds it.
std::optional<int64_t> ParseIntText(std::string_view s);

struct TarShard {
  std::vector<TarSample> samples;
  int64_t skipped = 0;  // samples left out (skip_errors)
};

// Parses a whole shard held in memory. `url` names it in errors.
Result<TarShard> ParseTar(std::string_view data, std::string_view url, const TarParseOptions& options = {});

// An incremental parser: Append() the shard's bytes in order, Finish() at its end, and
// take samples with Next() in between. Errors are those of ParseTar, with the same
// offsets; after an error the stream stays failed.
class TarStream {
 public:
  TarStream(std::string url, TarParseOptions options);

  // Whether to keep the image bytes of the sample with this ordinal (default: all).
  // Samples not kept are still parsed and yielded, with an empty `image`.
  void SetKeep(std::function<bool(int64_t ordinal)> keep) { keep_ = std::move(keep); }
  void Append(std::string_view bytes);
  void Finish();
  // The next complete sample; nullopt when more bytes are needed or the shard is done.
  Result<std::optional<TarSample>> Next();
  // The end-of-archive marker was read, or Finish() was called and every sample taken.
  bool done() const { return done_ && out_.empty(); }
  int64_t skipped() const { return skipped_; }
  // Bytes held: of the member being read plus samples parsed and not yet taken.
  size_t buffered() const;
  uint64_t received() const { return total_; }
  // Samples yielded so far (the next sample's ordinal).
  int64_t yielded() const { return yielded_; }

 private:
  struct Group;
  Status Step(bool* progressed);
  Status Flush();
  Status Broken(uint64_t at, const std::string& what, std::string_view member = {});
  std::string_view Avail() const { return std::string_view(buf_).substr(head_); }
  void Compact();

  std::string url_;
  TarParseOptions opt_;
  std::function<bool(int64_t)> keep_;
  std::string buf_;     // bytes from offset pos_ - head_ on
  size_t head_ = 0;     // buf_[head_] is the byte at pos_
  uint64_t pos_ = 0;    // absolute offset of the next header (or of bytes to skip)
  uint64_t total_ = 0;  // bytes appended
  bool finished_ = false, done_ = false;
  Status failed_;
  std::optional<std::string> long_name_;
  std::shared_ptr<Group> group_;
  // The last member skipped without its data (cut short if the shard ends inside it).
  struct Skipped {
    uint64_t header_at = 0, end = 0;
    std::string name;
  };
  std::optional<Skipped> skipping_;
  std::deque<TarSample> out_;
  int64_t good_ = 0;  // good samples flushed (the in-progress group's ordinal)
  int64_t yielded_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace ddp::shards
