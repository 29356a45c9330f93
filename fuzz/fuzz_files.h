// Helpers shared by the fuzz targets (fuzz/*_fuzz.cpp) and the tests that replay their corpora
// and findings (tests/*/fuzz_replay_test.cpp).
//
// Loaders that read a directory (a tokenizer is tokenizer.json plus tokenizer_config.json, or
// tiktoken.model plus tokenizer_config.json plus the tokenizer's Python file) are fuzzed with one
// input that holds several files: the first file's bytes, then for each further file a line
// "--- <file name> ---" and its bytes:
//
//   <tiktoken.model bytes>
//   --- tokenizer_config.json ---
//   <tokenizer_config.json bytes>
//
// FuzzDir writes them into a private folder, so that the loader reads them as the tool would.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace strata::fuzz {

// Splits `input` into (file name, bytes) pairs; the first file is named `first`. A marker line
// naming a file that is not in `allowed` is kept as bytes of the file before it.
inline std::vector<std::pair<std::string, std::string>> split_files(
    std::string_view input, const std::string& first, const std::vector<std::string>& allowed) {
  std::vector<std::pair<std::string, std::string>> files{{first, ""}};
  size_t pos = 0;
  while (true) {
    size_t best = std::string_view::npos;
    std::string name;
    for (const std::string& a : allowed) {
      const std::string marker = "\n--- " + a + " ---\n";
      const size_t at = input.find(marker, pos);
      if (at < best) {
        best = at;
        name = a;
      }
    }
    if (best == std::string_view::npos) {
      files.back().second.append(input.substr(pos));
      return files;
    }
    files.back().second.append(input.substr(pos, best - pos));
    pos = best + name.size() + 10;  // "\n--- " + name + " ---\n"
    files.emplace_back(name, "");
  }
}

// A folder of this process under the system's temporary folder, emptied for each input and
// removed at exit.
class FuzzDir {
 public:
  explicit FuzzDir(const std::string& tag)
      : path_(std::filesystem::temp_directory_path() /
              ("strata-fuzz-" + tag + "-" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path_);
  }
  ~FuzzDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  FuzzDir(const FuzzDir&) = delete;
  FuzzDir& operator=(const FuzzDir&) = delete;

  // Replaces the folder's files with `files` (a later file of the same name wins).
  const std::string& write(const std::vector<std::pair<std::string, std::string>>& files) {
    for (const auto& e : std::filesystem::directory_iterator(path_))
      std::filesystem::remove_all(e.path());
    for (const auto& [name, bytes] : files) {
      std::ofstream out(path_ / name, std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
    str_ = path_.string();
    return str_;
  }

 private:
  std::filesystem::path path_;
  std::string str_;
};

}  // namespace strata::fuzz
