#include "shards/npy.h"

#include <cctype>
#include <charconv>
#include <optional>

namespace ddp::shards {

namespace {

constexpr std::string_view kMagic = "\x93NUMPY";

// A cursor over the header's dict literal.
class HeaderReader {
 public:
  explicit HeaderReader(std::string_view s) : s_(s) {}
  void Space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool Eat(char c) {
    Space();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  std::optional<std::string> String() {
    Space();
    if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) return std::nullopt;
    const char q = s_[i_++];
    const size_t end = s_.find(q, i_);
    if (end == std::string_view::npos) return std::nullopt;
    std::string out(s_.substr(i_, end - i_));
    i_ = end + 1;
    return out;
  }
  std::optional<bool> Bool() {
    Space();
    for (const auto& [word, v] : {std::pair<std::string_view, bool>{"True", true}, {"False", false}}) {
      if (s_.substr(i_, word.size()) == word) {
        i_ += word.size();
        return v;
      }
    }
    return std::nullopt;
  }
  std::optional<int64_t> Int() {
    Space();
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(s_.data() + i_, s_.data() + s_.size(), v);
    if (ec != std::errc() || end == s_.data() + i_) return std::nullopt;
    i_ = static_cast<size_t>(end - s_.data());
    // numpy writes Python ints; an "L" suffix came from Python 2.
    if (i_ < s_.size() && s_[i_] == 'L') ++i_;
    return v;
  }
  bool AtEnd() {
    Space();
    return i_ == s_.size();
  }

 private:
  std::string_view s_;
  size_t i_ = 0;
};

}  // namespace

int64_t NpyArray::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

Result<NpyArray> ParseNpy(std::string_view bytes, std::string_view where) {
  auto bad = [&](const std::string& what) { return DataLossError(std::string(where) + ": bad .npy: " + what); };
  if (bytes.size() < kMagic.size() + 2 || bytes.substr(0, kMagic.size()) != kMagic) {
    return bad("no \\x93NUMPY magic (not a .npy file)");
  }
  const auto major = static_cast<unsigned char>(bytes[6]);
  const auto minor = static_cast<unsigned char>(bytes[7]);
  if (major < 1 || major > 3 || minor != 0) {
    return bad("version " + std::to_string(major) + "." + std::to_string(minor) + " (1.0, 2.0 and 3.0 are read)");
  }
  const size_t len_bytes = major == 1 ? 2 : 4;
  const size_t start = 8 + len_bytes;
  if (bytes.size() < start) return bad("cut short inside its header length");
  uint64_t header_len = 0;
  for (size_t i = 0; i < len_bytes; ++i) header_len |= uint64_t{static_cast<unsigned char>(bytes[8 + i])} << (8 * i);
  if (header_len > bytes.size() - start) {
    return bad("header of " + std::to_string(header_len) + " bytes, only " + std::to_string(bytes.size() - start) +
               " bytes follow");
  }
  HeaderReader h(bytes.substr(start, header_len));
  NpyArray out;
  std::optional<std::string> descr;
  std::optional<bool> fortran;
  std::optional<std::vector<int64_t>> shape;
  if (!h.Eat('{')) return bad("header is not a dict");
  for (;;) {
    if (h.Eat('}')) break;
    std::optional<std::string> key = h.String();
    if (!key || !h.Eat(':')) return bad("header dict is malformed");
    if (*key == "descr") {
      descr = h.String();
      if (!descr) return bad("'descr' is not a string (structured dtypes are not read)");
    } else if (*key == "fortran_order") {
      fortran = h.Bool();
      if (!fortran) return bad("'fortran_order' is not True or False");
    } else if (*key == "shape") {
      if (!h.Eat('(')) return bad("'shape' is not a tuple");
      std::vector<int64_t> dims;
      if (!h.Eat(')')) {
        for (;;) {
          std::optional<int64_t> d = h.Int();
          if (!d || *d < 0) return bad("'shape' holds something other than sizes >= 0");
          dims.push_back(*d);
          if (dims.size() > 32) return bad("'shape' has more than 32 dimensions");
          if (h.Eat(')')) break;
          if (!h.Eat(',')) return bad("'shape' is malformed");
          if (h.Eat(')')) break;  // a trailing comma: (5,)
        }
      }
      shape = std::move(dims);
    } else {
      return bad("unknown header key '" + *key + "'");
    }
    if (h.Eat(',')) continue;
    if (h.Eat('}')) break;
    return bad("header dict is malformed");
  }
  if (!h.AtEnd()) return bad("bytes after the header dict");
  if (!descr || !fortran || !shape) return bad("header lacks 'descr', 'fortran_order' or 'shape'");
  if (*fortran) return bad("Fortran order (only C-order arrays are read)");
  const std::string& d = *descr;
  int itemsize = 0;
  if (d.size() >= 3 && (d[0] == '<' || d[0] == '|' || d[0] == '=') &&
      std::from_chars(d.data() + 2, d.data() + d.size(), itemsize).ec == std::errc() &&
      std::to_string(itemsize) == d.substr(2)) {
    const char k = d[1];
    const bool ok = (k == 'b' && itemsize == 1) || ((k == 'i' || k == 'u') && (itemsize == 1 || itemsize == 2 ||
                                                                             itemsize == 4 || itemsize == 8)) ||
                    (k == 'f' && (itemsize == 2 || itemsize == 4 || itemsize == 8));
    if (!ok || (d[0] == '|' && itemsize != 1)) itemsize = 0;
  } else {
    itemsize = 0;
  }
  if (itemsize == 0) {
    return bad("dtype '" + d + "' is not read (bool, int8-64, uint8-64, float16/32/64, little-endian)");
  }
  out.descr = d;
  out.kind = d[1];
  out.itemsize = itemsize;
  out.shape = std::move(*shape);
  uint64_t n = static_cast<uint64_t>(itemsize);
  for (int64_t dim : out.shape) {
    if (dim != 0 && n > (uint64_t{1} << 62) / static_cast<uint64_t>(dim)) return bad("shape " + ShapeString(out.shape) + " overflows");
    n *= static_cast<uint64_t>(dim);
  }
  out.data_offset = start + header_len;
  out.data_size = bytes.size() - out.data_offset;
  if (out.data_size != n) {
    return bad("shape " + ShapeString(out.shape) + " of " + d + " needs " + std::to_string(n) + " bytes of data, it has " +
               std::to_string(out.data_size));
  }
  return out;
}

}  // namespace ddp::shards
