// Strict JSON parsing for untrusted files (safetensors headers, config.json, tokenizer.json).
// nlohmann::json does the parsing; on top of it a duplicate key anywhere is an error (the JSON
// standard leaves it undefined, and two readers could disagree on which value wins), and so is
// nesting deeper than a fixed bound. Errors name `what` (a file or "file: header").
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace strata {

using Json = nlohmann::ordered_json;

// Parses `text`; throws strata::Error "<what>: invalid JSON: ..." on any problem.
Json json_parse_strict(std::string_view text, const std::string& what, int max_depth = 64);
// Reads and parses a whole file (strict).
Json json_read_file(const std::string& path);

}  // namespace strata
