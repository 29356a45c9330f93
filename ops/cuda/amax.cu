// Observers on the device (host launchers: ops/cuda/amax.h): max |x| into uint32 slots by
// atomicMax on the bits.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cub/block/block_scan.cuh>

#include "core/error.h"
#include "ops/cuda/amax.h"
#include "ops/cuda/launch.cuh"

namespace strata::ops::cuda {
namespace {

using launch::blocks_for;
using launch::kThreads;
using launch::launched;
using launch::st;

// One atomicMax a block (kAmaxBlocks at most), not one a warp: with a warp's, an observer of a
// 4096-token chunk's K (12.6 M values) queued 393k atomics on one address, and Kimi-K2's attention
// observers took 3.5 s of device time in a 28 s run.
constexpr int kAmaxBlocks = 1024;
__global__ void k_amax(const float* x, int64_t n, uint32_t* slot) {
  __shared__ uint32_t part[kThreads / 32];
  uint32_t m = 0;
  FOR_N(i, n) m = max(m, __float_as_uint(x[i]) & 0x7fffffffu);
  for (int o = 16; o > 0; o >>= 1)
    m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kThreads / 32; ++w)
    m = max(m, part[w]);
  if (m != 0) atomicMax(slot, m);
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

// One thread block per (group, block n of 16 columns), one thread per entry (i, j) of the block's
// 16x16 sums: rows are loaded 16 at a time into shared memory (one value a thread), then each
// thread adds its products row by row in the group's order, so every sum sees the order the CPU's
// BlockHessian::accumulate gives it. vi * vj is exact in double.
constexpr int kHessBlock = 16, kHessRows = 16;
__global__ void k_block_hessian(const float* x, int64_t cols, const int32_t* order, int32_t div,
                                const int32_t* map, const int32_t* bounds, int64_t rows,
                                double* sums, int64_t group_stride) {
  __shared__ float tile[kHessRows][kHessBlock];
  const int64_t g = blockIdx.y, n = blockIdx.x;
  const int t = threadIdx.x, i = t / kHessBlock, j = t % kHessBlock;
  const int64_t r0 = bounds ? bounds[g] : 0, r1 = bounds ? bounds[g + 1] : rows;
  if (r0 == r1) return;
  double* h = sums + g * group_stride + n * kHessBlock * kHessBlock + t;
  double acc = *h;
  for (int64_t r = r0; r < r1; r += kHessRows) {
    const int64_t k = r + i;  // the row this thread loads: value j of row k
    if (k < r1) {
      int64_t row = k;
      if (order) row = map ? map[order[k]] : order[k] / div;
      tile[i][j] = x[row * cols + n * kHessBlock + j];
    }
    __syncthreads();
    const int64_t m = min(static_cast<int64_t>(kHessRows), r1 - r);
    for (int64_t q = 0; q < m; ++q)
      acc = __dadd_rn(acc,
                      __dmul_rn(static_cast<double>(tile[q][i]), static_cast<double>(tile[q][j])));
    __syncthreads();
  }
  *h = acc;
}

// One thread block per expert e: the slots s (in increasing order) with chosen[s] == e written to
// order[offsets[e] ...], by a block-wide scan over the slots.
constexpr int kOrderThreads = 256;
__global__ void k_expert_order(const int32_t* chosen, int64_t S, const int32_t* offsets,
                               int32_t* order) {
  using Scan = cub::BlockScan<int, kOrderThreads>;
  __shared__ typename Scan::TempStorage scratch;
  const int e = static_cast<int>(blockIdx.x);
  int64_t base = offsets[e];
  for (int64_t s0 = 0; s0 < S; s0 += kOrderThreads) {
    const int64_t s = s0 + threadIdx.x;
    const int mine = s < S && chosen[s] == e ? 1 : 0;
    int before = 0, total = 0;
    Scan(scratch).ExclusiveSum(mine, before, total);
    if (mine) order[base + before] = static_cast<int32_t>(s);
    base += total;
    __syncthreads();  // the scan's storage is reused
  }
}

// One thread per (row, block of 16 columns): the block's amax, its bin by counting the thresholds
// at or below it (binary search over the table in shared memory), and one count for each of the
// row's slots.
constexpr int kHistBins = static_cast<int>(kHistogramBins);
__global__ void k_block_histogram(const float* x, int64_t rows, int64_t cols,
                                  const int32_t* row_slot, int64_t per_row, const float* thresholds,
                                  unsigned long long* hist) {
  __shared__ float t[kHistBins - 1];
  for (int i = static_cast<int>(threadIdx.x); i < kHistBins - 1; i += static_cast<int>(blockDim.x))
    t[i] = thresholds[i];
  __syncthreads();
  const int64_t blocks = (cols + 15) / 16;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * blocks) return;
  const int64_t r = i / blocks, c0 = (i % blocks) * 16, c1 = min(cols, c0 + 16);
  float b = 0.0f;
  for (int64_t c = c0; c < c1; ++c)
    b = fmaxf(b, fabsf(x[r * cols + c]));  // a NaN element is skipped, as on the CPU
  if (!(b > 0.0f) || isinf(b)) return;
  int lo = 0, hi = kHistBins - 1;  // the number of thresholds <= b
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (t[mid] <= b) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  for (int64_t j = 0; j < per_row; ++j) {
    const int64_t slot = row_slot ? row_slot[r * per_row + j] : 0;
    atomicAdd(&hist[slot * kHistBins + lo], 1ull);
  }
}

}  // namespace

void amax(const float* x, int64_t n, uint32_t* slot, void* s) {
  if (n == 0) return;
  k_amax<<<std::min(blocks_for(n), kAmaxBlocks), kThreads, 0, st(s)>>>(x, n, slot);
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

void block_hessian(const float* x, int64_t rows, int64_t cols, double* sums, void* s) {
  if (rows == 0) return;
  STRATA_ASSERT(cols % kHessBlock == 0, "block_hessian: ", cols, " columns");
  k_block_hessian<<<dim3(static_cast<unsigned>(cols / kHessBlock), 1), kHessBlock * kHessBlock, 0,
                    st(s)>>>(x, cols, nullptr, 1, nullptr, nullptr, rows, sums, 0);
  launched("block_hessian");
}
void expert_order(const int32_t* chosen, int64_t slots, const int32_t* offsets, int64_t experts,
                  int32_t* order, void* s) {
  if (slots == 0 || experts == 0) return;
  k_expert_order<<<static_cast<unsigned>(experts), kOrderThreads, 0, st(s)>>>(chosen, slots,
                                                                              offsets, order);
  launched("expert_order");
}
void expert_block_hessian(const float* x, int64_t cols, const int32_t* order, int32_t div,
                          const int32_t* map, const int32_t* offsets, int64_t experts, double* sums,
                          void* s) {
  if (experts == 0) return;
  STRATA_ASSERT(cols % kHessBlock == 0 && experts < 65536, "expert_block_hessian: ", cols,
                " columns, ", experts, " experts");
  k_block_hessian<<<dim3(static_cast<unsigned>(cols / kHessBlock), static_cast<unsigned>(experts)),
                    kHessBlock * kHessBlock, 0, st(s)>>>(x, cols, order, div, map, offsets, 0, sums,
                                                         cols * kHessBlock);
  launched("expert_block_hessian");
}

void block_histogram(const float* x, int64_t rows, int64_t cols, const int32_t* row_slot,
                     int64_t per_row, const float* thresholds, unsigned long long* hist, void* s) {
  const int64_t n = rows * ((cols + 15) / 16);
  if (n == 0) return;
  k_block_histogram<<<blocks_for(n), kThreads, 0, st(s)>>>(x, rows, cols, row_slot, per_row,
                                                           thresholds, hist);
  launched("block_histogram");
}

}  // namespace strata::ops::cuda
