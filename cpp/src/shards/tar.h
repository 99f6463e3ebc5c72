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
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/status.h"

namespace ddp::shards {

struct TarSample {
  std::string key;
  uint64_t image_offset = 0;  // of the image member's data within the shard
  uint64_t image_size = 0;
  int64_t label = -1;         // -1: no label member
};

struct TarParseOptions {
  bool skip_errors = false;
  std::string label_field = {};  // empty: the label comes from the "cls" member
};

struct TarShard {
  std::vector<TarSample> samples;
  int64_t skipped = 0;  // samples left out (skip_errors)
};

// Parses a whole shard held in memory. `url` names it in errors.
Result<TarShard> ParseTar(std::string_view data, std::string_view url, const TarParseOptions& options = {});

}  // namespace ddp::shards
