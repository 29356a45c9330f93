// Every input the fuzzers once crashed on (tests/io/fuzz_regressions/) must now be handled:
// parsed, or refused with a strata::Error. A crash, a sanitizer report or an InternalError fails.
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
  const std::filesystem::path dir =
      std::filesystem::path(STRATA_SOURCE_DIR) / "tests/io/fuzz_regressions";
  ASSERT_TRUE(std::filesystem::exists(dir / "README.md")) << dir;
  int inputs = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
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
  RecordProperty("inputs", inputs);
}

}  // namespace
}  // namespace strata
