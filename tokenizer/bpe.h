// Byte-level BPE: a word (raw bytes) is split into single bytes, then adjacent symbols are merged,
// lowest rank first and leftmost first among equal ranks, until no adjacent pair has a rank. The
// same engine serves tokenizer.json BPE models (rank = line of the merge list) and tiktoken rank
// files (rank of a pair = rank of the merged token, as tiktoken merges). Results of frequent words
// are cached.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "io/json.h"

namespace strata {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class Bpe {
 public:
  // From tokenizer.json's "model" object (type BPE, byte-level vocabulary). `what` names the file.
  static Bpe from_hf_json(const Json& model, const std::string& what);
  // From tiktoken ranks: token bytes -> rank (= id). Every single byte must have a rank.
  static Bpe from_ranks(TokenMap ranks, const std::string& what);

  Bpe(Bpe&& other) noexcept;
  Bpe& operator=(Bpe&&) = delete;

  // Appends the ids of one pre-token (raw UTF-8 bytes).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  // The id of a token given as raw bytes, or -1.
  int32_t token_id(std::string_view bytes) const;
  // One past the largest id of the vocabulary.
  int64_t vocab_end() const { return vocab_end_; }

 private:
  Bpe() = default;
  void merge(std::string_view word, std::vector<int32_t>& out) const;

  struct Merge {
    int32_t rank;
    int32_t id;
  };
  TokenMap vocab_;                              // raw bytes -> id
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> merge
  std::array<int32_t, 256> byte_id_{};          // -1 where a byte has no token
  bool ignore_merges_ = false;                  // a word that is a whole token is that token
  int32_t unk_id_ = -1;
  int64_t vocab_end_ = 0;

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

// GPT-2's byte-to-character map used by byte-level vocabularies: decodes a vocabulary string to
// raw bytes. Returns false when a character is outside the 256 that map to bytes.
bool byte_level_decode(std::string_view token, std::string& bytes);

}  // namespace strata
