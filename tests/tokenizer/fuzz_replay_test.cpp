// The tokenizer fuzz targets' seeds and findings, replayed (tests/fuzz_replay_util.h): every input
// gives a tokenizer that keeps its promises or a strata::Error.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

#include "core/error.h"
#include "fuzz/tokenizer_target.h"
#include "tests/fuzz_replay_util.h"

namespace strata {
namespace {

TEST(FuzzReplay, TokenizerJson) {
  const auto seeds = test::fuzz_inputs("fuzz/corpus/tokenizer_json");
  ASSERT_FALSE(seeds.empty());
  // The seeds are cut-down real tokenizers: each loads (else fuzzing starts from refusals only),
  // except those named bad_*.
  int good = 0;
  for (const auto& p : seeds)
    good += !p.filename().string().starts_with("bad_");
  EXPECT_EQ(test::replay_fuzz_inputs(seeds, fuzz::tokenizer_json_one), good);
  test::replay_fuzz_inputs(test::fuzz_inputs("tests/tokenizer/fuzz_regressions", "tokenizer_json-"),
                           fuzz::tokenizer_json_one);
}

TEST(FuzzReplay, Tiktoken) {
  const auto seeds = test::fuzz_inputs("fuzz/corpus/tiktoken");
  ASSERT_FALSE(seeds.empty());
  int good = 0;
  for (const auto& p : seeds)
    good += !p.filename().string().starts_with("bad_");
  EXPECT_EQ(test::replay_fuzz_inputs(seeds, fuzz::tiktoken_one), good);
  test::replay_fuzz_inputs(test::fuzz_inputs("tests/tokenizer/fuzz_regressions", "tiktoken-"),
                           fuzz::tiktoken_one);
}

std::string seed(const std::string& name) {
  std::ifstream in(std::string(STRATA_SOURCE_DIR) + "/fuzz/corpus/" + name, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Loads the tokenizer files of one fuzz input (fuzz/fuzz_files.h) and returns the error message,
// or "" when it loads.
std::string load_error(const std::string& input, const std::string& first,
                       const std::vector<std::string>& others) {
  static fuzz::FuzzDir dir("tokenizer_test");
  try {
    Tokenizer::load(dir.write(fuzz::split_files(input, first, others)));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void replace_once(std::string& s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  s.replace(at, from.size(), to);
}

// Token ids outside [0, 2^31) in tokenizer.json are refused: nlohmann would wrap 2^32 + 5 to 5
// and keep -1, a special id that no embedding row has.
TEST(TokenizerIds, OutOfRangeIdsAreRefused) {
  const std::string roberta = seed("tokenizer_json/roberta");
  ASSERT_EQ(load_error(roberta, "tokenizer.json", {}), "");
  for (const std::string& bad : {std::string("-1"), std::string("2147483648")}) {
    std::string text = roberta;
    replace_once(text, R"("cls":["<s>",0])", R"("cls":["<s>",)" + bad + "]");
    const std::string msg = load_error(text, "tokenizer.json", {});
    EXPECT_NE(msg.find("RobertaProcessing needs \"cls\": [token, id] with an id"),
              std::string::npos)
        << msg;
  }
  const std::string options = seed("tokenizer_json/added_options");
  ASSERT_EQ(load_error(options, "tokenizer.json", {}), "");
  for (const std::string& bad : {std::string("-5"), std::string("4294967301")}) {
    std::string text = options;
    replace_once(text, R"("id":300)", R"("id":)" + bad);
    const std::string msg = load_error(text, "tokenizer.json", {});
    EXPECT_NE(msg.find("each added token needs an integer \"id\" from 0 to 2^31 - 1"),
              std::string::npos)
        << msg;
  }
  std::string llama = seed("tokenizer_json/llama3_alone");
  ASSERT_EQ(load_error(llama, "tokenizer.json", {}), "");
  replace_once(llama, R"("ids":[2000])", R"("ids":[-1])");
  const std::string msg = load_error(llama, "tokenizer.json", {});
  EXPECT_NE(msg.find("TemplateProcessing ids of '<|begin_of_text|>' must be token ids"),
            std::string::npos)
      << msg;
}

// A tiktoken rank file whose largest rank leaves no room below 2^31 for the reserved special ids
// of a known class is refused (the ids would wrap negative).
TEST(TokenizerIds, TiktokenReservedIdsMustFit) {
  const std::string kimi = seed("tiktoken/kimi");
  const std::vector<std::string> others{"tokenizer_config.json"};
  ASSERT_EQ(load_error(kimi, "tiktoken.model", others), "");
  for (const auto& [rank, ok] : {std::pair<std::string, bool>{"2147483389", true},
                                 std::pair<std::string, bool>{"2147483390", false}}) {
    std::string text = kimi;
    replace_once(text, "\n--- tokenizer_config.json",
                 "\nQUJDREVGRw== " + rank + "\n--- tokenizer_config.json");
    const std::string msg = load_error(text, "tiktoken.model", others);
    if (ok) {
      EXPECT_EQ(msg, "");
    } else {
      EXPECT_NE(msg.find("tiktoken.model: the largest rank, 2147483390, leaves no room for the 258 "
                         "reserved special ids"),
                std::string::npos)
          << msg;
    }
  }
}

// auto_map.AutoTokenizer names a module whose file strata reads from the checkpoint's folder: a
// name that is not a Python identifier (a path, or longer than a file name may be) is refused
// with one line, "org/repo--module.Class" reads module.py.
TEST(TokenizerIds, TiktokenModuleMustBeAnIdentifier) {
  const std::string kimi = seed("tiktoken/kimi");
  const std::vector<std::string> others{"tokenizer_config.json"};
  const std::string entry = "\"tokenization_kimi.TikTokenTokenizer\"";
  for (const auto& [module, ok] :
       {std::pair<std::string, bool>{"moonshotai/Kimi-K2--tokenization_kimi", true},
        std::pair<std::string, bool>{"../tokenization_kimi", false},
        std::pair<std::string, bool>{std::string(300, 'm'), false}}) {
    std::string text = kimi;
    replace_once(text, entry, "\"" + module + ".TikTokenTokenizer\"");
    const std::string msg = load_error(text, "tiktoken.model", others);
    if (ok) {
      EXPECT_EQ(msg, "") << module;
    } else {
      EXPECT_NE(msg.find("which is not a Python module name"), std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace strata
