#include "core/disk_timeline.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace strata {
namespace {

namespace fs = std::filesystem;

// 8 MiB written and synced between two marks land in that phase and in no other: the counters are
// the kernel's (dirtied bytes are counted when written, not when written back), so a phase without
// writes shows 0. The per-step series has one entry per sample.
TEST(DiskTimeline, AttributesWritesToThePhaseThatMadeThem) {
  uint64_t r0 = 0, w0 = 0;
  if (!process_io_bytes(&r0, &w0)) GTEST_SKIP() << "/proc/self/io cannot be read here";
  // The build folder (the test's working directory), not /tmp, which may be a tmpfs that does
  // not count writes to storage.
  const fs::path file = fs::current_path() / ("disk_timeline_test_" + std::to_string(getpid()));
  DiskTimeline timeline(0.05);
  timeline.mark("quiet");
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  timeline.mark("writing");
  {
    const int fd = ::open(file.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    const std::vector<char> block(1 << 20, 'x');
    for (int i = 0; i < 8; ++i)
      ASSERT_EQ(::write(fd, block.data(), block.size()), static_cast<ssize_t>(block.size()));
    ASSERT_EQ(::fsync(fd), 0);
    ::close(fd);
  }
  timeline.mark("after");
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  const std::string out = timeline.finish();
  fs::remove(file);
  uint64_t r1 = 0, w1 = 0;
  ASSERT_TRUE(process_io_bytes(&r1, &w1));
  if (w1 - w0 < (8u << 20)) GTEST_SKIP() << "this filesystem does not count writes per process";

  std::map<std::string, double> written;
  const std::regex line(
      R"(disk, (\w+) \(([0-9.]+)-([0-9.]+) s\): [0-9.]+ GB read \([0-9.]+ GB/s\), ([0-9.]+) GB written)");
  std::istringstream in(out);
  std::string l;
  int series = 0;
  while (std::getline(in, l)) {
    std::smatch m;
    if (std::regex_search(l, m, line)) {
      written[m[1]] = std::stod(m[4]);
      EXPECT_LE(std::stod(m[2]), std::stod(m[3])) << l;
    } else if (l.rfind("disk GB/s each", 0) == 0) {
      ++series;
      std::istringstream values(l.substr(l.find(':') + 1));
      int n = 0;
      for (double v; values >> v; ++n)
        EXPECT_GE(v, 0.0) << l;
      EXPECT_GE(n, 4) << l;  // at least 240 ms at 50 ms a step
    } else {
      ADD_FAILURE() << "unexpected line: " << l;
    }
  }
  EXPECT_EQ(series, 2) << out;
  ASSERT_EQ(written.size(), 3u) << out;
  EXPECT_EQ(written["quiet"], 0.0) << out;
  EXPECT_GE(written["writing"], 0.008) << out;  // 8 MiB = 0.0084 GB, printed to 0.01
  EXPECT_EQ(written["after"], 0.0) << out;
  EXPECT_EQ(timeline.finish(), "");  // once
}

}  // namespace
}  // namespace strata
