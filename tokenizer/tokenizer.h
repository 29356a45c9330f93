// Text to token ids, as the checkpoint's own tokenizer would give them. Tokenizer::load picks the
// kind from the model directory: tokenizer.json (Hugging Face tokenizers, byte-level BPE) or
// tiktoken.model (a tiktoken rank file, as Kimi ships). What is supported and what is refused:
// docs/TOKENIZER.md.
//
// The pipeline, for both kinds:
//   input bytes --utf8_repair--> text
//   text --split on added tokens (those matched on raw text)--> segments
//   segment --Normalizer--> --split on added tokens matched on normalized text-->
//   --PreTokenizer--> words --Bpe--> ids
//   with add_special_tokens: prefix ids + ids + suffix ids (post-processor / tokenizer_config).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/normalize.h"
#include "tokenizer/pretokenize.h"

namespace strata {

// A token matched as a whole in the text before BPE (tokenizer.json "added_tokens", tiktoken
// special tokens).
struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool normalized = false;  // matched on normalized text rather than raw text
  bool lstrip = false, rstrip = false, single_word = false;
};

// Everything a tokenizer is made of; built by the loaders.
struct TokenizerSpec {
  std::string kind;  // "tokenizer.json" or "tiktoken"
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  std::unique_ptr<Bpe> bpe;
  std::vector<AddedToken> added;
  std::vector<int32_t> prefix, suffix;  // ids add_special_tokens puts around the text
  // tiktoken (Kimi): the text is cut so that no run of white space or of other characters is
  // longer than this many code points, and into pieces of at most max_chunk_chars (0: no cut).
  int64_t max_run_chars = 0;
  int64_t max_chunk_chars = 0;
};

class Tokenizer {
 public:
  // Loads the tokenizer of a model directory; throws strata::Error naming the file and the
  // unsupported feature when it cannot tokenize exactly.
  static Tokenizer load(const std::string& model_dir);

  explicit Tokenizer(TokenizerSpec spec);
  Tokenizer(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of UTF-8 text (ill-formed UTF-8 is first repaired to U+FFFD, see utf8_repair).
  // Added and special tokens written in the text are recognised. With add_special_tokens, the
  // BOS/EOS the checkpoint asks for are added. Thread-safe.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;

  const std::vector<int32_t>& special_prefix() const;
  const std::vector<int32_t>& special_suffix() const;
  int64_t vocab_size() const;  // one past the largest id, added tokens included
  const std::string& kind() const;

 private:
  std::unique_ptr<TokenizerSpec> spec_;
  struct Matcher;
  std::unique_ptr<Matcher> raw_matcher_, normalized_matcher_;
  void encode_valid(std::string_view text, std::vector<int32_t>& out) const;
  void encode_segment(std::string_view text, std::vector<int32_t>& out) const;
};

}  // namespace strata
