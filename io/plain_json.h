// A cursor over the plain JSON that machine writers produce, for fast paths that read a known
// shape straight from the text without building a tree (io/json.h builds one). It takes a subset
// of JSON's grammar: whitespace, punctuation, strings without escapes or control characters, and
// unsigned integers as JSON writes them. Each step returns false on anything else, and the caller
// then gives the text to the strict parser, which accepts the rest of JSON and names every
// problem: a fast path built on this cursor must accept only what the strict path accepts, with
// the same result.
#pragma once

#include <cstdint>
#include <string_view>

namespace strata {

class PlainJson {
 public:
  explicit PlainJson(std::string_view text) : p_(text.data()), end_(text.data() + text.size()) {}

  void skip_space() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t'))
      ++p_;
  }
  // The next non-space character is `c`: consumes both.
  bool take(char c) {
    skip_space();
    if (p_ == end_ || *p_ != c) return false;
    ++p_;
    return true;
  }
  // A string without escapes or control characters; its bytes between the quotes in `out`.
  // Bytes >= 0x80 only with `non_ascii` (the caller has checked the text is valid UTF-8).
  bool string(std::string_view* out, bool non_ascii) {
    if (!take('"')) return false;
    const char* start = p_;
    for (; p_ < end_; ++p_) {
      const auto c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        *out = std::string_view(start, static_cast<size_t>(p_ - start));
        ++p_;
        return true;
      }
      if (c == '\\' || c < 0x20 || (c >= 0x80 && !non_ascii)) return false;
    }
    return false;
  }
  // An integer in [0, max] as JSON writes one (no sign, fraction, exponent or leading zero); at
  // most 19 digits, so it never wraps.
  bool uint(uint64_t max, uint64_t* out) {
    skip_space();
    const char* start = p_;
    uint64_t v = 0;
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9' && p_ - start < 19) {
      v = v * 10 + static_cast<uint64_t>(*p_ - '0');
      ++p_;
    }
    const size_t digits = static_cast<size_t>(p_ - start);
    if (digits == 0 || (digits > 1 && *start == '0') || v > max) return false;
    if (p_ < end_ && ((*p_ >= '0' && *p_ <= '9') || *p_ == '.' || *p_ == 'e' || *p_ == 'E'))
      return false;
    *out = v;
    return true;
  }
  // The literal `null`, not followed by a letter or digit.
  bool null() {
    skip_space();
    if (end_ - p_ < 4 || std::string_view(p_, 4) != "null") return false;
    p_ += 4;
    return p_ == end_ || !((*p_ >= 'a' && *p_ <= 'z') || (*p_ >= '0' && *p_ <= '9'));
  }
  // Only whitespace is left.
  bool at_end() {
    skip_space();
    return p_ == end_;
  }

 private:
  const char* p_;
  const char* end_;
};

}  // namespace strata
