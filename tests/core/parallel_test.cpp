#include "core/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

namespace strata {
namespace {

// Every index of [0, n) is visited exactly once, in contiguous chunks of at least min_chunk
// (except a single chunk for a small n), on at most `threads` chunks, whatever the thread count.
TEST(ParallelChunks, VisitsEveryIndexOnce) {
  for (size_t n : {0, 1, 7, 4095, 4096, 10000, 65537}) {
    for (size_t threads : {1, 2, 3, 16}) {
      std::vector<std::atomic<int>> seen(n);
      std::atomic<int> calls{0};
      parallel_chunks(n, threads, 1000, [&](size_t begin, size_t end) {
        ++calls;
        EXPECT_LT(begin, end);
        if (n >= 2000) EXPECT_GE(end - begin, 1000u) << n << " " << threads;
        for (size_t i = begin; i < end; ++i)
          ++seen[i];
      });
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(seen[i].load(), 1) << "n " << n << " threads " << threads << " index " << i;
      // At most one chunk a thread and none for an empty range; a range of two chunks' worth
      // is split when there are threads to split it over.
      const size_t chunks = static_cast<size_t>(calls.load());
      EXPECT_LE(chunks, threads) << n;
      if (n == 0) EXPECT_EQ(chunks, 0u);
      if (n >= 2000 && threads >= 2) EXPECT_GE(chunks, 2u) << n << " " << threads;
    }
  }
}

// Indices 30000 and 70000 fail (each chunk stops at its first failure): the error is index
// 30000's, the one a sequential loop meets first, with any thread count.
TEST(ParallelChunks, RethrowsTheFirstFailureInIndexOrder) {
  for (size_t threads : {1, 2, 4, 16}) {
    try {
      parallel_chunks(100000, threads, 100, [&](size_t begin, size_t end) {
        for (size_t i = begin; i < end; ++i) {
          if (i == 30000 || i == 70000) throw std::runtime_error("index " + std::to_string(i));
        }
      });
      FAIL() << "no exception with " << threads << " threads";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "index 30000") << threads;
    }
  }
}

}  // namespace
}  // namespace strata
