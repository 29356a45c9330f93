// The resume fuzz target's seeds and findings, replayed (tests/fuzz_replay_util.h): every input
// is a resume manifest or run record that keeps its promises, or a strata::Error.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "engine/resume.h"
#include "fuzz/resume_target.h"
#include "tests/fuzz_replay_util.h"

namespace strata {
namespace {

TEST(FuzzReplay, Resume) {
  const auto seeds = test::fuzz_inputs("fuzz/corpus/resume");
  ASSERT_FALSE(seeds.empty());
  // Seeds named bad_* are refused by both parsers; the others parse as one of them.
  int good = 0;
  for (const auto& p : seeds)
    good += !p.filename().string().starts_with("bad_");
  EXPECT_EQ(test::replay_fuzz_inputs(seeds, fuzz::resume_one), good);
  test::replay_fuzz_inputs(test::fuzz_inputs("tests/engine/fuzz_regressions", "resume-"),
                           fuzz::resume_one);
}

std::string manifest(const std::string& steps, const std::string& crc, const std::string& layer) {
  return R"({"format": "strata-resume-2", "identity": {"source": "00ff"}, "steps": )" + steps +
         R"(, "next_step": 1, "hidden_file": "hidden-1.safetensors", "hidden_crc32c": [)" + crc +
         R"(], "layers": [[)" + layer + ", 8, 2]]}";
}

TEST(ResumeManifest, ReadsCounts) {
  const ResumeState s =
      parse_resume_manifest(manifest("6", "4294967295, 0", "0"), "m/manifest.json");
  EXPECT_EQ(s.steps, 6);
  EXPECT_EQ(s.next_step, 1);
  EXPECT_EQ(s.hidden_file, "hidden-1.safetensors");
  EXPECT_EQ(s.hidden_sums, (std::vector<uint32_t>{0xFFFFFFFFu, 0}));
  ASSERT_EQ(s.layers.size(), 1u);
  EXPECT_EQ(s.layers[0].layer, 0);
  EXPECT_EQ(s.layers[0].experts, 8);
  EXPECT_EQ(s.layers[0].experts_without_tokens, 2);
  EXPECT_EQ(s.identity.at("source"), "00ff");
}

// Counts and checksums that are not integers in range are refused naming the field. (nlohmann
// alone converts 1e300 to int64_t, which is undefined behaviour, and -1 to a uint32_t checksum.)
TEST(ResumeManifest, RefusesNumbersThatAreNotCounts) {
  struct Case {
    std::string steps, crc, layer, field;
  };
  for (const Case& c : std::vector<Case>{{"1e300", "1", "0", "steps"},
                                         {"6.5", "1", "0", "steps"},
                                         {"-6", "1", "0", "steps"},
                                         {"6", "4294967296", "0", "hidden_crc32c"},
                                         {"6", "-1", "0", "hidden_crc32c"},
                                         {"6", "1e20", "0", "hidden_crc32c"},
                                         {"6", "1", "1e30", "layer's index"},
                                         {"6", "1", "18446744073709551615", "layer's index"}}) {
    SCOPED_TRACE(c.steps + " " + c.crc + " " + c.layer);
    try {
      parse_resume_manifest(manifest(c.steps, c.crc, c.layer), "m/manifest.json");
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("m/manifest.json: malformed resume manifest"), std::string::npos) << msg;
      EXPECT_NE(msg.find(c.field), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace strata
