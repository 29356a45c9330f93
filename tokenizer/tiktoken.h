// tiktoken rank files (tiktoken.model: "<base64 token> <rank>" per line), as Kimi ships them with
// a tokenizer_config.json. The pre-tokenizer pattern comes from the checkpoint's tokenizer code
// file (its pat_str, read as text, never run) or, for known tokenizer classes, a built-in table.
#pragma once

#include <string>

#include "tokenizer/tokenizer.h"

namespace strata {

// Builds the spec from `dir`/tiktoken.model and `dir`/tokenizer_config.json.
TokenizerSpec tiktoken_load(const std::string& dir);

// Reads a pat_str assignment (a string literal, or "|".join([...literals...])) out of Python
// source text. Returns an empty string when none is found. Exposed for tests.
std::string tiktoken_pattern_from_python(const std::string& source);

}  // namespace strata
