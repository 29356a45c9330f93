// Tokenizer throughput on one core: MB of UTF-8 input per second, on prose (data/calib's English
// essays repeated to a few MB, one encode call per paragraph, as calibration does), for each
// fixture tokenizer in tests/tokenizer/fixtures. The first pass starts with an empty word cache;
// the best of the following passes is the steady state. The target is >= 5 MB/s per core.
//   build/<dir>/bin/tokenize_bench [--mb N] [--text FILE]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  double target_mb = 8;
  std::string text_path = std::string(STRATA_SOURCE_DIR) + "/data/calib/essays_en.txt";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--mb")) target_mb = std::atof(argv[i + 1]);
    if (!std::strcmp(argv[i], "--text")) text_path = argv[i + 1];
  }
  std::ifstream f(text_path, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "cannot read %s\n", text_path.c_str());
    return 1;
  }
  std::ostringstream ss;
  ss << f.rdbuf();
  const std::string base = ss.str();
  // Paragraphs of the text, repeated until the total reaches target_mb.
  std::vector<std::string> paragraphs;
  size_t pos = 0;
  while (pos < base.size()) {
    size_t end = base.find("\n\n", pos);
    if (end == std::string::npos) end = base.size();
    paragraphs.push_back(base.substr(pos, end - pos + 1));
    pos = end + 2;
  }
  std::vector<std::string_view> work;
  size_t bytes = 0;
  while (bytes < target_mb * 1e6) {
    for (const std::string& p : paragraphs) {
      work.push_back(p);
      bytes += p.size();
    }
  }
  std::printf("input: %s repeated, %zu paragraphs, %.1f MB, one thread\n", text_path.c_str(),
              work.size(), bytes / 1e6);
  std::printf("%-12s %10s %12s %12s\n", "tokenizer", "tokens/KB", "cold MB/s", "warm MB/s");
  const std::string fixtures = std::string(STRATA_SOURCE_DIR) + "/tests/tokenizer/fixtures/";
  for (const char* family : {"llama3", "qwen2", "deepseek_v3", "gpt4", "gpt2_digits", "kimi"}) {
    try {
      const strata::Tokenizer tok = strata::Tokenizer::load(fixtures + family);
      double best = 0, cold = 0;
      size_t tokens = 0;
      for (int pass = 0; pass < 4; ++pass) {
        tokens = 0;
        auto t0 = std::chrono::steady_clock::now();
        for (std::string_view p : work)
          tokens += tok.encode(p, false).size();
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        double mbs = bytes / 1e6 / s;
        if (pass == 0)
          cold = mbs;
        else if (mbs > best)
          best = mbs;
      }
      std::printf("%-12s %10.1f %12.1f %12.1f\n", family, tokens * 1000.0 / bytes, cold, best);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s\n", family, e.what());
      return 1;
    }
  }
  return 0;
}
