// The checks of the tokenizer fuzz targets (tokenizer_json_fuzz, tiktoken_fuzz), shared with
// tests/tokenizer/fuzz_replay_test.cpp. Each input is a model directory's tokenizer files (see
// fuzz_files.h for how one input holds several); Tokenizer::load must give a tokenizer or throw
// strata::Error. A tokenizer it gives must encode text (a fixed sentence, and the start of the
// input itself) into ids within [0, vocab_size()), with special ids that are not negative.
// Anything else (a crash, a sanitizer report, another exception, a broken promise: trap) is a
// finding. The functions return whether the input was accepted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "fuzz/fuzz_files.h"
#include "tokenizer/tokenizer.h"

namespace strata::fuzz {

inline void check_tokenizer(const Tokenizer& tok, std::string_view input) {
  const int64_t vocab = tok.vocab_size();
  for (int32_t id : tok.special_prefix())
    if (id < 0) __builtin_trap();
  for (int32_t id : tok.special_suffix())
    if (id < 0) __builtin_trap();
  const std::string fixed =
      "Hello, world! It's 2024: x = 3.14; naïve café 東京\n\t  \xff\xfe end <|endoftext|>";
  for (std::string_view text : {std::string_view(fixed), input.substr(0, 256)}) {
    for (int32_t id : tok.encode(text, false))
      if (id < 0 || id >= vocab) __builtin_trap();
    const std::vector<int32_t> with = tok.encode(text, true);
    if (with.size() < tok.special_prefix().size() + tok.special_suffix().size()) __builtin_trap();
  }
}

// tokenizer.json, optionally followed by "--- tokenizer_config.json ---" and that file.
inline bool tokenizer_json_one(const uint8_t* data, size_t size) {
  static FuzzDir dir("tokenizer_json");
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::string& d = dir.write(split_files(input, "tokenizer.json", {"tokenizer_config.json"}));
  try {
    const Tokenizer tok = Tokenizer::load(d);
    if (tok.kind() != "tokenizer.json") __builtin_trap();
    check_tokenizer(tok, input);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// tiktoken.model, optionally followed by "--- tokenizer_config.json ---" and
// "--- tokenization_kimi.py ---" (the file tiktoken_load reads the pre-tokenizer pattern from).
inline bool tiktoken_one(const uint8_t* data, size_t size) {
  static FuzzDir dir("tiktoken");
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::string& d = dir.write(
      split_files(input, "tiktoken.model", {"tokenizer_config.json", "tokenization_kimi.py"}));
  try {
    const Tokenizer tok = Tokenizer::load(d);
    if (tok.kind() != "tiktoken") __builtin_trap();
    check_tokenizer(tok, input);
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace strata::fuzz
