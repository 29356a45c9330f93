// Text normalization before pre-tokenization: UTF-8 repair and the Unicode normal forms that
// tokenizer.json's "normalizer" names (NFC for Qwen2/3; none, or an empty Sequence, elsewhere).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "io/json.h"

namespace strata {

// Replaces each maximal ill-formed subpart of `text` with U+FFFD, as Python's
// bytes.decode("utf-8", errors="replace") does (the Unicode recommended practice). Returns true
// and fills `out` when something was replaced; returns false (out untouched) for valid UTF-8.
bool utf8_repair(std::string_view text, std::string& out);

// Decodes one code point of valid UTF-8 at text[i]; advances i.
char32_t utf8_next(std::string_view text, size_t& i);
void utf8_append(char32_t cp, std::string& out);

enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };

class Normalizer {
 public:
  // From tokenizer.json's "normalizer" value (null, a form, or a Sequence of them). Anything
  // else is an error naming the type; `what` names the file.
  static Normalizer from_json(const Json& j, const std::string& what);

  // Normalizes valid UTF-8. Returns false when the text is already normalized (out untouched).
  bool apply(std::string_view text, std::string& out) const;
  bool empty() const { return forms_.empty(); }

 private:
  std::vector<NormalForm> forms_;
};

}  // namespace strata
