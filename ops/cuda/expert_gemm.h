// The routed experts' GEMMs of a MoE layer in one launch (ops/cuda/expert_gemm.cu); conventions:
// ops/cuda/convert.h.
//
// The rows of x are grouped by expert (ops/cuda/moe.h moe_scatter/moe_gather): expert e owns rows
// [offsets[e], offsets[e + 1]). For every expert and every output j < n_out,
//
//   y_j[offsets[e] + r, :] = x[offsets[e] + r, :] . w_j[e]^T      (x [S, K], w_j[e] [N, K])
//
// ops::linear without bias per expert, fp32 accumulation and fp32 output. The counts stay on the
// device: expert_plan turns them into the row offsets and a tile numbering (an expert with no
// rows has no tile), and expert_gemm runs one thread block per (tile,
// column block, output), so a chunk's gate and up GEMMs are one launch and its down GEMMs
// another, and the host never waits for the counts.
//
// Arithmetic: bf16 inputs with bf16 tensor-core products (exact in fp32) summed in fp32, as
// cuBLAS's bf16 GEMM does in another order; fp32 inputs: one fused multiply-add per k, in k order
// (no TF32), as cuBLAS's pedantic fp32 GEMM up to summation order.
#pragma once

#include <cstdint>

namespace strata::ops::cuda {

// The rows of a tile for S rows over E experts: 64, or for bf16 128 when the experts average 128
// rows or more. expert_plan and the expert_gemm calls on its tiles take the same value.
int64_t expert_row_tile(int64_t S, int64_t E, bool bf16);

// From counts[E] (the routing's rows per expert): offsets[E + 1] (exclusive prefix sums, offsets[E]
// the total) and tile_first[E + 1] (the first tile of each expert, tiles of row_tile rows;
// tile_first[E] the number of tiles). rows_a and rows_b, when not null, are [E] counters to which
// each expert's count is added (the observers' row counts). One block; E up to 65536.
void expert_plan(const int32_t* counts, int64_t E, int64_t row_tile, int32_t* offsets,
                 int32_t* tile_first, uint64_t* rows_a, uint64_t* rows_b, void* stream);

// The most tiles S rows over E experts can make (the grid expert_gemm launches; blocks past the
// real count return at once).
int64_t expert_gemm_max_tiles(int64_t S, int64_t E, int64_t row_tile);

// Up to two outputs sharing x: w[j] a device array of E weight pointers ([N, K] each, bf16 bits
// or fp32 as x), y[j] the [S, N] output (row stride N). S: rows of x (the sum of the counts).
// A slice of experts [e0, e1) of a plan runs alone with offsets + e0, tile_first + e0, E = e1 - e0
// and w[j] + e0 (its tiles numbered from tile_first[e0]): the other experts' rows are left as they
// are, and each row's output has the bits the whole plan's launch gives it (the same tile, the
// same k order).
// bf16 needs K a multiple of 8 and 16-byte aligned x and weights (`aligned`: the weights are) for
// its vector loads, or it loads element by element.
struct ExpertGemmOutputs {
  const void* const* w[2] = {nullptr, nullptr};
  float* y[2] = {nullptr, nullptr};
  int n_out = 1;
};
void expert_gemm(const void* x, int64_t S, int64_t K, const int32_t* offsets,
                 const int32_t* tile_first, int64_t E, int64_t row_tile,
                 const ExpertGemmOutputs& out, int64_t N, bool bf16, bool aligned, void* stream);

}  // namespace strata::ops::cuda
