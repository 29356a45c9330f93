#include "tokenizer/bpe.h"

#include <queue>

#include "core/error.h"
#include "tokenizer/normalize.h"

namespace strata {

namespace {

constexpr size_t kCacheMaxEntries = 1 << 17;
constexpr size_t kCacheMaxWordBytes = 64;

// Code point -> byte for GPT-2's byte-level alphabet (-1: not in the alphabet).
const std::array<int16_t, 512>& char_to_byte() {
  static const std::array<int16_t, 512> table = [] {
    std::array<int16_t, 512> t;
    t.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[printable ? b : next++] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return table;
}

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

std::string json_string(const Json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return "";
  return j[key].is_string() ? j[key].get<std::string>() : "";
}

}  // namespace

bool byte_level_decode(std::string_view token, std::string& bytes) {
  bytes.clear();
  const auto& table = char_to_byte();
  size_t i = 0;
  while (i < token.size()) {
    char32_t cp = utf8_next(token, i);
    if (cp >= table.size() || table[cp] < 0) return false;
    bytes.push_back(static_cast<char>(table[cp]));
  }
  return true;
}

Bpe::Bpe(Bpe&& o) noexcept
    : vocab_(std::move(o.vocab_)),
      merges_(std::move(o.merges_)),
      byte_id_(o.byte_id_),
      ignore_merges_(o.ignore_merges_),
      unk_id_(o.unk_id_),
      vocab_end_(o.vocab_end_) {}

Bpe Bpe::from_hf_json(const Json& model, const std::string& what) {
  STRATA_CHECK(model.is_object(), what, ": \"model\" must be an object");
  const std::string type = json_string(model, "type");
  STRATA_CHECK(
      type == "BPE", what, ": model type '", type.empty() ? "(none)" : type,
      "' is not supported (strata supports byte-level BPE tokenizers and tiktoken rank files; see "
      "docs/TOKENIZER.md)");
  if (model.contains("dropout") && !model["dropout"].is_null()) {
    STRATA_CHECK(
        model["dropout"].is_number() && model["dropout"].get<double>() == 0.0, what,
        ": BPE dropout is set; strata tokenizes deterministically and does not support dropout");
  }
  STRATA_CHECK(json_string(model, "continuing_subword_prefix").empty() &&
                   json_string(model, "end_of_word_suffix").empty(),
               what,
               ": BPE continuing_subword_prefix / end_of_word_suffix are not supported (not "
               "byte-level BPE)");
  if (model.contains("byte_fallback") && model["byte_fallback"].is_boolean()) {
    STRATA_CHECK(!model["byte_fallback"].get<bool>(), what,
                 ": BPE byte_fallback is set (a SentencePiece-style tokenizer); strata supports "
                 "byte-level BPE only");
  }
  STRATA_CHECK(model.contains("vocab") && model["vocab"].is_object(), what,
               ": model.vocab must be an object");
  STRATA_CHECK(model.contains("merges") && model["merges"].is_array(), what,
               ": model.merges must be a list");

  Bpe bpe;
  bpe.byte_id_.fill(-1);
  if (model.contains("ignore_merges") && model["ignore_merges"].is_boolean())
    bpe.ignore_merges_ = model["ignore_merges"].get<bool>();
  std::unordered_map<std::string, int32_t> by_string;  // vocabulary strings as written
  std::string bytes;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    STRATA_CHECK(it.value().is_number_integer(), what, ": model.vocab['", it.key(),
                 "'] must be an integer id");
    int64_t id = it.value().get<int64_t>();
    STRATA_CHECK(id >= 0 && id < (int64_t{1} << 31), what, ": model.vocab['", it.key(),
                 "'] has id ", id, " out of range");
    by_string[it.key()] = static_cast<int32_t>(id);
    bpe.vocab_end_ = std::max<int64_t>(bpe.vocab_end_, id + 1);
    // Tokens outside the byte-level alphabet cannot be produced by byte-level BPE; they stay
    // reachable only as added tokens.
    if (byte_level_decode(it.key(), bytes)) {
      bpe.vocab_[bytes] = static_cast<int32_t>(id);
      if (bytes.size() == 1)
        bpe.byte_id_[static_cast<unsigned char>(bytes[0])] = static_cast<int32_t>(id);
    }
  }
  const std::string unk = json_string(model, "unk_token");
  if (!unk.empty()) {
    auto it = by_string.find(unk);
    STRATA_CHECK(it != by_string.end(), what, ": unk_token '", unk, "' is not in model.vocab");
    bpe.unk_id_ = it->second;
  }
  int32_t rank = 0;
  for (const Json& m : model["merges"]) {
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      size_t sp = s.find(' ', 1);
      STRATA_CHECK(sp != std::string::npos, what, ": merge '", s,
                   "' is not two tokens separated by a space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      STRATA_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), what,
                   ": each merge must be \"a b\" or [\"a\", \"b\"]");
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    }
    auto ia = by_string.find(a), ib = by_string.find(b), iab = by_string.find(a + b);
    STRATA_CHECK(ia != by_string.end() && ib != by_string.end() && iab != by_string.end(), what,
                 ": merge '", a, " ", b, "' (line ", rank,
                 " of model.merges) uses a token that is not in model.vocab");
    bpe.merges_.emplace(pair_key(ia->second, ib->second),
                        Merge{rank, iab->second});  // first rank wins
    ++rank;
  }
  return bpe;
}

Bpe Bpe::from_ranks(TokenMap ranks, const std::string& what) {
  Bpe bpe;
  bpe.byte_id_.fill(-1);
  bpe.ignore_merges_ = true;  // tiktoken looks the whole piece up before merging
  for (const auto& [bytes, id] : ranks) {
    bpe.vocab_end_ = std::max<int64_t>(bpe.vocab_end_, int64_t{id} + 1);
    if (bytes.size() == 1) bpe.byte_id_[static_cast<unsigned char>(bytes[0])] = id;
  }
  for (int b = 0; b < 256; ++b) {
    STRATA_CHECK(bpe.byte_id_[b] >= 0, what, ": byte 0x", std::hex, b,
                 " has no rank; a tiktoken rank file must rank all 256 bytes");
  }
  // Every token is the concatenation of two shorter tokens in one or more ways; the pair's rank
  // is the merged token's rank.
  for (const auto& [bytes, id] : ranks) {
    for (size_t k = 1; k < bytes.size(); ++k) {
      auto ia = ranks.find(std::string_view(bytes).substr(0, k));
      if (ia == ranks.end()) continue;
      auto ib = ranks.find(std::string_view(bytes).substr(k));
      if (ib == ranks.end()) continue;
      bpe.merges_.emplace(pair_key(ia->second, ib->second), Merge{id, id});
    }
  }
  bpe.vocab_ = std::move(ranks);
  return bpe;
}

int32_t Bpe::token_id(std::string_view bytes) const {
  auto it = vocab_.find(bytes);
  return it == vocab_.end() ? -1 : it->second;
}

void Bpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (word.size() == 1) {
    int32_t id = byte_id_[static_cast<unsigned char>(word[0])];
    if (id >= 0) {
      out.push_back(id);
    } else if (unk_id_ >= 0) {
      out.push_back(unk_id_);
    }
    return;
  }
  if (word.size() <= kCacheMaxWordBytes) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t first = out.size();
  merge(word, out);
  if (word.size() <= kCacheMaxWordBytes) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() < kCacheMaxEntries)
      cache_.emplace(std::string(word), std::vector<int32_t>(out.begin() + first, out.end()));
  }
}

void Bpe::merge(std::string_view word, std::vector<int32_t>& out) const {
  // Symbols as a doubly linked list over byte positions; a merge keeps the left symbol.
  const int n = static_cast<int>(word.size());
  std::vector<int32_t> id(n), prev(n), next(n);
  int count = 0;
  for (int i = 0; i < n; ++i) {
    int32_t b = byte_id_[static_cast<unsigned char>(word[i])];
    if (b < 0) b = unk_id_;
    id[count] = b;  // bytes without a token (and no unk) are dropped below
    if (b >= 0) ++count;
  }
  if (count == 0) return;
  for (int i = 0; i < count; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < count ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t left, right;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    auto it = merges_.find(pair_key(id[pos], id[next[pos]]));
    if (it != merges_.end()) heap.push({it->second.rank, pos, id[pos], id[next[pos]]});
  };
  for (int i = 0; i + 1 < count; ++i)
    push(i);
  std::vector<char> alive(count, 1);
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    int r = next[c.pos];
    // Stale: the left symbol was merged away, or either side changed since the push.
    if (!alive[c.pos] || r < 0 || id[c.pos] != c.left || id[r] != c.right) continue;
    id[c.pos] = merges_.at(pair_key(c.left, c.right)).id;
    alive[r] = 0;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  for (int i = 0; i >= 0; i = next[i])
    out.push_back(id[i]);
}

}  // namespace strata
