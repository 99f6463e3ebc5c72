#include "shards/tar_testutil.h"

#include <cstdio>
#include <cstring>

namespace ddp::shards::testing {

namespace {

void Octal(char* field, size_t width, uint64_t v) {
  std::snprintf(field, width, "%0*llo", static_cast<int>(width - 1), static_cast<unsigned long long>(v));
}

std::string Header(std::string_view name, uint64_t size, char type) {
  std::string h(512, '\0');
  std::string_view base = name, prefix;
  if (name.size() > 100) {
    const size_t cut = name.rfind('/', 155);
    prefix = name.substr(0, cut);
    base = name.substr(cut + 1);
  }
  if (!base.empty()) std::memcpy(h.data(), base.data(), std::min<size_t>(base.size(), 100));
  Octal(h.data() + 100, 8, 0644);
  Octal(h.data() + 108, 8, 0);
  Octal(h.data() + 116, 8, 0);
  Octal(h.data() + 124, 12, size);
  Octal(h.data() + 136, 12, 0);
  h[156] = type;
  std::memcpy(h.data() + 257, "ustar\0" "00", 8);
  if (!prefix.empty()) std::memcpy(h.data() + 345, prefix.data(), std::min<size_t>(prefix.size(), 155));
  std::memset(h.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (char c : h) sum += static_cast<unsigned char>(c);
  std::snprintf(h.data() + 148, 8, "%06o", sum);
  return h;
}

std::string Padded(std::string_view data) {
  std::string out(data);
  out.resize((data.size() + 511) / 512 * 512, '\0');
  return out;
}

}  // namespace

std::string TarMember(std::string_view name, std::string_view data, char type) {
  return Header(name, data.size(), type) + Padded(data);
}

std::string PaxMember(std::string_view path, std::string_view data) {
  std::string rec = " path=" + std::string(path) + "\n";
  // The record's length counts its own digits.
  size_t len = rec.size() + 1;
  while (std::to_string(len).size() + rec.size() != len) ++len;
  rec = std::to_string(len) + rec;
  return TarMember("PaxHeaders/x", rec, 'x') + TarMember("short-name-ignored", data);
}

std::string GnuLongMember(std::string_view name, std::string_view data) {
  std::string n(name);
  n.push_back('\0');
  return TarMember("././@LongLink", n, 'L') + TarMember(name.substr(0, 99), data);
}

std::string TarEnd() { return std::string(1024, '\0'); }

}  // namespace ddp::shards::testing
