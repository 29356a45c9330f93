#include "tokenizer/tokenizer.h"

#include <unicode/uchar.h>

#include <array>
#include <filesystem>

#include "core/error.h"
#include "tokenizer/tiktoken.h"

namespace strata {

namespace {

bool is_white_space(char32_t c) {
  return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_WHITE_SPACE);
}

bool is_alphanumeric(char32_t c) {
  if (u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_ALPHABETIC)) return true;
  int8_t t = u_charType(static_cast<UChar32>(c));
  return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}

// The code point ending at byte `end` of valid UTF-8.
char32_t last_char(std::string_view s, size_t end) {
  size_t b = end;
  do {
    --b;
  } while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80);
  size_t i = b;
  return utf8_next(s, i);
}

bool get_bool(const Json& j, const char* key, bool dflt) {
  return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : dflt;
}

// A token id as tokenizer.json writes one: an integer in [0, 2^31). (nlohmann's get<int32_t> would
// wrap 2^32 to 0 and keep -1.)
bool is_token_id(const Json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>() < (uint64_t{1} << 31);
  return v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < (int64_t{1} << 31);
}

// A tokenizer_config.json token value: "text" or {"content": "text", ...}.
std::string token_content(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return "";
}

int32_t find_token(const TokenizerSpec& spec, const std::string& content) {
  for (const AddedToken& t : spec.added) {
    if (t.content == content) return t.id;
  }
  std::string bytes;
  if (spec.bpe && byte_level_decode(content, bytes)) return spec.bpe->token_id(bytes);
  return -1;
}

// Adds the ids a post-processor puts around a single sequence.
void add_post_processor(const Json& p, const std::string& what, TokenizerSpec& spec) {
  if (p.is_null()) return;
  STRATA_CHECK(p.is_object() && p.contains("type") && p["type"].is_string(), what,
               ": \"post_processor\" must be null or an object with a \"type\"");
  const std::string type = p["type"].get<std::string>();
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    STRATA_CHECK(p.contains("processors") && p["processors"].is_array(), what,
                 ": post_processor Sequence needs a \"processors\" list");
    for (const Json& q : p["processors"])
      add_post_processor(q, what, spec);
    return;
  }
  if (type == "TemplateProcessing") {
    STRATA_CHECK(p.contains("single") && p["single"].is_array(), what,
                 ": TemplateProcessing needs a \"single\" list");
    std::vector<int32_t> before, after;
    bool seen_sequence = false;
    for (const Json& item : p["single"]) {
      if (item.contains("Sequence")) {
        STRATA_CHECK(!seen_sequence, what,
                     ": TemplateProcessing \"single\" names the sequence twice");
        seen_sequence = true;
        continue;
      }
      STRATA_CHECK(item.contains("SpecialToken") && item["SpecialToken"].contains("id") &&
                       item["SpecialToken"]["id"].is_string(),
                   what,
                   ": TemplateProcessing items must be {\"Sequence\": ...} or {\"SpecialToken\": "
                   "{\"id\": ...}}");
      const std::string name = item["SpecialToken"]["id"].get<std::string>();
      STRATA_CHECK(p.contains("special_tokens") && p["special_tokens"].contains(name) &&
                       p["special_tokens"][name].contains("ids") &&
                       p["special_tokens"][name]["ids"].is_array(),
                   what, ": TemplateProcessing uses special token '", name,
                   "' that its \"special_tokens\" does not define");
      for (const Json& id : p["special_tokens"][name]["ids"]) {
        STRATA_CHECK(is_token_id(id), what, ": TemplateProcessing ids of '", name,
                     "' must be token ids (integers from 0 to 2^31 - 1), not ", id.dump());
        (seen_sequence ? after : before).push_back(id.get<int32_t>());
      }
    }
    STRATA_CHECK(seen_sequence, what,
                 ": TemplateProcessing \"single\" does not contain the sequence ($A)");
    spec.prefix.insert(spec.prefix.end(), before.begin(), before.end());
    spec.suffix.insert(spec.suffix.begin(), after.begin(), after.end());
    return;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    auto id_of = [&](const char* key) {
      STRATA_CHECK(
          p.contains(key) && p[key].is_array() && p[key].size() == 2 && is_token_id(p[key][1]),
          what, ": ", type, " needs \"", key, "\": [token, id] with an id from 0 to 2^31 - 1");
      return p[key][1].get<int32_t>();
    };
    spec.prefix.push_back(id_of("cls"));
    spec.suffix.insert(spec.suffix.begin(), id_of("sep"));
    return;
  }
  fail(what, ": post_processor type '", type,
       "' is not supported (strata supports TemplateProcessing, ByteLevel, Roberta/BertProcessing "
       "and Sequence)");
}

TokenizerSpec load_hf(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  const Json j = json_read_file(path);
  STRATA_CHECK(j.is_object() && j.contains("model"), path,
               ": no \"model\" object; is this a tokenizers file?");
  TokenizerSpec spec;
  spec.kind = "tokenizer.json";
  spec.bpe = std::make_unique<Bpe>(Bpe::from_hf_json(j["model"], path));
  spec.normalizer =
      Normalizer::from_json(j.contains("normalizer") ? j["normalizer"] : Json(), path);
  spec.pre_tokenizer =
      PreTokenizer::from_json(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : Json(), path);
  STRATA_CHECK(
      spec.pre_tokenizer.has_byte_level(), path,
      ": the BPE model has no ByteLevel pre-tokenizer; strata supports byte-level BPE only (see "
      "docs/TOKENIZER.md)");
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    STRATA_CHECK(j["added_tokens"].is_array(), path, ": \"added_tokens\" must be a list");
    for (const Json& t : j["added_tokens"]) {
      STRATA_CHECK(t.is_object() && t.contains("id") && is_token_id(t["id"]) &&
                       t.contains("content") && t["content"].is_string(),
                   path,
                   ": each added token needs an integer \"id\" from 0 to 2^31 - 1 and a string "
                   "\"content\"");
      AddedToken a;
      a.content = t["content"].get<std::string>();
      a.id = t["id"].get<int32_t>();
      a.special = get_bool(t, "special", false);
      a.normalized = get_bool(t, "normalized", !a.special);
      a.lstrip = get_bool(t, "lstrip", false);
      a.rstrip = get_bool(t, "rstrip", false);
      a.single_word = get_bool(t, "single_word", false);
      STRATA_CHECK(!a.content.empty(), path, ": added token ", a.id, " has empty content");
      spec.added.push_back(std::move(a));
    }
  }
  add_post_processor(j.contains("post_processor") ? j["post_processor"] : Json(), path, spec);

  // tokenizer_config.json: Llama-style tokenizer classes rebuild the template from
  // add_bos_token / add_eos_token; when either key is present it decides.
  const std::string config_path = dir + "/tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    const Json c = json_read_file(config_path);
    if (c.is_object() && (c.contains("add_bos_token") || c.contains("add_eos_token"))) {
      bool add_bos = get_bool(c, "add_bos_token", true),
           add_eos = get_bool(c, "add_eos_token", false);
      spec.prefix.clear();
      spec.suffix.clear();
      auto resolve = [&](const char* key) {
        std::string content = c.contains(key) ? token_content(c[key]) : "";
        STRATA_CHECK(!content.empty(), config_path, ": add_", std::string(key).substr(0, 3),
                     "_token is true but \"", key, "\" is not set");
        int32_t id = find_token(spec, content);
        STRATA_CHECK(id >= 0, config_path, ": ", key, " '", content,
                     "' is not a token of tokenizer.json");
        return id;
      };
      if (add_bos) spec.prefix.push_back(resolve("bos_token"));
      if (add_eos) spec.suffix.push_back(resolve("eos_token"));
    }
  }
  return spec;
}

// Python's str.isspace, which Kimi's tokenizer cuts long runs with.
bool python_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Cuts text into pieces of at most `max_chunk` code points, each cut again so that no run of
// white space or of non-white space is longer than `max_run` code points.
std::vector<std::string_view> cut_runs(std::string_view text, int64_t max_chunk, int64_t max_run) {
  std::vector<std::string_view> out;
  size_t chunk_begin = 0;
  while (chunk_begin < text.size()) {
    size_t chunk_end = chunk_begin;
    int64_t n = 0;
    while (chunk_end < text.size() && (max_chunk <= 0 || n < max_chunk)) {
      utf8_next(text, chunk_end);
      ++n;
    }
    std::string_view chunk = text.substr(chunk_begin, chunk_end - chunk_begin);
    size_t i = 0, start = 0;
    int64_t run = 0;
    bool space = false;
    while (i < chunk.size()) {
      size_t at = i;
      bool now = python_isspace(utf8_next(chunk, i));
      if (at == 0) space = now;
      if (now != space) {
        run = 1;
        space = now;
      } else if (++run > max_run) {
        out.push_back(chunk.substr(start, at - start));
        start = at;
        run = 1;
      }
    }
    out.push_back(chunk.substr(start));
    chunk_begin = chunk_end;
  }
  return out;
}

}  // namespace

// Splits text on a set of added tokens: leftmost match, longest at that position.
struct Tokenizer::Matcher {
  std::vector<const AddedToken*> tokens;                     // longest first
  std::array<std::vector<const AddedToken*>, 256> by_first;  // by first byte, longest first

  explicit Matcher(std::vector<const AddedToken*> t) : tokens(std::move(t)) {
    std::stable_sort(tokens.begin(), tokens.end(), [](const AddedToken* a, const AddedToken* b) {
      return a->content.size() > b->content.size();
    });
    for (const AddedToken* a : tokens)
      by_first[static_cast<unsigned char>(a->content[0])].push_back(a);
  }

  // Calls piece(text, -1) for plain text and piece(text, id) for an added token, in order.
  template <typename F>
  void split(std::string_view text, F&& piece) const {
    if (tokens.empty()) {
      piece(text, -1);
      return;
    }
    size_t plain_begin = 0, i = 0;
    while (i < text.size()) {
      const auto& cands = by_first[static_cast<unsigned char>(text[i])];
      const AddedToken* hit = nullptr;
      for (const AddedToken* a : cands) {
        if (text.compare(i, a->content.size(), a->content) == 0) {
          hit = a;
          break;
        }
      }
      if (!hit) {
        ++i;
        continue;
      }
      size_t start = i, stop = i + hit->content.size();
      if (hit->single_word) {
        bool start_ok = start == 0 || !is_alphanumeric(last_char(text, start));
        size_t k = stop;
        bool stop_ok = stop == text.size() || !is_alphanumeric(utf8_next(text, k));
        if (!start_ok || !stop_ok) {
          i = stop;
          continue;
        }
      }
      if (hit->lstrip) {
        while (start > plain_begin) {
          size_t b = start;
          do {
            --b;
          } while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80);
          size_t k = b;
          if (!is_white_space(utf8_next(text, k))) break;
          start = b;
        }
      }
      if (hit->rstrip) {
        while (stop < text.size()) {
          size_t k = stop;
          if (!is_white_space(utf8_next(text, k))) break;
          stop = k;
        }
      }
      if (start > plain_begin) piece(text.substr(plain_begin, start - plain_begin), -1);
      piece(text.substr(start, stop - start), hit->id);
      plain_begin = i = stop;
    }
    if (plain_begin < text.size()) piece(text.substr(plain_begin), -1);
  }
};

Tokenizer Tokenizer::load(const std::string& model_dir) {
  namespace fs = std::filesystem;
  STRATA_CHECK(fs::is_directory(model_dir), model_dir,
               ": not a directory; pass the model's checkpoint directory");
  if (fs::exists(model_dir + "/tokenizer.json")) return Tokenizer(load_hf(model_dir));
  if (fs::exists(model_dir + "/tiktoken.model")) return Tokenizer(tiktoken_load(model_dir));
  if (fs::exists(model_dir + "/tokenizer.model"))
    fail(
        model_dir,
        "/tokenizer.model: SentencePiece tokenizers are not supported; strata reads tokenizer.json "
        "(byte-level BPE) or tiktoken.model (see docs/TOKENIZER.md)");
  fail(
      model_dir,
      ": no tokenizer.json or tiktoken.model; copy the model's tokenizer files into the directory");
}

Tokenizer::Tokenizer(TokenizerSpec spec) : spec_(std::make_unique<TokenizerSpec>(std::move(spec))) {
  STRATA_ASSERT(spec_->bpe, "tokenizer spec without a model");
  std::vector<const AddedToken*> raw, normalized;
  for (const AddedToken& a : spec_->added) {
    // Without a normalizer both sets see the same text; one pass suffices.
    (a.normalized && !spec_->normalizer.empty() ? normalized : raw).push_back(&a);
  }
  raw_matcher_ = std::make_unique<Matcher>(std::move(raw));
  normalized_matcher_ = std::make_unique<Matcher>(std::move(normalized));
}

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

const std::vector<int32_t>& Tokenizer::special_prefix() const {
  return spec_->prefix;
}
const std::vector<int32_t>& Tokenizer::special_suffix() const {
  return spec_->suffix;
}
const std::string& Tokenizer::kind() const {
  return spec_->kind;
}

int64_t Tokenizer::vocab_size() const {
  int64_t n = spec_->bpe->vocab_end();
  for (const AddedToken& a : spec_->added)
    n = std::max<int64_t>(n, int64_t{a.id} + 1);
  return n;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::string repaired;
  if (utf8_repair(text, repaired)) text = repaired;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  if (add_special_tokens) out = spec_->prefix;
  if (spec_->max_run_chars > 0) {
    for (std::string_view piece : cut_runs(text, spec_->max_chunk_chars, spec_->max_run_chars))
      encode_valid(piece, out);
  } else {
    encode_valid(text, out);
  }
  if (add_special_tokens) out.insert(out.end(), spec_->suffix.begin(), spec_->suffix.end());
  return out;
}

void Tokenizer::encode_valid(std::string_view text, std::vector<int32_t>& out) const {
  raw_matcher_->split(text, [&](std::string_view seg, int32_t id) {
    if (id >= 0) {
      out.push_back(id);
      return;
    }
    std::string normalized;
    if (spec_->normalizer.apply(seg, normalized)) seg = normalized;
    normalized_matcher_->split(seg, [&](std::string_view piece, int32_t id2) {
      if (id2 >= 0) {
        out.push_back(id2);
      } else {
        encode_segment(piece, out);
      }
    });
  });
}

void Tokenizer::encode_segment(std::string_view text, std::vector<int32_t>& out) const {
  spec_->pre_tokenizer.split(text,
                             [&](std::string_view word) { spec_->bpe->encode_word(word, out); });
}

}  // namespace strata
