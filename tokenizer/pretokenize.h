// Pre-tokenization: cutting normalized text into words before BPE, as tokenizer.json's
// "pre_tokenizer" describes. Supported: Split (regex or literal, every behaviour, invert),
// Digits, ByteLevel (use_regex, add_prefix_space; it must come last, byte mapping itself is done
// by the BPE model on raw bytes) and Sequence of these. Regexes run on PCRE2 with Unicode
// properties; patterns written for Oniguruma (Hugging Face tokenizers) or Rust regex (tiktoken)
// are translated where the dialects differ (see translate_pattern).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/regex.h"
#include "io/json.h"

namespace strata {

// The PCRE2 form of a pattern written for Oniguruma or Rust regex: \s and \S become Unicode's
// White_Space set spelled out (PCRE2's own \s also matches U+180E, which those two do not); a
// class intersection [A&&[^B]] (Rust regex) becomes a lookahead. Exposed for tests.
std::string translate_pattern(const std::string& pattern, const std::string& what);

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class PreTokenizer {
 public:
  // From tokenizer.json's "pre_tokenizer" value; `what` names the file.
  static PreTokenizer from_json(const Json& j, const std::string& what);
  // A single Split(pattern, Isolated): what tiktoken does with its pat_str.
  static PreTokenizer from_pattern(const std::string& pattern, const std::string& what);

  // Calls `word` for each pre-token of valid UTF-8 `text`, in order; empty words are dropped.
  // A word may point into a temporary: use it before returning.
  void split(std::string_view text, const std::function<void(std::string_view)>& word) const;

  bool has_byte_level() const { return has_byte_level_; }

 private:
  struct Step {
    enum class Kind { kSplit, kByteLevel } kind = Kind::kSplit;
    std::shared_ptr<Regex> regex;  // null for a ByteLevel step without use_regex
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;  // ByteLevel only
  };
  void add_json(const Json& j, const std::string& what);
  void run(size_t step, std::string_view text,
           const std::function<void(std::string_view)>& word) const;

  std::vector<Step> steps_;
  bool has_byte_level_ = false;
};

}  // namespace strata
