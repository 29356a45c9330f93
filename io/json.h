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

// Parses `text`; throws strata::Error "<what>: invalid JSON: ..." on any problem. Objects keep
// their keys in the text's order, and parsing takes time linear in the number of keys (an index
// of a few hundred thousand tensors, a tokenizer's vocabulary): Json's own parser inserts each
// key after a search of the keys before it, which is quadratic.
Json json_parse_strict(std::string_view text, const std::string& what, int max_depth = 64);

// Appends `key` to `object`, which must not hold it yet, in constant time (Json's operator[] and
// emplace search the keys first: n insertions take n^2 / 2 comparisons).
void json_append(Json& object, std::string key, Json value);
// Reads and parses a whole file (strict).
Json json_read_file(const std::string& path);

}  // namespace strata
