// mmap_bench [FILE]: read throughput of strata's checkpoint reader against `cat FILE > /dev/null`
// on a warm (page-cached) file. See bench/README.md.
//
// FILE defaults to /tmp/strata_mmap_bench_1gib.safetensors, created when absent: a valid
// safetensors file of exactly 1 GiB holding one U8 tensor of pseudo-random bytes. The file is
// warmed first (read once by cat and once through the mapping), then each method runs 3 times:
//   cat       std::system("cat FILE > /dev/null")
//   strata    SafetensorsFile::open (mmap + header validation), the tensor's zero-copy view,
//             and a sum of every byte of it as 64-bit words (every page is touched)
//   +willneed the same with MappedFile::will_need over the tensor first (the engine's prefetch
//             hint)
// It prints GB/s (10^9 bytes/s) per run, the best of 3 per method, and strata's best as a
// fraction of cat's best. The goal is >= 80%.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kFileBytes = uint64_t{1} << 30;
constexpr int kRepeats = 3;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool file_exists(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  std::fclose(f);
  return true;
}

// Writes a 1 GiB safetensors file: one U8 tensor "data" filling everything after the header.
void create_file(const std::string& path) {
  std::string header;
  uint64_t header_len = 0;
  // The data size depends on the header's length and the header holds the data size: settle it.
  for (int i = 0; i < 4; ++i) {
    const uint64_t data = kFileBytes - 8 - header_len;
    header = "{\"data\":{\"dtype\":\"U8\",\"shape\":[" + std::to_string(data) +
             "],\"data_offsets\":[0," + std::to_string(data) + "]}}";
    header.append((8 - header.size() % 8) % 8, ' ');
    header_len = header.size();
  }
  const uint64_t data = kFileBytes - 8 - header_len;
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  STRATA_CHECK(f, tmp, ": cannot create the benchmark file");
  std::fwrite(&header_len, 8, 1, f);  // little-endian host
  std::fwrite(header.data(), 1, header.size(), f);
  std::vector<uint64_t> block(1 << 17);  // 1 MiB
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (uint64_t written = 0; written < data;) {
    for (uint64_t& w : block) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      w = x;
    }
    const size_t n = static_cast<size_t>(std::min<uint64_t>(data - written, block.size() * 8));
    STRATA_CHECK(std::fwrite(block.data(), 1, n, f) == n, tmp, ": write failed (disk full?)");
    written += n;
  }
  STRATA_CHECK(std::fclose(f) == 0, tmp, ": write failed");
  STRATA_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, path, ": rename failed");
}

double run_cat(const std::string& path) {
  const std::string cmd = "cat '" + path + "' > /dev/null";
  auto t0 = Clock::now();
  STRATA_CHECK(std::system(cmd.c_str()) == 0, cmd, " failed");
  return seconds_since(t0);
}

// Opens through strata's reader and sums every byte of the tensor's view; returns seconds.
double run_strata(const std::string& path, bool will_need, uint64_t* checksum, uint64_t* bytes) {
  auto t0 = Clock::now();
  strata::SafetensorsFile file = strata::SafetensorsFile::open(path);
  const strata::TensorEntry& e = file.entries().front();
  strata::Tensor t = file.tensor(e);
  if (will_need) file.mapping()->will_need(file.header().data_offset + e.begin, t.nbytes());
  const uint8_t* p = t.bytes();
  const size_t n = t.nbytes();
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    uint64_t w[4];
    std::memcpy(w, p + i, 32);  // the view is only 8-byte aligned relative to the data section
    s0 += w[0];
    s1 += w[1];
    s2 += w[2];
    s3 += w[3];
  }
  for (; i < n; ++i)
    s0 += p[i];
  *checksum = s0 + s1 + s2 + s3;
  *bytes = file.file_size();
  return seconds_since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "/tmp/strata_mmap_bench_1gib.safetensors";
  try {
    if (!file_exists(path)) {
      std::printf("creating %s (1 GiB)\n", path.c_str());
      create_file(path);
    }
    uint64_t checksum = 0, bytes = 0;
    run_cat(path);  // warm the page cache
    run_strata(path, false, &checksum, &bytes);
    const double gb = static_cast<double>(bytes) / 1e9;
    std::printf("file %s, %llu bytes, warm\n", path.c_str(),
                static_cast<unsigned long long>(bytes));

    double best_cat = 0, best_strata = 0, best_willneed = 0;
    for (int r = 0; r < kRepeats; ++r) {
      const double c = gb / run_cat(path);
      uint64_t sum = 0;
      const double s = gb / run_strata(path, false, &sum, &bytes);
      STRATA_ASSERT(sum == checksum, "the sum changed between runs");
      const double w = gb / run_strata(path, true, &sum, &bytes);
      STRATA_ASSERT(sum == checksum, "the sum changed between runs");
      std::printf("run %d: cat %6.2f GB/s   strata %6.2f GB/s   strata+willneed %6.2f GB/s\n",
                  r + 1, c, s, w);
      best_cat = std::max(best_cat, c);
      best_strata = std::max(best_strata, s);
      best_willneed = std::max(best_willneed, w);
    }
    const double best = std::max(best_strata, best_willneed);
    std::printf("best of %d: cat %.2f GB/s, strata %.2f GB/s, strata+willneed %.2f GB/s\n",
                kRepeats, best_cat, best_strata, best_willneed);
    std::printf("strata / cat = %.0f%% (goal >= 80%%)  [checksum %016llx]\n",
                100.0 * best / best_cat, static_cast<unsigned long long>(checksum));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mmap_bench: error: %s\n", e.what());
    return 1;
  }
}
