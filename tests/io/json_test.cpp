#include "io/json.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "io_test_util.h"

namespace strata {
namespace {

using test::expect_error;

// The strict parser builds what nlohmann's own parser builds (keys in the text's order).
TEST(JsonParseStrict, EqualsTheLibrarysParse) {
  const std::vector<std::string> texts = {
      R"({"b": 1, "a": [true, false, null, {"z": "x", "y": -2}], "c": {"k": 1.5e3}})",
      R"([1, -9223372036854775808, 18446744073709551615, 0.1, "\u00e9\ud83d\ude00"])",
      R"("just a string")",
      R"({"weight_map": {"m.2": "s", "m.10": "s", "m.1": "t"}, "metadata": {}})",
      "{}",
      "[]",
      "  7  ",
  };
  for (const std::string& t : texts) {
    const Json mine = json_parse_strict(t, "t.json");
    const Json theirs = Json::parse(t);
    EXPECT_EQ(mine, theirs) << t;
    EXPECT_EQ(mine.dump(), theirs.dump()) << t;  // the same key order
  }
}

TEST(JsonParseStrict, DuplicateKeysAtAnyDepthAreErrors) {
  expect_error([] { json_parse_strict(R"({"a": 1, "a": 2})", "d.json"); },
               {"d.json: invalid JSON: duplicate key \"a\""});
  expect_error([] { json_parse_strict(R"([{"x": {"k": 1, "k": 1}}])", "d.json"); },
               {"duplicate key \"k\""});
  // The same key in sibling objects is no duplicate.
  EXPECT_EQ(json_parse_strict(R"([{"k": 1}, {"k": 2}])", "d.json").size(), 2u);
}

TEST(JsonParseStrict, NestingBoundAndMalformedText) {
  auto nested = [](int n) { return std::string(n, '[') + std::string(n, ']'); };
  EXPECT_NO_THROW(json_parse_strict(nested(8), "n.json", 8));
  expect_error([&] { json_parse_strict(nested(9), "n.json", 8); },
               {"n.json: invalid JSON: nesting deeper than 8 levels"});
  expect_error([] { json_parse_strict("{\"a\": }", "m.json"); }, {"m.json: invalid JSON"});
  expect_error([] { json_parse_strict("{} {}", "m.json"); }, {"m.json: invalid JSON"});
  expect_error([] { json_parse_strict("", "m.json"); }, {"m.json: invalid JSON"});
}

TEST(JsonAppend, AddsKeysInOrder) {
  Json o = Json::object();
  json_append(o, "b", 1);
  json_append(o, "a", Json::array({2}));
  EXPECT_EQ(o.dump(), R"({"b":1,"a":[2]})");
  EXPECT_EQ(o["a"][0], 2);
}

}  // namespace
}  // namespace strata
