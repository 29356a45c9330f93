#include "io/json.h"

#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace strata {

Json json_parse_strict(std::string_view text, const std::string& what, int max_depth) {
  // nlohmann's lexer takes a NUL byte outside a string for the end of the input, so
  // "{}\0garbage" would parse. JSON never holds a raw NUL (inside strings it must be escaped).
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    fail(what, ": invalid JSON: NUL byte at offset ", nul);
  }
  // The parser callback sees every key before its value; a stack of key sets, one per open
  // object, finds duplicates. Arrays push an empty set so depth counts both kinds of nesting.
  std::vector<std::set<std::string>> keys;
  std::string problem;
  auto callback = [&](int depth, nlohmann::json::parse_event_t event, Json& parsed) -> bool {
    using E = nlohmann::json::parse_event_t;
    if (!problem.empty()) return false;
    switch (event) {
      case E::object_start:
      case E::array_start:
        if (depth >= max_depth) {
          problem = str("nesting deeper than ", max_depth, " levels");
          return false;
        }
        keys.emplace_back();
        break;
      case E::object_end:
      case E::array_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case E::key: {
        const std::string& k = parsed.get_ref<const std::string&>();
        if (!keys.empty() && !keys.back().insert(k).second) {
          problem = str("duplicate key \"", k, "\"");
          return false;
        }
        break;
      }
      case E::value:
        break;
    }
    return true;
  };
  Json result;
  try {
    result = Json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true);
  } catch (const nlohmann::json::exception& e) {
    if (problem.empty()) fail(what, ": invalid JSON: ", e.what());
  }
  if (!problem.empty()) fail(what, ": invalid JSON: ", problem);
  if (result.is_discarded()) fail(what, ": invalid JSON");
  return result;
}

Json json_read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  STRATA_CHECK(in, path, ": cannot open for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  STRATA_CHECK(!in.bad(), path, ": read error");
  return json_parse_strict(ss.str(), path);
}

}  // namespace strata
