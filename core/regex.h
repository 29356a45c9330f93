// One compiled PCRE2 pattern: the tokenizer's pre-tokenizer splits (after translating Oniguruma /
// Rust-regex patterns, tokenizer/pretokenize.h) and compressed-tensors' "re:" ignore entries
// (export/plan.cpp), which are Python `re` patterns (PCRE2 reads the ones checkpoints ship alike).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace strata {

// Compiled with UTF and UCP (\w, \d, \s and POSIX classes are Unicode's), JIT-compiled where the
// library has a JIT. Thread-safe to use: each thread matches with its own match state.
class Regex {
 public:
  // `pattern` in PCRE2's syntax; `what` names where it came from and starts every error. A pattern
  // that does not compile is a strata::Error naming the offset.
  Regex(const std::string& pattern, std::string what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Finds the first match at or after byte `start` of valid UTF-8 `text`. Returns false when
  // there is none; otherwise sets [begin, end).
  bool find(std::string_view text, size_t start, size_t& begin, size_t& end) const;

  // Whether a match starts at the first byte of valid UTF-8 `text` (Python's re.match).
  bool matches_at_start(std::string_view text) const;

 private:
  int match(std::string_view text, size_t start, unsigned options) const;

  void* code_ = nullptr;  // pcre2_code_8*
  std::string what_;
};

}  // namespace strata
