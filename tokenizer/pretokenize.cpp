#include "tokenizer/pretokenize.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/normalize.h"

namespace strata {

namespace {

// GPT-2's pattern, which ByteLevel(use_regex=true) splits with.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Unicode's White_Space property as a class body: what \s means to Oniguruma (Hugging Face
// tokenizers) and Rust regex (tiktoken). PCRE2's \s differs (it also takes U+180E).
constexpr const char* kWhiteSpace =
    R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// Finds the ']' closing the class that opens at p[i] == '['; handles escapes and nested classes.
size_t class_end(const std::string& p, size_t i, const std::string& what) {
  int depth = 0;
  size_t j = i;
  while (j < p.size()) {
    char c = p[j];
    if (c == '\\') {
      j += 2;
      continue;
    }
    if (c == '[') {
      ++depth;
      // A ']' right after '[' or '[^' is a literal.
      if (j + 1 < p.size() && p[j + 1] == '^') ++j;
      if (j + 1 < p.size() && p[j + 1] == ']') ++j;
    } else if (c == ']') {
      if (--depth == 0) return j;
    }
    ++j;
  }
  fail(what, ": unbalanced '[' in pre-tokenizer pattern");
}

// Rewrites the body of a character class (between the brackets) for PCRE2.
std::string translate_class_body(const std::string& body, const std::string& what) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] == '\\' && i + 1 < body.size()) {
      char e = body[i + 1];
      STRATA_CHECK(e != 'S', what,
                   ": \\S inside a character class is not supported in pre-tokenizer patterns");
      if (e == 's') {
        out += kWhiteSpace;
      } else {
        out += body.substr(i, 2);
      }
      ++i;
    } else {
      out += body[i];
    }
  }
  return out;
}

std::string translate(const std::string& p, const std::string& what) {
  std::string out;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[i + 1];
      if (e == 's') {
        out += std::string("[") + kWhiteSpace + "]";
      } else if (e == 'S') {
        out += std::string("[^") + kWhiteSpace + "]";
      } else {
        out += p.substr(i, 2);
      }
      ++i;
      continue;
    }
    if (c != '[') {
      out += c;
      continue;
    }
    size_t end = class_end(p, i, what);
    std::string inner = p.substr(i + 1, end - i - 1);  // without the outer brackets
    size_t amp = std::string::npos;
    {
      // Find a top-level "&&" (not inside a nested class).
      int depth = 0;
      for (size_t k = 0; k + 1 < inner.size(); ++k) {
        if (inner[k] == '\\') {
          ++k;
          continue;
        }
        if (inner[k] == '[') ++depth;
        if (inner[k] == ']') --depth;
        if (depth == 0 && inner[k] == '&' && inner[k + 1] == '&') {
          amp = k;
          break;
        }
      }
    }
    if (amp == std::string::npos) {
      out += "[" + translate_class_body(inner, what) + "]";
    } else {
      // [A&&B] -> (?:(?=B)[A]) where B is a class; [A&&[^B]] reads as "A but not B".
      std::string left = inner.substr(0, amp);
      std::string right = inner.substr(amp + 2);
      STRATA_CHECK(!left.empty() && left[0] != '^', what,
                   ": class intersection with a negated left side is not supported in "
                   "pre-tokenizer patterns");
      STRATA_CHECK(right.size() >= 2 && right.front() == '[' && right.back() == ']', what,
                   ": class intersection must have a bracketed right side ([A&&[B]]) in "
                   "pre-tokenizer patterns");
      out += "(?:(?=" + translate(right, what) + ")[" + translate_class_body(left, what) + "])";
    }
    i = end;
  }
  return out;
}

std::string escape_literal(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}-/#").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

SplitBehavior behavior_from(const std::string& s, const std::string& what) {
  if (s == "Removed") return SplitBehavior::kRemoved;
  if (s == "Isolated") return SplitBehavior::kIsolated;
  if (s == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (s == "Contiguous") return SplitBehavior::kContiguous;
  fail(what, ": Split behavior '", s, "' is unknown");
}

bool get_bool(const Json& j, const char* key, bool dflt, const std::string& what) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  STRATA_CHECK(j[key].is_boolean(), what, ": pre_tokenizer key \"", key,
               "\" must be true or false");
  return j[key].get<bool>();
}

}  // namespace

std::string translate_pattern(const std::string& pattern, const std::string& what) {
  return translate(pattern, what);
}

void PreTokenizer::add_json(const Json& j, const std::string& what) {
  if (j.is_null()) return;
  STRATA_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(), what,
               ": \"pre_tokenizer\" must be null or an object with a \"type\"");
  const std::string type = j["type"].get<std::string>();
  STRATA_CHECK(!has_byte_level_, what, ": pre_tokenizer '", type,
               "' after ByteLevel is not supported (ByteLevel must be the last pre-tokenizer)");
  if (type == "Sequence") {
    STRATA_CHECK(j.contains("pretokenizers") && j["pretokenizers"].is_array(), what,
                 ": pre_tokenizer Sequence needs a \"pretokenizers\" list");
    for (const Json& p : j["pretokenizers"])
      add_json(p, what);
  } else if (type == "Split") {
    STRATA_CHECK(j.contains("pattern") && j["pattern"].is_object(), what,
                 ": Split needs a \"pattern\" object");
    const Json& pat = j["pattern"];
    std::string pattern;
    if (pat.contains("Regex") && pat["Regex"].is_string()) {
      pattern = pat["Regex"].get<std::string>();
    } else if (pat.contains("String") && pat["String"].is_string()) {
      pattern = escape_literal(pat["String"].get<std::string>());
    } else {
      fail(what, ": Split \"pattern\" must be {\"Regex\": ...} or {\"String\": ...}");
    }
    STRATA_CHECK(j.contains("behavior") && j["behavior"].is_string(), what,
                 ": Split needs a \"behavior\"");
    Step s;
    s.regex = std::make_shared<Regex>(translate(pattern, what), what);
    s.behavior = behavior_from(j["behavior"].get<std::string>(), what);
    s.invert = get_bool(j, "invert", false, what);
    steps_.push_back(std::move(s));
  } else if (type == "Digits") {
    Step s;
    bool individual = get_bool(j, "individual_digits", false, what);
    s.regex = std::make_shared<Regex>(individual ? "\\p{N}" : "\\p{N}+", what);
    s.behavior = SplitBehavior::kIsolated;
    steps_.push_back(std::move(s));
  } else if (type == "ByteLevel") {
    Step s;
    s.kind = Step::Kind::kByteLevel;
    s.add_prefix_space = get_bool(j, "add_prefix_space", true, what);
    if (get_bool(j, "use_regex", true, what))
      s.regex = std::make_shared<Regex>(translate(kGpt2Pattern, what), what);
    steps_.push_back(std::move(s));
    has_byte_level_ = true;
  } else {
    fail(what, ": pre_tokenizer type '", type,
         "' is not supported (strata supports Split, Digits, ByteLevel and Sequence; see "
         "docs/TOKENIZER.md)");
  }
}

PreTokenizer PreTokenizer::from_json(const Json& j, const std::string& what) {
  PreTokenizer p;
  p.add_json(j, what);
  return p;
}

PreTokenizer PreTokenizer::from_pattern(const std::string& pattern, const std::string& what) {
  PreTokenizer p;
  Step s;
  s.regex = std::make_shared<Regex>(translate(pattern, what), what);
  s.behavior = SplitBehavior::kIsolated;
  p.steps_.push_back(std::move(s));
  return p;
}

void PreTokenizer::split(std::string_view text,
                         const std::function<void(std::string_view)>& word) const {
  run(0, text, word);
}

void PreTokenizer::run(size_t step, std::string_view text,
                       const std::function<void(std::string_view)>& word) const {
  if (text.empty()) return;
  if (step == steps_.size()) {
    word(text);
    return;
  }
  const Step& s = steps_[step];
  std::string prefixed;
  if (s.kind == Step::Kind::kByteLevel) {
    if (s.add_prefix_space && text[0] != ' ') {
      prefixed.reserve(text.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(text);
      text = prefixed;
    }
    if (!s.regex) {
      run(step + 1, text, word);
      return;
    }
  }
  // Pieces of `text`: [begin, end) with whether it was a match (after invert).
  struct Piece {
    size_t begin, end;
    bool match;
  };
  std::vector<Piece> pieces;
  size_t pos = 0, search = 0;
  while (search < text.size()) {
    size_t b = 0, e = 0;
    if (!s.regex->find(text, search, b, e)) break;
    if (e == b) {  // an empty match splits nothing; step over one code point
      search = b;
      utf8_next(text, search);
      continue;
    }
    if (b > pos) pieces.push_back({pos, b, false});
    pieces.push_back({b, e, true});
    pos = search = e;
  }
  if (pos < text.size()) pieces.push_back({pos, text.size(), false});
  if (s.invert) {
    for (Piece& p : pieces)
      p.match = !p.match;
  }

  std::vector<Piece> out;
  switch (s.behavior) {
    case SplitBehavior::kRemoved:
      for (const Piece& p : pieces) {
        if (!p.match) out.push_back(p);
      }
      break;
    case SplitBehavior::kIsolated:
      out = pieces;
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Piece& p : pieces) {
        if (p.match && !previous_match && !out.empty()) {
          out.back().end = p.end;
        } else {
          out.push_back(p);
        }
        previous_match = p.match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (size_t k = pieces.size(); k-- > 0;) {
        const Piece& p = pieces[k];
        if (p.match && !previous_match && !out.empty()) {
          out.back().begin = p.begin;
        } else {
          out.push_back(p);
        }
        previous_match = p.match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Piece& p : pieces) {
        if (p.match == previous_match && !out.empty()) {
          out.back().end = p.end;
        } else {
          out.push_back(p);
        }
        previous_match = p.match;
      }
      break;
    }
  }
  for (const Piece& p : out)
    run(step + 1, text.substr(p.begin, p.end - p.begin), word);
}

}  // namespace strata
