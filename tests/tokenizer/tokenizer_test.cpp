// Token ids compared with Hugging Face `tokenizers` (and `tiktoken` for the rank-file path) on
// tokenizers trained with the real pre-tokenizer configurations of each family; the expected ids
// are in fixtures/expected/, made by make_fixtures.py (see its header for the command).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/json.h"
#include "tokenizer/normalize.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tiktoken.h"
#include "tokenizer/tokenizer.h"

namespace strata {
namespace {

const std::string kFixtures = std::string(STRATA_SOURCE_DIR) + "/tests/tokenizer/fixtures";

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> corpus_lines() {
  std::string text = read_bytes(kFixtures + "/corpus.txt");
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    lines.push_back(text.substr(pos, eol - pos));
    pos = eol + 1;
  }
  return lines;
}

std::vector<int32_t> ids_of(const Json& j) {
  return j.get<std::vector<int32_t>>();
}

class FamilyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FamilyTest, MatchesReferenceIds) {
  const std::string family = GetParam();
  const Tokenizer tok = Tokenizer::load(kFixtures + "/" + family);
  const Json expected = json_read_file(kFixtures + "/expected/" + family + ".json");
  const std::vector<std::string> lines = corpus_lines();
  ASSERT_EQ(lines.size(), expected["lines"].size());
  int mismatches = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(tok.encode(lines[i], false), ids_of(expected["lines"][i]))
        << family << " line " << i + 1 << ": " << lines[i];
    EXPECT_EQ(tok.encode(lines[i], true), ids_of(expected["lines_special"][i]))
        << family << " line " << i + 1 << " with special tokens";
    if (tok.encode(lines[i], false) != ids_of(expected["lines"][i])) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(tok.encode(read_bytes(kFixtures + "/corpus.txt"), false), ids_of(expected["whole"]))
      << family << " whole";
  EXPECT_EQ(tok.encode(read_bytes(kFixtures + "/invalid_utf8.bin"), false),
            ids_of(expected["invalid_utf8"]))
      << family << " invalid UTF-8";
  if (expected.contains("long_run")) {
    const std::string long_run =
        std::string(30000, 'a') + " " + std::string(26000, 'b') + std::string(30000, ' ') + "c";
    EXPECT_EQ(tok.encode(long_run, false), ids_of(expected["long_run"])) << family << " long run";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FamilyTest,
                         ::testing::Values("llama3", "qwen2", "deepseek_v3", "gpt4", "gpt2_digits",
                                           "kimi"));

TEST(Utf8Repair, MatchesPythonReplace) {
  // Expected strings worked out by the maximal-subpart rule (and checked with Python's
  // bytes.decode("utf-8", errors="replace")).
  const std::string r = "\xEF\xBF\xBD";
  std::string out;
  EXPECT_FALSE(utf8_repair("plain \xE4\xB8\xAD", out));
  ASSERT_TRUE(utf8_repair("\xF0\x80\x80\x80", out));
  EXPECT_EQ(out, r + r + r + r);
  ASSERT_TRUE(
      utf8_repair("a\xE2\x82"
                  "b",
                  out));
  EXPECT_EQ(out, "a" + r + "b");
  ASSERT_TRUE(utf8_repair("\xED\xA0\x80", out));
  EXPECT_EQ(out, r + r + r);
  ASSERT_TRUE(utf8_repair("\xC0\xAF", out));
  EXPECT_EQ(out, r + r);
  ASSERT_TRUE(utf8_repair("\xF0\x9F\x98", out));
  EXPECT_EQ(out, r);
}

TEST(Normalizer, NfcComposes) {
  Normalizer n = Normalizer::from_json(Json::parse(R"({"type":"NFC"})"), "test");
  std::string out;
  ASSERT_TRUE(n.apply("e\xCC\x81", out));
  EXPECT_EQ(out, "\xC3\xA9");
  EXPECT_FALSE(n.apply("\xC3\xA9", out));
}

TEST(Pattern, TranslatesWhiteSpaceAndIntersection) {
  const std::string ws =
      R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
  EXPECT_EQ(translate_pattern(R"(\s+(?!\S))", "t"), "[" + ws + "]+(?![^" + ws + "])");
  EXPECT_EQ(translate_pattern(R"([^\s\p{L}])", "t"), "[^" + ws + R"(\p{L}])");
  EXPECT_EQ(translate_pattern(R"([\p{Lu}\p{M}&&[^\p{Han}]]+)", "t"),
            R"((?:(?=[^\p{Han}])[\p{Lu}\p{M}])+)");
}

TEST(Tiktoken, PatternFromPythonSource) {
  const std::string src =
      "class T:\n    pat_str = \"|\".join(\n        [\n            r\"\"\"[\\p{Han}]+\"\"\",  # "
      "han\n"
      "            r\"\"\"\\p{N}{1,3}\"\"\",\n        ]\n    )\n    def f(self):\n        "
      "x(pat_str=self.pat_str)\n";
  EXPECT_EQ(tiktoken_pattern_from_python(src), R"([\p{Han}]+|\p{N}{1,3})");
  EXPECT_EQ(tiktoken_pattern_from_python("pat_str = r\"a\\s+\"\n"), R"(a\s+)");
  EXPECT_EQ(tiktoken_pattern_from_python("x = 1\n"), "");
}

TEST(Tiktoken, PatternFileOverridesTable) {
  // A tokenization_kimi.py whose pat_str differs from the table must win: with only \p{N}{1,3}
  // and \s+ nothing else is split, so letters become one word.
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "strata_tiktoken_py_test";
  fs::create_directories(dir);
  fs::copy_file(kFixtures + "/kimi/tiktoken.model", dir / "tiktoken.model",
                fs::copy_options::overwrite_existing);
  fs::copy_file(kFixtures + "/kimi/tokenizer_config.json", dir / "tokenizer_config.json",
                fs::copy_options::overwrite_existing);
  const Tokenizer table = Tokenizer::load(dir.string());
  std::ofstream(dir / "tokenization_kimi.py")
      << "pat_str = \"|\".join([r\"\"\"[^\\s]+\"\"\", r\"\"\"\\s+\"\"\"])\n";
  const Tokenizer from_file = Tokenizer::load(dir.string());
  EXPECT_NE(table.encode("hello, world!", false), from_file.encode("hello, world!", false));
  fs::remove_all(dir);
}

TEST(Loader, RefusesUnsupportedWithClearErrors) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "strata_tokenizer_refuse_test";
  fs::create_directories(dir);
  auto expect_error = [&](const std::string& json, const std::string& needle) {
    std::ofstream(dir / "tokenizer.json") << json;
    try {
      Tokenizer::load(dir.string());
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(R"({"model":{"type":"Unigram","vocab":[]}})",
               "model type 'Unigram' is not supported");
  expect_error(R"({"model":{"type":"WordPiece","vocab":{}}})", "model type 'WordPiece'");
  expect_error(
      R"({"normalizer":{"type":"Lowercase"},"pre_tokenizer":null,"model":{"type":"BPE","vocab":{},"merges":[]}})",
      "normalizer type 'Lowercase'");
  expect_error(
      R"({"pre_tokenizer":{"type":"Metaspace"},"model":{"type":"BPE","vocab":{},"merges":[]}})",
      "pre_tokenizer type 'Metaspace'");
  expect_error(
      R"({"pre_tokenizer":null,"model":{"type":"BPE","vocab":{},"merges":[],"byte_fallback":true}})",
      "byte_fallback");
  expect_error(R"({"pre_tokenizer":null,"model":{"type":"BPE","vocab":{"a":0},"merges":[]}})",
               "no ByteLevel");
  fs::remove(dir / "tokenizer.json");
  std::ofstream(dir / "tokenizer.model") << "x";
  EXPECT_THROW(Tokenizer::load(dir.string()), Error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace strata
