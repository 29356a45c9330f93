#include "core/transpose.h"

#include <algorithm>
#include <cstring>

namespace strata {
namespace {

// A tile of kTile x kTile elements: for bytes 64 x 64 = 4 KiB each side, within L1.
constexpr int64_t kTile = 64;

template <typename T>
void transpose_typed(const uint8_t* src, int64_t rows, int64_t cols, uint8_t* dst) {
  // memcpy per element: the buffers need not be aligned to T; compilers turn it into one move.
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    const int64_t r1 = std::min(rows, r0 + kTile);
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t c1 = std::min(cols, c0 + kTile);
      for (int64_t c = c0; c < c1; ++c) {
        uint8_t* d = dst + (c * rows) * static_cast<int64_t>(sizeof(T));
        for (int64_t r = r0; r < r1; ++r) {
          T v;
          std::memcpy(&v, src + (r * cols + c) * static_cast<int64_t>(sizeof(T)), sizeof(T));
          std::memcpy(d + r * static_cast<int64_t>(sizeof(T)), &v, sizeof(T));
        }
      }
    }
  }
}

// Bytes: 8 x 8 blocks through eight 64-bit words (row i of the block in word i, its byte j being
// column j, little-endian), transposed in registers by swapping 4 x 4, then 2 x 2, then 1 x 1
// sub-blocks across the diagonal; the edges past the last whole block one byte at a time.
void transpose_8x8(const uint8_t* src, int64_t src_stride, uint8_t* dst, int64_t dst_stride) {
  uint64_t x[8];
  for (int i = 0; i < 8; ++i)
    std::memcpy(&x[i], src + i * src_stride, 8);
  for (int i = 0; i < 4; ++i) {  // rows i, i + 4: bytes 4..7 of the one <-> bytes 0..3 of the other
    const uint64_t t = ((x[i] >> 32) ^ x[i + 4]) & 0x00000000FFFFFFFFull;
    x[i] ^= t << 32;
    x[i + 4] ^= t;
  }
  for (int i : {0, 1, 4, 5}) {
    const uint64_t t = ((x[i] >> 16) ^ x[i + 2]) & 0x0000FFFF0000FFFFull;
    x[i] ^= t << 16;
    x[i + 2] ^= t;
  }
  for (int i : {0, 2, 4, 6}) {
    const uint64_t t = ((x[i] >> 8) ^ x[i + 1]) & 0x00FF00FF00FF00FFull;
    x[i] ^= t << 8;
    x[i + 1] ^= t;
  }
  for (int i = 0; i < 8; ++i)
    std::memcpy(dst + i * dst_stride, &x[i], 8);
}

void transpose_u8(const uint8_t* src, int64_t rows, int64_t cols, uint8_t* dst) {
  const int64_t r8 = rows / 8 * 8, c8 = cols / 8 * 8;
  for (int64_t r0 = 0; r0 < r8; r0 += kTile) {
    const int64_t r1 = std::min(r8, r0 + kTile);
    for (int64_t c0 = 0; c0 < c8; c0 += kTile) {
      const int64_t c1 = std::min(c8, c0 + kTile);
      for (int64_t c = c0; c < c1; c += 8) {
        for (int64_t r = r0; r < r1; r += 8)
          transpose_8x8(src + r * cols + c, cols, dst + c * rows + r, rows);
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {  // the edges: columns past c8, and rows past r8
    for (int64_t c = r < r8 ? c8 : 0; c < cols; ++c)
      dst[c * rows + r] = src[r * cols + c];
  }
}

}  // namespace

void transpose_bytes(const uint8_t* src, int64_t rows, int64_t cols, size_t size, uint8_t* dst) {
  switch (size) {
    case 1:
      return transpose_u8(src, rows, cols, dst);
    case 2:
      return transpose_typed<uint16_t>(src, rows, cols, dst);
    case 4:
      return transpose_typed<uint32_t>(src, rows, cols, dst);
    case 8:
      return transpose_typed<uint64_t>(src, rows, cols, dst);
    default:
      break;
  }
  const int64_t es = static_cast<int64_t>(size);
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    const int64_t r1 = std::min(rows, r0 + kTile);
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t c1 = std::min(cols, c0 + kTile);
      for (int64_t c = c0; c < c1; ++c) {
        for (int64_t r = r0; r < r1; ++r)
          std::memcpy(dst + (c * rows + r) * es, src + (r * cols + c) * es, size);
      }
    }
  }
}

}  // namespace strata
