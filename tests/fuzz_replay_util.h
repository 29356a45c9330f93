// Replays fuzz inputs in the test suite: a target's seed corpus (fuzz/corpus/<target>/) and the
// inputs that once failed it (the module's tests/<module>/fuzz_regressions/<target>-*), each fed
// to the same checks the fuzz target runs (fuzz/*_target.h). A crash, a sanitizer report, an
// exception other than strata::Error or a broken promise fails the test binary.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace strata::test {

// The files of `dir` (relative to the source tree) whose names start with `prefix`, README.md
// left out, sorted; none when the folder does not exist.
inline std::vector<std::filesystem::path> fuzz_inputs(const std::string& dir,
                                                      const std::string& prefix = "") {
  std::vector<std::filesystem::path> out;
  const std::filesystem::path root = std::filesystem::path(STRATA_SOURCE_DIR) / dir;
  if (!std::filesystem::is_directory(root)) return out;
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name != "README.md" && name.starts_with(prefix))
      out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Feeds every file to `one` (bool(const uint8_t*, size_t): accepted or not); returns how many
// were accepted.
template <typename F>
int replay_fuzz_inputs(const std::vector<std::filesystem::path>& files, F&& one) {
  int accepted = 0;
  for (const std::filesystem::path& p : files) {
    SCOPED_TRACE(p.string());
    std::ifstream in(p, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (one(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size())) ++accepted;
  }
  return accepted;
}

}  // namespace strata::test
