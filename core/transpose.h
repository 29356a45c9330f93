// Transposing a row-major matrix of fixed-size elements on the host.
//
// transpose_bytes: dst [cols, rows] = src [rows, cols]^T, i.e. dst[c * rows + r] = src[r * cols +
// c] for elements of `size` bytes (their bytes copied as they are). Tiled, so that both sides are
// read and written a cache line at a time; bytes move as 8 x 8 blocks transposed in 64-bit
// registers, 2-, 4- and 8-byte elements as integers, other sizes with memcpy. Used where an
// exported layout is the transpose of the computed one (gpt-oss's fused experts, export/modelopt.h)
// and for transposed checkpoint views (io/checkpoint.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata {

void transpose_bytes(const uint8_t* src, int64_t rows, int64_t cols, size_t size, uint8_t* dst);

}  // namespace strata
