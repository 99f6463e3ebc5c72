#include "shards/tar.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>

namespace ddp::shards {

namespace {

constexpr uint64_t kBlock = 512;

std::string Where(std::string_view url, uint64_t offset) {
  return std::string(url) + ": tar member at byte " + std::to_string(offset);
}

// A NUL-terminated field of at most `n` bytes.
std::string_view Field(const char* p, size_t n) {
  size_t len = 0;
  while (len < n && p[len] != '\0') ++len;
  return {p, len};
}

// Octal (space/NUL padded) or GNU base-256 (high bit of the first byte set).
std::optional<uint64_t> Number(const char* p, size_t n) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  if (u[0] & 0x80) {
    if (u[0] != 0x80) return std::nullopt;  // negative or too large
    uint64_t v = 0;
    for (size_t i = 1; i < n; ++i) {
      if (v >> 56) return std::nullopt;
      v = (v << 8) | u[i];
    }
    return v;
  }
  size_t i = 0;
  while (i < n && (p[i] == ' ' || p[i] == '\0')) ++i;
  uint64_t v = 0;
  bool any = false;
  for (; i < n && p[i] >= '0' && p[i] <= '7'; ++i) {
    if (v >> 60) return std::nullopt;
    v = v * 8 + static_cast<uint64_t>(p[i] - '0');
    any = true;
  }
  for (; i < n; ++i) {
    if (p[i] != ' ' && p[i] != '\0') return std::nullopt;
  }
  if (!any) return std::nullopt;
  return v;
}

bool ChecksumOk(const char* h) {
  const std::optional<uint64_t> want = Number(h + 148, 8);
  if (!want) return false;
  uint64_t sum_u = 0;
  int64_t sum_s = 0;
  for (size_t i = 0; i < kBlock; ++i) {
    const bool in_field = i >= 148 && i < 156;
    const unsigned char c = in_field ? ' ' : static_cast<unsigned char>(h[i]);
    sum_u += c;
    sum_s += static_cast<signed char>(in_field ? ' ' : h[i]);
  }
  return *want == sum_u || static_cast<int64_t>(*want) == sum_s;
}

bool AllZero(const char* p, size_t n) {
  return std::all_of(p, p + n, [](char c) { return c == '\0'; });
}

// The "path" (or "linkpath" ignored) record of a pax extended header, if any.
Result<std::optional<std::string>> PaxPath(std::string_view data, std::string_view where) {
  std::optional<std::string> path;
  while (!data.empty()) {
    const size_t sp = data.find(' ');
    size_t len = 0;
    if (sp == std::string_view::npos ||
        std::from_chars(data.data(), data.data() + sp, len).ec != std::errc() || len <= sp + 1 ||
        len > data.size() || data[len - 1] != '\n') {
      return DataLossError(std::string(where) + ": malformed pax extended header record");
    }
    const std::string_view rec = data.substr(sp + 1, len - sp - 2);
    const size_t eq = rec.find('=');
    if (eq == std::string_view::npos) {
      return DataLossError(std::string(where) + ": pax record without '='");
    }
    if (rec.substr(0, eq) == "path") path = std::string(rec.substr(eq + 1));
    data.remove_prefix(len);
  }
  return path;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// An integer in text (surrounding whitespace allowed).
std::optional<int64_t> ParseInt(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// The integer value of top-level-looking field "name": the first `"name"` followed by ':'.
std::optional<int64_t> JsonIntField(std::string_view json, std::string_view name) {
  const std::string quoted = "\"" + std::string(name) + "\"";
  for (size_t at = json.find(quoted); at != std::string_view::npos; at = json.find(quoted, at + 1)) {
    size_t i = at + quoted.size();
    while (i < json.size() && std::isspace(static_cast<unsigned char>(json[i]))) ++i;
    if (i >= json.size() || json[i] != ':') continue;
    ++i;
    while (i < json.size() && std::isspace(static_cast<unsigned char>(json[i]))) ++i;
    size_t j = i;
    if (j < json.size() && json[j] == '-') ++j;
    while (j < json.size() && std::isdigit(static_cast<unsigned char>(json[j]))) ++j;
    return ParseInt(json.substr(i, j - i));
  }
  return std::nullopt;
}

// The sample key of a member name: up to the first '.' of its last path component.
std::string_view KeyOf(std::string_view name) {
  const size_t slash = name.rfind('/');
  const size_t dot = name.find('.', slash == std::string_view::npos ? 0 : slash + 1);
  return dot == std::string_view::npos ? name : name.substr(0, dot);
}

// One sample being gathered from consecutive members.
struct Group {
  std::string key;
  uint64_t offset = 0;  // of its first member's header
  std::optional<TarSample> sample;
  bool has_image = false;
  std::optional<int64_t> label;
  std::optional<std::string> error;  // a bad label: the sample is bad
};

}  // namespace

Result<TarShard> ParseTar(std::string_view data, std::string_view url, const TarParseOptions& opt) {
  TarShard out;
  std::optional<Group> group;
  // Ends the current group: a sample if it has an image, else an error (or a skip).
  auto flush = [&]() -> Status {
    if (!group) return Status::Ok();
    Group g = std::move(*group);
    group.reset();
    std::string problem;
    if (g.error) {
      problem = *g.error;
    } else if (!g.has_image) {
      problem = "sample '" + g.key + "' has no image (.jpg, .jpeg or .png member)";
    }
    if (!problem.empty()) {
      if (opt.skip_errors) {
        ++out.skipped;
        return Status::Ok();
      }
      return InvalidArgumentError(Where(url, g.offset) + ": " + problem);
    }
    TarSample s;
    s.key = std::move(g.key);
    s.image_offset = g.sample->image_offset;
    s.image_size = g.sample->image_size;
    s.label = g.label.value_or(-1);
    out.samples.push_back(std::move(s));
    return Status::Ok();
  };
  // A broken archive: with skip_errors the rest of the shard is dropped and counted as
  // one skip, else an error. The sample in progress is kept unless the broken member
  // (when its header is readable) belongs to it.
  auto broken = [&](uint64_t at, const std::string& what, std::string_view member = {}) -> Result<TarShard> {
    if (!opt.skip_errors) return DataLossError(Where(url, at) + ": " + what);
    if (group && !member.empty() && KeyOf(member) == group->key) group.reset();
    DDP_RETURN_IF_ERROR(flush());
    ++out.skipped;
    return std::move(out);
  };

  std::optional<std::string> long_name;  // from a pax "path" record or a GNU 'L' member
  uint64_t pos = 0;
  const uint64_t n = data.size();
  while (pos < n) {
    if (n - pos < kBlock) return broken(pos, "shard ends inside a header (" + std::to_string(n - pos) + " bytes left)");
    const char* h = data.data() + pos;
    if (AllZero(h, kBlock)) break;  // end-of-archive marker
    if (!ChecksumOk(h)) return broken(pos, "bad header checksum (not a tar file, or corrupt)");
    const std::optional<uint64_t> size = Number(h + 124, 12);
    if (!size) return broken(pos, "bad size field");
    const uint64_t data_at = pos + kBlock;
    if (*size > n - data_at) {
      return broken(pos,
                    "member of " + std::to_string(*size) + " bytes is cut short: the shard has " +
                        std::to_string(n - data_at) + " bytes after its header",
                    long_name ? std::string_view(*long_name) : Field(h, 100));
    }
    const uint64_t padded = (*size + kBlock - 1) / kBlock * kBlock;
    const uint64_t next = std::min<uint64_t>(n, data_at + padded);
    const char type = h[156];
    const std::string_view body = data.substr(data_at, *size);
    if (type == 'x') {
      Result<std::optional<std::string>> p = PaxPath(body, Where(url, pos));
      if (!p.ok()) return broken(pos, "malformed pax extended header");
      if (*p) long_name = std::move(**p);
      pos = next;
      continue;
    }
    if (type == 'L') {
      long_name = std::string(Field(body.data(), body.size()));
      pos = next;
      continue;
    }
    if (type == 'g' || type == 'K') {
      pos = next;
      continue;
    }
    std::string name;
    if (long_name) {
      name = std::move(*long_name);
      long_name.reset();
    } else {
      const std::string_view base = Field(h, 100);
      const std::string_view prefix = Field(h + 345, 155);
      const bool ustar = std::string_view(h + 257, 5) == "ustar";
      name = ustar && !prefix.empty() ? std::string(prefix) + "/" + std::string(base) : std::string(base);
    }
    const uint64_t header_at = pos;
    pos = next;
    if (type != '0' && type != '\0' && type != '7') continue;  // directories, links, devices
    const std::string key(KeyOf(name));
    const std::string ext = key.size() < name.size() ? Lower(std::string_view(name).substr(key.size() + 1)) : "";
    if (!group || group->key != key) {
      DDP_RETURN_IF_ERROR(flush());
      group = Group{key, header_at, TarSample{}, false, std::nullopt, std::nullopt};
    }
    Group& g = *group;
    if (ext == "jpg" || ext == "jpeg" || ext == "png") {
      g.has_image = true;
      g.sample->image_offset = data_at;
      g.sample->image_size = *size;
    } else if (opt.label_field.empty() ? ext == "cls" : ext == "json") {
      std::optional<int64_t> label =
          opt.label_field.empty() ? ParseInt(body) : JsonIntField(body, opt.label_field);
      if (!label) {
        g.error = opt.label_field.empty()
                      ? "label member '" + name + "' is not an integer"
                      : "'" + name + "' has no integer field \"" + opt.label_field + "\"";
      } else {
        g.label = label;
      }
    }
  }
  DDP_RETURN_IF_ERROR(flush());
  return out;
}

}  // namespace ddp::shards
