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

}  // namespace

std::optional<int64_t> ParseIntText(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

int FieldOf(const std::vector<std::string>& fields, std::string_view ext) {
  for (size_t i = 0; i < fields.size(); ++i) {
    std::string_view f = fields[i];
    while (!f.empty()) {
      const size_t semi = f.find(';');
      const std::string_view alt = f.substr(0, semi);
      if (alt.size() == ext.size() && std::equal(alt.begin(), alt.end(), ext.begin(), [](char a, char b) {
            return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
          })) {
        return static_cast<int>(i);
      }
      if (semi == std::string_view::npos) break;
      f.remove_prefix(semi + 1);
    }
  }
  return -1;
}

namespace {

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
    return ParseIntText(json.substr(i, j - i));
  }
  return std::nullopt;
}

// The sample key of a member name: up to the first '.' of its last path component.
std::string_view KeyOf(std::string_view name) {
  const size_t slash = name.rfind('/');
  const size_t dot = name.find('.', slash == std::string_view::npos ? 0 : slash + 1);
  return dot == std::string_view::npos ? name : name.substr(0, dot);
}

bool IsImage(std::string_view ext) { return ext == "jpg" || ext == "jpeg" || ext == "png"; }

}  // namespace

// One sample being gathered from consecutive members.
struct TarStream::Group {
  std::string key;
  uint64_t offset = 0;  // of its first member's header
  bool keep = true;     // keep the image's bytes
  bool has_image = false;
  uint64_t image_offset = 0, image_size = 0;
  std::string image;
  std::optional<int64_t> label;
  std::optional<std::string> error;  // a bad label: the sample is bad
  std::vector<std::optional<std::string>> fields;  // with options.fields: each one's bytes
};

TarStream::TarStream(std::string url, TarParseOptions options) : url_(std::move(url)), opt_(std::move(options)) {}

void TarStream::Append(std::string_view bytes) {
  if (finished_ || done_) return;
  const uint64_t start = total_;
  total_ += bytes.size();
  // Bytes of a member being skipped are dropped as they arrive.
  if (start < pos_) {
    const uint64_t drop = std::min<uint64_t>(pos_ - start, bytes.size());
    bytes.remove_prefix(static_cast<size_t>(drop));
  }
  buf_.append(bytes);
}

void TarStream::Finish() { finished_ = true; }

size_t TarStream::buffered() const {
  size_t n = buf_.size() - head_;
  for (const TarSample& s : out_) {
    n += s.image.size();
    for (const std::string& f : s.fields) n += f.size();
  }
  if (group_) {
    n += group_->image.size();
    for (const auto& f : group_->fields) n += f ? f->size() : 0;
  }
  return n;
}

void TarStream::Compact() {
  if (head_ >= buf_.size()) {
    buf_.clear();
    head_ = 0;
  } else if (head_ > (1u << 20) && head_ > buf_.size() / 2) {
    buf_.erase(0, head_);
    head_ = 0;
  }
}

Status TarStream::Flush() {
  if (!group_) return Status::Ok();
  std::shared_ptr<Group> g = std::move(group_);
  std::string problem;
  if (g->error) {
    problem = *g->error;
  } else if (!opt_.fields.empty()) {
    for (size_t i = 0; i < opt_.fields.size() && problem.empty(); ++i) {
      if (!g->fields[i]) problem = "sample '" + g->key + "' has no '" + opt_.fields[i] + "' member";
    }
  } else if (!g->has_image) {
    problem = "sample '" + g->key + "' has no image (.jpg, .jpeg or .png member)";
  }
  if (!problem.empty()) {
    if (opt_.skip_errors) {
      ++skipped_;
      return Status::Ok();
    }
    return InvalidArgumentError(Where(url_, g->offset) + ": " + problem);
  }
  TarSample s;
  s.key = std::move(g->key);
  s.image_offset = g->image_offset;
  s.image_size = g->image_size;
  s.label = g->label.value_or(-1);
  s.ordinal = good_++;
  s.image = std::move(g->image);
  for (std::optional<std::string>& f : g->fields) s.fields.push_back(std::move(f).value_or(std::string()));
  out_.push_back(std::move(s));
  return Status::Ok();
}

// A broken archive: with skip_errors the rest of the shard is dropped and counted as one
// skip, else an error. The sample in progress is kept unless the broken member (when its
// header is readable) belongs to it.
Status TarStream::Broken(uint64_t at, const std::string& what, std::string_view member) {
  if (!opt_.skip_errors) return DataLossError(Where(url_, at) + ": " + what);
  if (group_ && !member.empty() && KeyOf(member) == group_->key) group_.reset();
  DDP_RETURN_IF_ERROR(Flush());
  ++skipped_;
  done_ = true;
  return Status::Ok();
}

namespace {
std::string CutShort(uint64_t size, uint64_t after) {
  return "member of " + std::to_string(size) + " bytes is cut short: the shard has " + std::to_string(after) +
         " bytes after its header";
}
}  // namespace

// Parses one header (and its member) if its bytes are here; `progressed` says whether
// the stream moved on.
Status TarStream::Step(bool* progressed) {
  *progressed = false;
  if (pos_ > total_) {  // inside a member being skipped
    if (!finished_) return Status::Ok();
    if (skipping_ && total_ < skipping_->end) {
      const Skipped& k = *skipping_;
      return Broken(k.header_at, CutShort(k.end - k.header_at - kBlock, total_ - k.header_at - kBlock), k.name);
    }
    done_ = true;  // the shard ends inside the last member's padding
    return Flush();
  }
  skipping_.reset();
  const std::string_view avail = Avail();
  if (avail.size() < kBlock) {
    if (!finished_) return Status::Ok();
    if (avail.empty()) {
      done_ = true;
      return Flush();
    }
    return Broken(pos_, "shard ends inside a header (" + std::to_string(avail.size()) + " bytes left)");
  }
  const char* h = avail.data();
  if (AllZero(h, kBlock)) {  // end-of-archive marker
    done_ = true;
    return Flush();
  }
  if (!ChecksumOk(h)) return Broken(pos_, "bad header checksum (not a tar file, or corrupt)");
  const std::optional<uint64_t> size = Number(h + 124, 12);
  if (!size) return Broken(pos_, "bad size field");
  const uint64_t header_at = pos_;
  const uint64_t data_at = pos_ + kBlock;
  if (*size > (uint64_t{1} << 62)) return Broken(pos_, CutShort(*size, total_ - data_at));
  const uint64_t next = data_at + (*size + kBlock - 1) / kBlock * kBlock;
  const char type = h[156];
  const bool meta = type == 'x' || type == 'L';
  const bool regular = type == '0' || type == '\0' || type == '7';
  std::string name;
  if (long_name_) {
    name = *long_name_;
  } else {
    const std::string_view base = Field(h, 100);
    const std::string_view prefix = Field(h + 345, 155);
    const bool ustar = std::string_view(h + 257, 5) == "ustar";
    name = ustar && !prefix.empty() ? std::string(prefix) + "/" + std::string(base) : std::string(base);
  }
  bool need_body = meta;
  std::string ext;
  if (regular) {
    const std::string key(KeyOf(name));
    ext = key.size() < name.size() ? Lower(std::string_view(name).substr(key.size() + 1)) : "";
    if (!group_ || group_->key != key) {
      DDP_RETURN_IF_ERROR(Flush());
      group_ = std::make_shared<Group>();
      group_->key = key;
      group_->offset = header_at;
      group_->keep = !keep_ || keep_(good_);
      group_->fields.resize(opt_.fields.size());
    }
    if (opt_.fields.empty()) {
      const bool label = opt_.label_field.empty() ? ext == "cls" : ext == "json";
      need_body = label || (IsImage(ext) && group_->keep);
    } else {
      need_body = group_->keep && FieldOf(opt_.fields, ext) >= 0;
    }
  }
  if (need_body && data_at + *size > total_) {
    if (finished_) return Broken(header_at, CutShort(*size, total_ - data_at), name);
    return Status::Ok();  // wait for the member's bytes
  }
  const std::string_view body = need_body ? avail.substr(kBlock, static_cast<size_t>(*size)) : std::string_view();
  *progressed = true;
  if (type == 'x') {
    Result<std::optional<std::string>> p = PaxPath(body, Where(url_, header_at));
    if (!p.ok()) return Broken(header_at, "malformed pax extended header");
    if (*p) long_name_ = std::move(**p);
  } else if (type == 'L') {
    long_name_ = std::string(Field(body.data(), body.size()));
  } else if (type != 'g' && type != 'K') {
    long_name_.reset();
  }
  if (regular && !opt_.fields.empty()) {
    const int f = FieldOf(opt_.fields, ext);
    if (f >= 0) group_->fields[static_cast<size_t>(f)] = std::string(body);
  } else if (regular) {
    Group& g = *group_;
    if (IsImage(ext)) {
      g.has_image = true;
      g.image_offset = data_at;
      g.image_size = *size;
      if (g.keep) g.image.assign(body);
    } else if (opt_.label_field.empty() ? ext == "cls" : ext == "json") {
      std::optional<int64_t> label = opt_.label_field.empty() ? ParseIntText(body) : JsonIntField(body, opt_.label_field);
      if (!label) {
        g.error = opt_.label_field.empty() ? "label member '" + name + "' is not an integer"
                                           : "'" + name + "' has no integer field \"" + opt_.label_field + "\"";
      } else {
        g.label = label;
      }
    }
  }
  if (data_at + *size > total_) skipping_ = Skipped{header_at, data_at + *size, name};
  if (next <= total_) {
    head_ += static_cast<size_t>(next - pos_);
  } else {
    buf_.clear();
    head_ = 0;
  }
  pos_ = next;
  Compact();
  return Status::Ok();
}

Result<std::optional<TarSample>> TarStream::Next() {
  if (!failed_.ok()) return failed_;
  for (;;) {
    if (!out_.empty()) {
      TarSample s = std::move(out_.front());
      out_.pop_front();
      ++yielded_;
      return std::optional<TarSample>(std::move(s));
    }
    if (done_) return std::optional<TarSample>();
    bool progressed = false;
    Status st = Step(&progressed);
    if (!st.ok()) {
      failed_ = st;
      return st;
    }
    if (!progressed && out_.empty() && !done_) return std::optional<TarSample>();
  }
}

Result<TarShard> ParseTar(std::string_view data, std::string_view url, const TarParseOptions& opt) {
  TarStream stream{std::string(url), opt};
  stream.SetKeep([](int64_t) { return false; });
  stream.Append(data);
  stream.Finish();
  TarShard out;
  for (;;) {
    DDP_ASSIGN_OR_RETURN(std::optional<TarSample> s, stream.Next());
    if (!s) break;
    out.samples.push_back(std::move(*s));
  }
  out.skipped = stream.skipped();
  return out;
}

}  // namespace ddp::shards
