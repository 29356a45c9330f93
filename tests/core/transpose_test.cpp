// transpose_bytes against the definition dst[c, r] = src[r, c], element by element, on shapes
// around the tile edge (64) and on element sizes with and without an integer fast path.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/transpose.h"

namespace strata {
namespace {

TEST(Transpose, HandWorkedBytes) {
  // [2, 3] = {a b c; d e f} -> [3, 2] = {a d; b e; c f}
  const uint8_t src[6] = {1, 2, 3, 4, 5, 6};
  uint8_t dst[6] = {};
  transpose_bytes(src, 2, 3, 1, dst);
  const uint8_t want[6] = {1, 4, 2, 5, 3, 6};
  EXPECT_EQ(std::memcmp(dst, want, 6), 0);
}

TEST(Transpose, EveryElementMovesWhole) {
  std::mt19937 rng(7);
  for (size_t size : {1u, 2u, 3u, 4u, 8u, 12u}) {
    for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t> >{
             {1, 1}, {1, 70}, {70, 1}, {63, 64}, {64, 65}, {129, 200}, {200, 129}}) {
      std::vector<uint8_t> src(static_cast<size_t>(rows * cols) * size);
      for (uint8_t& b : src)
        b = static_cast<uint8_t>(rng());
      // Misaligned on purpose: one byte into each buffer.
      std::vector<uint8_t> out(src.size() + 1, 0xA5);
      std::vector<uint8_t> in(src.size() + 1);
      std::memcpy(in.data() + 1, src.data(), src.size());
      transpose_bytes(in.data() + 1, rows, cols, size, out.data() + 1);
      EXPECT_EQ(out[0], 0xA5);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          ASSERT_EQ(std::memcmp(out.data() + 1 + static_cast<size_t>(c * rows + r) * size,
                                src.data() + static_cast<size_t>(r * cols + c) * size, size),
                    0)
              << "size " << size << " shape " << rows << "x" << cols << " at " << r << "," << c;
        }
      }
    }
  }
}

}  // namespace
}  // namespace strata
