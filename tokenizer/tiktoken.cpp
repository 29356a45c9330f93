#include "tokenizer/tiktoken.h"

#include <cctype>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <system_error>

#include "core/error.h"
#include "core/log.h"

namespace strata {

namespace {

// Tokenizer classes whose pre-tokenizer pattern strata knows, keyed by the tokenizer code module
// (tokenizer_config.json auto_map.AutoTokenizer) or the class name.
struct KnownTiktoken {
  const char* module;      // "tokenization_kimi"
  const char* class_name;  // "TikTokenTokenizer"
  const char* pattern;     // in the Rust-regex dialect tiktoken compiles
  int n_reserved;  // special ids after the ranks: added_tokens_decoder names, else reserved names
  int64_t max_run_chars;  // runs of (non-)white space cut at this many code points
  int64_t max_chunk_chars;
};

// Kimi (K2, Linear): tokenization_kimi.py. Pattern, 256 + 2 special ids named
// "<|reserved_token_{id}|>" unless added_tokens_decoder names them, and the 400,000 / 25,000
// character cuts that its encode() applies before tiktoken.
const KnownTiktoken kKnown[] = {
    {"tokenization_kimi", "TikTokenTokenizer",
     R"([\p{Han}]+)"
     R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
     R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
     R"(|\p{N}{1,3})"
     R"(| ?[^\s\p{L}\p{N}]+[\r\n]*)"
     R"(|\s*[\r\n]+)"
     R"(|\s+(?!\S))"
     R"(|\s+)",
     258, 25000, 400000},
};

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

bool base64_decode(std::string_view in, std::string& out) {
  out.clear();
  uint32_t acc = 0;
  int bits = 0;
  size_t i = 0;
  for (; i < in.size() && in[i] != '='; ++i) {
    int v = base64_value(in[i]);
    if (v < 0) return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  for (; i < in.size(); ++i) {
    if (in[i] != '=') return false;
  }
  return !out.empty();
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  STRATA_CHECK(f, path, ": cannot open for reading");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Reads one Python string literal at s[i] (optional r/b/u prefix, single or triple quotes).
// Returns false when s[i] does not start one.
bool read_python_literal(const std::string& s, size_t& i, std::string& value) {
  size_t j = i;
  bool raw = false;
  while (j < s.size() && std::string_view("rRbBuU").find(s[j]) != std::string_view::npos) {
    if (s[j] == 'r' || s[j] == 'R') raw = true;
    ++j;
  }
  if (j >= s.size() || (s[j] != '"' && s[j] != '\'')) return false;
  char q = s[j];
  bool triple = s.compare(j, 3, std::string(3, q)) == 0;
  std::string close = triple ? std::string(3, q) : std::string(1, q);
  j += close.size();
  value.clear();
  while (j < s.size()) {
    if (s.compare(j, close.size(), close) == 0) {
      i = j + close.size();
      return true;
    }
    if (s[j] == '\\' && j + 1 < s.size()) {
      if (raw) {
        value += s.substr(j, 2);
      } else {
        char e = s[j + 1];
        // Non-raw literals: the escapes patterns use.
        if (e == 'n')
          value += '\n';
        else if (e == 'r')
          value += '\r';
        else if (e == 't')
          value += '\t';
        else if (e == '\\' || e == '"' || e == '\'')
          value += e;
        else
          value += s.substr(j, 2);
      }
      j += 2;
      continue;
    }
    value += s[j++];
  }
  return false;
}

bool is_python_identifier(const std::string& s) {
  if (s.empty() || s.size() > 200 || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

void skip_space_and_comments(const std::string& s, size_t& i) {
  while (i < s.size()) {
    if (std::isspace(static_cast<unsigned char>(s[i]))) {
      ++i;
    } else if (s[i] == '#') {
      while (i < s.size() && s[i] != '\n')
        ++i;
    } else {
      break;
    }
  }
}

}  // namespace

std::string tiktoken_pattern_from_python(const std::string& source) {
  size_t at = 0;
  while ((at = source.find("pat_str", at)) != std::string::npos) {
    size_t i = at + 7;
    at = i;
    skip_space_and_comments(source, i);
    if (i < source.size() && source[i] == ':') {  // a type annotation: pat_str: str = ...
      while (i < source.size() && source[i] != '=' && source[i] != '\n')
        ++i;
    }
    if (i >= source.size() || source[i] != '=' || (i + 1 < source.size() && source[i + 1] == '='))
      continue;
    ++i;
    skip_space_and_comments(source, i);
    std::string value;
    size_t k = i;
    if (!read_python_literal(source, k, value)) continue;
    if (source.compare(k, 6, ".join(") != 0) {
      // A literal, possibly followed by adjacent literals that concatenate.
      std::string all = value;
      skip_space_and_comments(source, k);
      while (read_python_literal(source, k, value)) {
        all += value;
        skip_space_and_comments(source, k);
      }
      return all;
    }
    // "<sep>".join([ literal, literal, ... ])
    const std::string sep = value;
    k += 6;
    skip_space_and_comments(source, k);
    if (k >= source.size() || (source[k] != '[' && source[k] != '(')) continue;
    char closer = source[k] == '[' ? ']' : ')';
    ++k;
    std::string joined;
    bool first = true, ok = true;
    while (true) {
      skip_space_and_comments(source, k);
      if (k < source.size() && source[k] == closer) break;
      if (!read_python_literal(source, k, value)) {
        ok = false;
        break;
      }
      if (!first) joined += sep;
      joined += value;
      first = false;
      skip_space_and_comments(source, k);
      if (k < source.size() && source[k] == ',') ++k;
    }
    if (ok && !first) return joined;
  }
  return "";
}

TokenizerSpec tiktoken_load(const std::string& dir) {
  const std::string rank_path = dir + "/tiktoken.model";
  const std::string config_path = dir + "/tokenizer_config.json";
  TokenizerSpec spec;
  spec.kind = "tiktoken";

  // Ranks.
  const std::string text = read_text(rank_path);
  TokenMap ranks;
  int64_t n_base = 0;
  size_t line_no = 0, pos = 0;
  std::string bytes;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    size_t sp = line.find(' ');
    STRATA_CHECK(sp != std::string_view::npos, rank_path, ":", line_no,
                 ": expected '<base64 token> <rank>'");
    STRATA_CHECK(base64_decode(line.substr(0, sp), bytes), rank_path, ":", line_no,
                 ": the token is not valid base64");
    int64_t rank = -1;
    std::string_view r = line.substr(sp + 1);
    auto [end, ec] = std::from_chars(r.data(), r.data() + r.size(), rank);
    STRATA_CHECK(
        ec == std::errc() && end == r.data() + r.size() && rank >= 0 && rank < (int64_t{1} << 31),
        rank_path, ":", line_no, ": the rank is not a non-negative integer");
    STRATA_CHECK(ranks.emplace(bytes, static_cast<int32_t>(rank)).second, rank_path, ":", line_no,
                 ": the token appears twice");
    n_base = std::max(n_base, rank + 1);
  }
  STRATA_CHECK(!ranks.empty(), rank_path, ": no ranks");

  // Config: which tokenizer class, and the names of the special ids.
  Json config = Json::object();
  if (std::filesystem::exists(config_path)) config = json_read_file(config_path);
  STRATA_CHECK(config.is_object(), config_path, ": must be a JSON object");
  std::string module, class_name;
  if (config.contains("tokenizer_class") && config["tokenizer_class"].is_string())
    class_name = config["tokenizer_class"].get<std::string>();
  if (config.contains("auto_map") && config["auto_map"].is_object() &&
      config["auto_map"].contains("AutoTokenizer")) {
    const Json& a = config["auto_map"]["AutoTokenizer"];
    std::string entry = a.is_array() && !a.empty() && a[0].is_string() ? a[0].get<std::string>()
                        : a.is_string()                                ? a.get<std::string>()
                                                                       : "";
    // "module.Class", or "org/repo--module.Class" for code kept in another repository (strata
    // reads only this folder, so only the module's own file name matters).
    const size_t repo_end = entry.rfind("--");
    if (repo_end != std::string::npos) entry = entry.substr(repo_end + 2);
    size_t dot = entry.rfind('.');
    if (dot != std::string::npos) {
      module = entry.substr(0, dot);
      if (class_name.empty()) class_name = entry.substr(dot + 1);
    }
    // The module names a file of this folder: a Python identifier, not a path.
    STRATA_CHECK(module.empty() || is_python_identifier(module), config_path,
                 ": auto_map.AutoTokenizer names the module '", module,
                 "', which is not a Python module name (letters, digits and '_', at most 200)");
  }
  const KnownTiktoken* known = nullptr;
  for (const KnownTiktoken& k : kKnown) {
    if (module == k.module || (module.empty() && class_name == k.class_name)) known = &k;
  }

  // Pattern: the checkpoint's own code file first (read as text), else the table.
  std::string pattern, pattern_from;
  const std::string py =
      dir + "/" + (module.empty() ? std::string("tokenization_kimi") : module) + ".py";
  std::error_code no_file;
  if (std::filesystem::exists(py, no_file)) {
    pattern = tiktoken_pattern_from_python(read_text(py));
    pattern_from = py;
  }
  if (pattern.empty() && known) {
    pattern = known->pattern;
    pattern_from = std::string("strata's table entry for ") + known->module;
  }
  STRATA_CHECK(!pattern.empty(), rank_path,
               ": cannot find the pre-tokenizer pattern: tokenizer class '", class_name,
               "' (module '", module, "') is not in strata's table and no pat_str was found in ",
               py, "; see docs/TOKENIZER.md");
  log_debug("tiktoken pattern from ", pattern_from);
  spec.pre_tokenizer = PreTokenizer::from_pattern(pattern, pattern_from);
  spec.bpe = std::make_unique<Bpe>(Bpe::from_ranks(std::move(ranks), rank_path));

  // Special tokens: added_tokens_decoder names ids; a known class also reserves a block after the
  // ranks with generated names. All are matched in raw text (tiktoken allowed_special="all").
  std::map<int64_t, std::string> names;
  if (config.contains("added_tokens_decoder") && config["added_tokens_decoder"].is_object()) {
    for (auto it = config["added_tokens_decoder"].begin();
         it != config["added_tokens_decoder"].end(); ++it) {
      int64_t id = -1;
      auto [end, ec] = std::from_chars(it.key().data(), it.key().data() + it.key().size(), id);
      STRATA_CHECK(ec == std::errc() && end == it.key().data() + it.key().size() && id >= 0 &&
                       id < (int64_t{1} << 31),
                   config_path, ": added_tokens_decoder key '", it.key(), "' is not a token id");
      std::string content = it.value().is_object() && it.value().contains("content") &&
                                    it.value()["content"].is_string()
                                ? it.value()["content"].get<std::string>()
                                : "";
      STRATA_CHECK(!content.empty(), config_path, ": added_tokens_decoder[", it.key(),
                   "] has no \"content\"");
      names[id] = content;
    }
  }
  if (known) {
    STRATA_CHECK(n_base + known->n_reserved <= (int64_t{1} << 31), rank_path,
                 ": the largest rank, ", n_base - 1, ", leaves no room for the ", known->n_reserved,
                 " reserved special ids after it below 2^31");
    for (int64_t id = n_base; id < n_base + known->n_reserved; ++id) {
      if (!names.count(id)) names[id] = str("<|reserved_token_", id, "|>");
    }
    spec.max_run_chars = known->max_run_chars;
    spec.max_chunk_chars = known->max_chunk_chars;
  }
  for (const auto& [id, content] : names) {
    AddedToken a;
    a.content = content;
    a.id = static_cast<int32_t>(id);
    a.special = true;
    spec.added.push_back(std::move(a));
  }
  return spec;
}

}  // namespace strata
