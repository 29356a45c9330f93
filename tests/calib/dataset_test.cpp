// Calibration datasets: formats, comma lists, skips, truncation and the documented sampling order.
// The expected orders come from an independent Python implementation of the algorithm written in
// calib/dataset.h (SplitMix64 + Fisher-Yates with rejection), not from this code.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "calib/dataset.h"
#include "core/error.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
const std::string kFixtures = std::string(STRATA_SOURCE_DIR) + "/tests/tokenizer/fixtures";

class CalibTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("strata_calib_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  static std::string record_text(int i) {
    return "Record number " + std::to_string(i) +
           " talks about bridges, gardens and the weather in some detail.";
  }
  fs::path dir_;
};

TEST(CalibSources, CommaLists) {
  auto s = parse_calib_sources("a.jsonl,b.txt", "256,128");
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].path, "a.jsonl");
  EXPECT_EQ(s[0].count, 256);
  EXPECT_EQ(s[1].path, "b.txt");
  EXPECT_EQ(s[1].count, 128);
  s = parse_calib_sources("a.jsonl,b.txt", "64");
  EXPECT_EQ(s[1].count, 64);
  EXPECT_THROW(parse_calib_sources("a,b", "1,2,3"), Error);
  EXPECT_THROW(parse_calib_sources("a", "ten"), Error);
  EXPECT_THROW(parse_calib_sources("a,,b", "1"), Error);
}

TEST_F(CalibTest, JsonlOrderFollowsDocumentedShuffle) {
  const Tokenizer tok = Tokenizer::load(kFixtures + "/qwen2");  // adds no special tokens
  std::string jsonl;
  for (int i = 0; i < 10; ++i)
    jsonl += "{\"text\": \"" + record_text(i) + "\", \"id\": " + std::to_string(i) + "}\n";
  CalibOptions o;
  o.sources = {{write("a.jsonl", jsonl), 10}, {write("b.jsonl", jsonl), 10}};
  o.seed = 1234;
  o.min_tokens = 1;
  Calibration c = load_calibration(o, tok);
  ASSERT_EQ(c.sequences.size(), 20u);
  const int a_order[] = {4, 6, 5, 2, 7, 0, 1, 8, 9, 3};  // Python reference, seed 1234, source 0
  const int b_order[] = {4, 5, 6, 9, 2, 0, 7, 8, 1, 3};  // source 1
  for (int k = 0; k < 10; ++k) {
    EXPECT_EQ(c.sequences[k], tok.encode(record_text(a_order[k]), false)) << k;
    EXPECT_EQ(c.sequences[10 + k], tok.encode(record_text(b_order[k]), false)) << k;
  }
  o.seed = 7;
  o.sources.resize(1);
  o.sources[0].count = 3;
  c = load_calibration(o, tok);
  ASSERT_EQ(c.sequences.size(), 3u);
  const int seven[] = {6, 4, 8};
  for (int k = 0; k < 3; ++k)
    EXPECT_EQ(c.sequences[k], tok.encode(record_text(seven[k]), false));
  EXPECT_EQ(c.report.sources[0].records, 10);
  EXPECT_EQ(c.report.sources[0].taken, 3);
}

TEST_F(CalibTest, SkipsEmptyAndShortAndTruncates) {
  const Tokenizer tok = Tokenizer::load(kFixtures + "/deepseek_v3");  // BOS before each text
  ASSERT_EQ(tok.special_prefix().size(), 1u);
  std::string long_text;
  for (int i = 0; i < 40; ++i)
    long_text += "word" + std::to_string(i) + " ";
  const std::string jsonl =
      "{\"body\": \"\"}\n{\"body\": \"   \"}\n\n{\"body\": \"hi\"}\n{\"body\": \"" + long_text +
      "\"}\n[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]\n[]\n";
  CalibOptions o;
  o.sources = {{write("d.jsonl", jsonl), 100}};
  o.text_field = "body";
  o.seq_len = 16;
  o.min_tokens = 4;
  Calibration c = load_calibration(o, tok);
  const CalibSourceReport& r = c.report.sources[0];
  EXPECT_EQ(r.records, 6);
  EXPECT_EQ(r.skipped_empty, 3);  // "", "   ", []
  EXPECT_EQ(r.skipped_short, 1);  // BOS + "hi" is shorter than 4
  EXPECT_EQ(r.taken, 2);
  EXPECT_EQ(r.truncated, 2);  // the long text and the 18 ids
  ASSERT_EQ(c.sequences.size(), 2u);
  for (const auto& s : c.sequences) {
    EXPECT_EQ(s.size(), 16u);
    if (s[0] == tok.special_prefix()[0]) {
      std::vector<int32_t> want = tok.encode(long_text, false);
      want.resize(15);
      want.insert(want.begin(), tok.special_prefix()[0]);
      EXPECT_EQ(s, want);
    } else {
      std::vector<int32_t> want = {5,  6,  7,  8,  9,  10, 11, 12,
                                   13, 14, 15, 16, 17, 18, 19, 20};  // ids as given
      EXPECT_EQ(s, want);
    }
  }
}

TEST_F(CalibTest, PlainTextIsCutIntoWindows) {
  const Tokenizer tok = Tokenizer::load(kFixtures + "/llama3");  // BOS before each window
  std::string text;
  for (int i = 0; i < 30; ++i)
    text += record_text(i) + "\n";
  CalibOptions o;
  o.sources = {{write("t.txt", text), 1000}};
  o.seq_len = 32;
  o.min_tokens = 1;
  Calibration c = load_calibration(o, tok);
  const std::vector<int32_t> all = tok.encode(text, false);
  const size_t windows = (all.size() + 30) / 31;
  ASSERT_EQ(c.sequences.size(), windows);
  // Every window is BOS + 31 consecutive tokens of the stream (the last may be shorter); together
  // they are the stream.
  std::vector<std::vector<int32_t>> expect;
  for (size_t off = 0; off < all.size(); off += 31) {
    std::vector<int32_t> w = {tok.special_prefix()[0]};
    w.insert(w.end(), all.begin() + off, all.begin() + std::min(all.size(), off + 31));
    expect.push_back(w);
  }
  auto got = c.sequences;
  std::sort(got.begin(), got.end());
  std::sort(expect.begin(), expect.end());
  EXPECT_EQ(got, expect);
}

TEST_F(CalibTest, BadInputNamesFileAndLine) {
  const Tokenizer tok = Tokenizer::load(kFixtures + "/qwen2");
  CalibOptions o;
  o.sources = {{write("bad.jsonl", "{\"text\": \"ok\"}\n{\"content\": \"x\"}\n"), 5}};
  try {
    load_calibration(o, tok);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--calib_text_field"), std::string::npos) << e.what();
  }
  o.sources = {{write("ids.jsonl", "[1, 2, 99999999]\n"), 5}};
  EXPECT_THROW(load_calibration(o, tok), Error);
  o.sources = {{write("broken.jsonl", "{\"text\": \n"), 5}};
  EXPECT_THROW(load_calibration(o, tok), Error);
  o.sources = {{(dir_ / "missing.jsonl").string(), 5}};
  EXPECT_THROW(load_calibration(o, tok), Error);
  o.sources = {{write("x.txt", "some text"), 5}};
  o.seq_len = 1;
  EXPECT_THROW(load_calibration(o, Tokenizer::load(kFixtures + "/llama3")),
               Error);  // no room after BOS
}

TEST_F(CalibTest, BundledCorpusByDefault) {
  const Tokenizer tok = Tokenizer::load(kFixtures + "/qwen2");
  CalibOptions o;
  o.seq_len = 256;
  o.default_count = 16;
  Calibration a = load_calibration(o, tok);
  EXPECT_EQ(a.sequences.size(), 16u);
  for (const auto& s : a.sequences)
    EXPECT_LE(s.size(), 256u);
  Calibration b = load_calibration(o, tok);
  EXPECT_EQ(a.sequences, b.sequences);  // same seed, same sequences
  o.seed = 99;
  Calibration c = load_calibration(o, tok);
  EXPECT_NE(a.sequences, c.sequences);
}

}  // namespace
}  // namespace strata
