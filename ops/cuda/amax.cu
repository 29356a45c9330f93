// Observers on the device (host launchers: ops/cuda/amax.h): max |x| into uint32 slots by
// atomicMax on the bits.
#include <cuda_runtime.h>

#include <cmath>

#include "core/error.h"
#include "ops/cuda/amax.h"
#include "ops/cuda/launch.cuh"

namespace strata::ops::cuda {
namespace {

using launch::blocks_for;
using launch::kThreads;
using launch::launched;
using launch::st;

__global__ void k_amax(const float* x, int64_t n, uint32_t* slot) {
  uint32_t m = 0;
  FOR_N(i, n) m = max(m, __float_as_uint(x[i]) & 0x7fffffffu);
  for (int o = 16; o > 0; o >>= 1)
    m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0 && m != 0) atomicMax(slot, m);
}

// One warp per row.
__global__ void k_amax_rows(const float* x, int64_t rows, int64_t cols, const int32_t* row_slot,
                            int64_t per_row, uint32_t* slots) {
  const int64_t r = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  if (r >= rows) return;
  uint32_t m = 0;
  for (int64_t c = threadIdx.x & 31; c < cols; c += 32)
    m = max(m, __float_as_uint(x[r * cols + c]) & 0x7fffffffu);
  for (int o = 16; o > 0; o >>= 1)
    m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) != 0 || m == 0) return;
  for (int64_t j = 0; j < per_row; ++j)
    atomicMax(&slots[row_slot[r * per_row + j]], m);
}

// grid.y: the sequence; one thread per column.
__global__ void k_column_stats(const float* x, int64_t cols, const int64_t* bounds, double* sum,
                               float* mx, float* mn) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  const int64_t s = blockIdx.y;
  double acc = 0.0;
  float hi = -INFINITY, lo = INFINITY;
  for (int64_t r = bounds[s]; r < bounds[s + 1]; ++r) {
    const float v = x[r * cols + c];
    acc += static_cast<double>(v);
    if (isnan(v) || v > hi) hi = isnan(hi) ? hi : v;
    if (isnan(v) || v < lo) lo = isnan(lo) ? lo : v;
  }
  sum[s * cols + c] = acc;
  mx[s * cols + c] = hi;
  mn[s * cols + c] = lo;
}

}  // namespace

void amax(const float* x, int64_t n, uint32_t* slot, void* s) {
  if (n == 0) return;
  k_amax<<<blocks_for(n), kThreads, 0, st(s)>>>(x, n, slot);
  launched("amax");
}
void amax_rows(const float* x, int64_t rows, int64_t cols, const int32_t* row_slot, uint32_t* slots,
               void* s, int64_t per_row) {
  if (rows == 0) return;
  STRATA_ASSERT(rows < (1ll << 31));
  const int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;
  k_amax_rows<<<static_cast<unsigned>(blocks), kThreads, 0, st(s)>>>(x, rows, cols, row_slot,
                                                                     per_row, slots);
  launched("amax_rows");
}
void column_stats(const float* x, int64_t cols, const int64_t* bounds, int64_t n_seqs, double* sum,
                  float* max, float* min, void* s) {
  if (n_seqs == 0 || cols == 0) return;
  STRATA_ASSERT(n_seqs < 65536, "column_stats: ", n_seqs, " sequences in one launch");
  const dim3 grid(static_cast<unsigned>((cols + kThreads - 1) / kThreads),
                  static_cast<unsigned>(n_seqs));
  k_column_stats<<<grid, kThreads, 0, st(s)>>>(x, cols, bounds, sum, max, min);
  launched("column_stats");
}

}  // namespace strata::ops::cuda
