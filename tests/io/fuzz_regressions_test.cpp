// Every input the io fuzzers once crashed on (tests/io/fuzz_regressions/), and their seed
// corpora, must be handled: parsed, or refused with a strata::Error. A crash, a sanitizer report
// or an InternalError fails. (The other targets' inputs: tests/*/fuzz_replay_test.cpp.)
#include <gtest/gtest.h>

#include <filesystem>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "io_test_util.h"

namespace strata {
namespace {

TEST(FuzzRegressions, EveryInputIsHandled) {
  const std::filesystem::path root(STRATA_SOURCE_DIR);
  ASSERT_TRUE(std::filesystem::exists(root / "tests/io/fuzz_regressions/README.md"));
  int inputs = 0;
  // The findings, and the seed corpora of the two io targets (fuzz/corpus/).
  for (const char* folder :
       {"tests/io/fuzz_regressions", "fuzz/corpus/safetensors", "fuzz/corpus/index"}) {
    for (const auto& e : std::filesystem::directory_iterator(root / folder)) {
      if (!e.is_regular_file() || e.path().filename() == "README.md") continue;
      SCOPED_TRACE(e.path().string());
      const std::string bytes = test::read_bytes(e.path().string());
      ++inputs;
      try {
        parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                 "fuzz");
      } catch (const Error&) {
      }
      try {
        parse_safetensors_index(bytes, "fuzz");
      } catch (const Error&) {
      }
      try {
        parse_model_config(json_parse_strict(bytes, "fuzz"), "fuzz");
      } catch (const Error&) {
      }
    }
  }
  RecordProperty("inputs", inputs);
}

}  // namespace
}  // namespace strata
