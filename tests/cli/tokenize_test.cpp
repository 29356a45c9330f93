// `strata tokenize` run as a user would, on every tokenizer fixture of tests/tokenizer/fixtures,
// with the committed test corpus on stdin. Its output is compared with the ids Hugging Face
// `tokenizers` (or `tiktoken`, for kimi) gave, recorded in fixtures/expected/<family>.json by
// tests/tokenizer/make_fixtures.py:
//   lines          per line (default mode), no special tokens
//   lines_special  per line with --add_special_tokens
//   whole          --whole
//   invalid_utf8   fixtures/invalid_utf8.bin on stdin (decoded with errors="replace" for the
//                  reference)
//   long_run       (kimi) the 25,000-character chunking input, with --whole
// And the errors: a directory without a tokenizer, and a tokenizer of an unsupported type, exit 1
// with one line on stderr naming the file.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/cli/cli_util.h"

namespace {

using namespace strata_cli_test;
using Ids = std::vector<int64_t>;

const std::string kTokenizerFixtures = std::string(STRATA_SOURCE_DIR) + "/tests/tokenizer/fixtures";

// strata tokenize prints one JSON list per line.
std::vector<Ids> parse_output(const std::string& out) {
  std::vector<Ids> lists;
  size_t pos = 0;
  while (pos < out.size()) {
    size_t eol = out.find('\n', pos);
    if (eol == std::string::npos) eol = out.size();
    lists.push_back(nlohmann::json::parse(out.substr(pos, eol - pos)).get<Ids>());
    pos = eol + 1;
  }
  return lists;
}

std::vector<Ids> lists_of(const nlohmann::json& j) {
  std::vector<Ids> out;
  for (const auto& x : j)
    out.push_back(x.get<Ids>());
  return out;
}

RunResult tokenize(const std::string& family, const std::string& flags, const fs::path& input,
                   const fs::path& scratch) {
  return run_strata("tokenize --model '" + kTokenizerFixtures + "/" + family + "' " + flags +
                        " <'" + input.string() + "'",
                    scratch);
}

class TokenizeCli : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizeCli, MatchesReferenceIds) {
  const std::string family = GetParam();
  TempDir tmp;
  const nlohmann::json expected =
      nlohmann::json::parse(read_file(kTokenizerFixtures + "/expected/" + family + ".json"));
  const fs::path corpus = kTokenizerFixtures + "/corpus.txt";

  // Per line, without and with special tokens.
  for (const bool special : {false, true}) {
    const char* key = special ? "lines_special" : "lines";
    RunResult r = tokenize(family, special ? "--add_special_tokens" : "", corpus, tmp.path());
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(r.err, "");
    const std::vector<Ids> got = parse_output(r.out);
    const std::vector<Ids> want = lists_of(expected[key]);
    ASSERT_EQ(got.size(), want.size()) << family << " " << key;
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_EQ(got[i], want[i]) << family << " " << key << " line " << i + 1;
  }

  // The whole corpus as one text.
  {
    RunResult r = tokenize(family, "--whole", corpus, tmp.path());
    ASSERT_EQ(r.rc, 0) << r.err;
    const std::vector<Ids> got = parse_output(r.out);
    ASSERT_EQ(got.size(), 1u) << r.out.substr(0, 200);
    EXPECT_EQ(got[0], expected["whole"].get<Ids>()) << family << " whole";
  }

  // Ill-formed UTF-8 on stdin: the file has no newline, so per line and --whole give one list.
  const fs::path invalid = kTokenizerFixtures + "/invalid_utf8.bin";
  ASSERT_EQ(read_file(invalid).find('\n'), std::string::npos);
  for (const char* flags : {"--whole", ""}) {
    RunResult r = tokenize(family, flags, invalid, tmp.path());
    ASSERT_EQ(r.rc, 0) << r.err;
    const std::vector<Ids> got = parse_output(r.out);
    ASSERT_EQ(got.size(), 1u) << r.out;
    EXPECT_EQ(got[0], expected["invalid_utf8"].get<Ids>()) << family << " invalid UTF-8 " << flags;
  }

  // Kimi's 25,000-character cuts (the input make_fixtures.py calls LONG_RUN).
  if (expected.contains("long_run")) {
    const std::string long_run =
        std::string(30000, 'a') + " " + std::string(26000, 'b') + std::string(30000, ' ') + "c";
    write_file(tmp.path() / "long_run.txt", long_run);
    RunResult r = tokenize(family, "--whole", tmp.path() / "long_run.txt", tmp.path());
    ASSERT_EQ(r.rc, 0) << r.err;
    const std::vector<Ids> got = parse_output(r.out);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0], expected["long_run"].get<Ids>()) << family << " long run";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TokenizeCli,
                         ::testing::Values("llama3", "qwen2", "deepseek_v3", "gpt4", "gpt2_digits",
                                           "kimi"));

void expect_one_line_error(const RunResult& r, const std::string& needle) {
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.back(), '\n') << r.err;
}

TEST(TokenizeCliErrors, DirectoryWithoutTokenizer) {
  TempDir tmp;
  const fs::path model = tmp.path() / "model";
  fs::create_directory(model);
  write_file(model / "config.json", "{}\n");
  write_file(tmp.path() / "in.txt", "hello\n");
  RunResult r = run_strata(
      "tokenize --model '" + model.string() + "' <'" + (tmp.path() / "in.txt").string() + "'",
      tmp.path());
  expect_one_line_error(r, model.string());
  EXPECT_NE(r.err.find("tokenizer.json"), std::string::npos) << r.err;
}

TEST(TokenizeCliErrors, UnsupportedTokenizerTypes) {
  TempDir tmp;
  const fs::path model = tmp.path() / "model";
  fs::create_directory(model);
  write_file(tmp.path() / "in.txt", "hello\n");
  const std::string file = (model / "tokenizer.json").string();
  // A WordPiece and a Unigram model in tokenizer.json, and a SentencePiece file alone.
  const std::string wordpiece = R"({"version": "1.0", "added_tokens": [], "normalizer": null,
    "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
    "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
              "max_input_chars_per_word": 100, "vocab": {"[UNK]": 0, "a": 1}}})";
  const std::string unigram = R"({"version": "1.0", "added_tokens": [], "normalizer": null,
    "pre_tokenizer": null, "post_processor": null, "decoder": null,
    "model": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0], ["a", -1.0]]}})";
  for (const auto& [content, type] : {std::pair{wordpiece, std::string("WordPiece")},
                                      std::pair{unigram, std::string("Unigram")}}) {
    write_file(file, content);
    RunResult r = run_strata(
        "tokenize --model '" + model.string() + "' <'" + (tmp.path() / "in.txt").string() + "'",
        tmp.path());
    expect_one_line_error(r, file);
    EXPECT_NE(r.err.find(type), std::string::npos) << r.err;
  }
  fs::remove(file);
  write_file(model / "tokenizer.model", std::string("\x0a\x05hello", 7));
  RunResult r = run_strata(
      "tokenize --model '" + model.string() + "' <'" + (tmp.path() / "in.txt").string() + "'",
      tmp.path());
  expect_one_line_error(r, (model / "tokenizer.model").string());
}

}  // namespace
