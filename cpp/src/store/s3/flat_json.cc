#include "store/s3/flat_json.h"

#include <cstdint>

namespace ddp::store_internal {
namespace {

constexpr int kMaxDepth = 32;

class Reader {
 public:
  explicit Reader(std::string_view text) : s_(text) {}

  Result<std::map<std::string, std::string>> Document() {
    std::map<std::string, std::string> out;
    SkipSpace();
    if (!Eat('{')) return Fail("expected '{'");
    SkipSpace();
    if (!Eat('}')) {
      while (true) {
        SkipSpace();
        std::string key;
        if (Status st = String(&key); !st.ok()) return st;
        SkipSpace();
        if (!Eat(':')) return Fail("expected ':'");
        SkipSpace();
        std::string value;
        bool scalar = false;
        if (Status st = Value(1, &value, &scalar); !st.ok()) return st;
        if (out.contains(key)) return Fail("duplicate member \"" + Printable(key) + "\"");
        if (scalar) out.emplace(std::move(key), std::move(value));
        SkipSpace();
        if (Eat(',')) continue;
        if (Eat('}')) break;
        return Fail("expected ',' or '}'");
      }
    }
    SkipSpace();
    if (pos_ != s_.size()) return Fail("trailing characters after the object");
    return out;
  }

 private:
  Status Fail(const std::string& why) const {
    return DataLossError("malformed JSON at byte " + std::to_string(pos_) + ": " + why);
  }

  // Member names are safe to show (they are field names), but cap and sanitise them.
  static std::string Printable(std::string_view k) {
    std::string out;
    for (char c : k.substr(0, 40)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
    return out;
  }

  bool Eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  void SkipSpace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  // A value; `*scalar` tells whether it is kept (not an object or array).
  Status Value(int depth, std::string* out, bool* scalar) {
    if (depth > kMaxDepth) return Fail("nesting deeper than " + std::to_string(kMaxDepth));
    if (pos_ >= s_.size()) return Fail("unexpected end");
    char c = s_[pos_];
    *scalar = true;
    if (c == '"') return String(out);
    if (c == '{' || c == '[') {
      *scalar = false;
      return Container(depth);
    }
    if (Literal("true")) {
      *out = "true";
      return Status::Ok();
    }
    if (Literal("false")) {
      *out = "false";
      return Status::Ok();
    }
    if (Literal("null")) {
      out->clear();
      return Status::Ok();
    }
    return Number(out);
  }

  Status Container(int depth) {
    char close = s_[pos_] == '{' ? '}' : ']';
    bool object = close == '}';
    ++pos_;
    SkipSpace();
    if (Eat(close)) return Status::Ok();
    while (true) {
      SkipSpace();
      std::string ignored;
      if (object) {
        if (Status st = String(&ignored); !st.ok()) return st;
        SkipSpace();
        if (!Eat(':')) return Fail("expected ':'");
        SkipSpace();
      }
      bool scalar = false;
      if (Status st = Value(depth + 1, &ignored, &scalar); !st.ok()) return st;
      SkipSpace();
      if (Eat(',')) continue;
      if (Eat(close)) return Status::Ok();
      return Fail(std::string("expected ',' or '") + close + "'");
    }
  }

  Status Number(std::string* out) {
    size_t start = pos_;
    auto digits = [&] {
      size_t d = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      return pos_ - d;
    };
    Eat('-');
    if (pos_ < s_.size() && s_[pos_] == '0') {
      ++pos_;
    } else if (digits() == 0) {
      return Fail("expected a value");
    }
    if (Eat('.') && digits() == 0) return Fail("expected digits after '.'");
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (!Eat('+')) Eat('-');
      if (digits() == 0) return Fail("expected exponent digits");
    }
    *out = std::string(s_.substr(start, pos_ - start));
    return Status::Ok();
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      *out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      *out += static_cast<char>(0xC0 | (cp >> 6));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      *out += static_cast<char>(0xE0 | (cp >> 12));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      *out += static_cast<char>(0xF0 | (cp >> 18));
      *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  bool Hex4(uint32_t* cp) {
    if (s_.size() - pos_ < 4) return false;
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_ + i];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<uint32_t>(c - 'A' + 10);
      } else {
        return false;
      }
    }
    pos_ += 4;
    *cp = v;
    return true;
  }

  Status String(std::string* out) {
    out->clear();
    if (!Eat('"')) return Fail("expected a string");
    while (true) {
      if (pos_ >= s_.size()) return Fail("unterminated string");
      unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return Status::Ok();
      }
      if (c < 0x20) return Fail("control character in a string");
      if (c != '\\') {
        *out += static_cast<char>(c);
        ++pos_;
        continue;
      }
      ++pos_;
      if (pos_ >= s_.size()) return Fail("unterminated escape");
      char e = s_[pos_++];
      switch (e) {
        case '"': *out += '"'; break;
        case '\\': *out += '\\'; break;
        case '/': *out += '/'; break;
        case 'b': *out += '\b'; break;
        case 'f': *out += '\f'; break;
        case 'n': *out += '\n'; break;
        case 'r': *out += '\r'; break;
        case 't': *out += '\t'; break;
        case 'u': {
          uint32_t cp = 0;
          if (!Hex4(&cp)) return Fail("bad \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t low = 0;
            if (!Literal("\\u") || !Hex4(&low) || low < 0xDC00 || low > 0xDFFF) {
              return Fail("unpaired surrogate in a \\u escape");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return Fail("unpaired surrogate in a \\u escape");
          }
          AppendUtf8(cp, out);
          break;
        }
        default: return Fail("bad escape");
      }
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

Result<std::map<std::string, std::string>> ParseFlatJsonObject(std::string_view text) {
  return Reader(text).Document();
}

}  // namespace ddp::store_internal
