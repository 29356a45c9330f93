// The decoder-layer operations of ops/ops.h on a CUDA device, behind host launchers
// (docs/CUDA.md). Including this header needs no CUDA header; it is only compiled into builds
// with the CUDA backend (STRATA_WITH_CUDA), library strata_ops_cuda.
//
// Conventions (the device-resident forward):
// - Every pointer is device memory unless its comment says "host".
// - Activations are row-major fp32 buffers with one row per token, [rows, cols], as on the CPU.
// - Weights stay in the checkpoint's layout W[out, in] as bf16 (uint16_t bit patterns); norm
//   weights, biases, router correction biases and RoPE frequencies are fp32 device arrays.
// - A ragged batch of n_seq sequences packed back to back along the token axis is described by
//   seq_offsets[n_seq + 1] (int64, device; sequence s is tokens [seq_offsets[s],
//   seq_offsets[s+1])) and per-token positions pos[T] (int64, device).
// - Observers: amax_* accumulate max|x| into a slot of a device fp32 array (initialise it with
//   fill_zero); read the array back once per layer with copy_to_host.
// - Launchers queue work on the Stream and return without waiting, except where noted. Bad
//   arguments (negative sizes, k > n, ...) throw strata::Error; CUDA errors throw on the launch
//   or at the next Stream::synchronize.
#pragma once

#include <cstdint>

#include "core/device.h"

namespace strata::ops::cuda {

using strata::cuda::Stream;

// ---- dtype conversions ------------------------------------------------------------------------

// y[i] = bf16(x[i]), round to nearest even (NaN stays NaN). x fp32 [n], y bf16 bits [n].
void f32_to_bf16(const float* x, int64_t n, uint16_t* y, Stream& stream);
// y[i] = x[i] exactly. x bf16 bits [n], y fp32 [n].
void bf16_to_f32(const uint16_t* x, int64_t n, float* y, Stream& stream);
// Rounds every element of x fp32 [n] to the nearest bf16 value in place (ops::round_bf16).
void round_bf16(float* x, int64_t n, Stream& stream);

// ---- GEMMs (cuBLASLt: bf16 inputs, fp32 accumulate, fp32 output) ------------------------------

// y[m, n] = x[m, k] · W[n, k]^T (+ bias[n]). x bf16 [m, k], W bf16 [n, k], bias fp32 [n] or null,
// y fp32 [m, n]. The products are exact in fp32 and accumulated in fp32 (order chosen by
// cuBLASLt); y is not rounded to bf16 (call round_bf16 where the model rounds).
void linear_bf16(const uint16_t* x, int64_t m, int64_t k, const uint16_t* w, int64_t n, float* y,
                 Stream& stream, const float* bias = nullptr);

// Same with an fp32 activation x[m, k]: x is first rounded to bf16 (round to nearest even, in
// the stream's scratch), which is the only rounding of the input. The CPU ops::linear keeps x in
// fp32; both use the exact bf16 weight values.
void linear(const float* x, int64_t m, int64_t k, const uint16_t* w, int64_t n, float* y,
            Stream& stream, const float* bias = nullptr);

// Grouped GEMM for routed experts: the rows of x fp32 [R, k] are sorted by group (moe_sort);
// group g owns rows [offsets[g], offsets[g+1]) and multiplies them by its own weight w[g]
// (bf16 [n, k]): y[r, :] = x[r, :] · w[g]^T for r in group g. offsets is a HOST array
// [n_groups + 1] (offsets[0] = 0, offsets[n_groups] = R), w a HOST array of n_groups device
// pointers (null allowed for an empty group). Empty groups launch nothing. y fp32 [R, n].
void linear_grouped(const float* x, const int64_t* offsets, int64_t n_groups, int64_t k,
                    const uint16_t* const* w, int64_t n, float* y, Stream& stream);

// How many GEMMs (since the process started) ran on the plain fallback kernel because cuBLASLt
// offered no algorithm for their shape or alignment (diagnostics and tests).
int64_t gemm_fallback_count();

// ---- element-wise and row-wise ----------------------------------------------------------------

// Per row of x fp32 [rows, dim]: y = x / sqrt(mean(x^2) + eps) * w (w fp32 [dim], or null for
// no weight). Sum of squares in fp64 as on the CPU. y may equal x.
void rms_norm(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y,
              Stream& stream);

// Per row of x fp32 [rows, dim]: softmax in place (max subtracted, exp in fp32, sum in fp64).
void softmax(float* x, int64_t rows, int64_t dim, Stream& stream);

// h[i] = silu(gate[i]) * up[i] over `count` elements (fp32). h may equal gate or up.
void swiglu(const float* gate, const float* up, int64_t count, float* h, Stream& stream);

// y[i] += x[i] over n fp32 elements (residual adds, shared experts).
void add(float* y, const float* x, int64_t n, Stream& stream);

// y[r, c] += sigmoid(gate_logit[r]) * x[r, c] for y, x fp32 [rows, cols], gate_logit fp32 [rows]
// (Qwen MoE's gated shared expert).
void add_sigmoid_gated(float* y, const float* x, const float* gate_logit, int64_t rows,
                       int64_t cols, Stream& stream);

// dst[r, 0:cols] = src[r, 0:cols] for r < rows, with row strides in elements (splitting fused
// projections, e.g. MLA's [c | k_rope]).
void copy_cols(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
               int64_t cols, Stream& stream);

// ---- RoPE and attention -----------------------------------------------------------------------

// ops::rope on the device: rotates x fp32 [n_tokens, n_heads, head_stride] in place; per head
// the rot_dim values starting at column `offset`, by angle fl32(inv_freq[i]) * fl32(pos[t]).
// inv_freq fp32 [rot_dim/2] (ops::rope_inv_freq's values rounded to fp32, copied once per
// model), pos int64 [n_tokens]. Half-split pairs (i, i + rot_dim/2) or interleaved (2i, 2i+1).
void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_stride, int64_t offset,
          int64_t rot_dim, const int64_t* pos, const float* inv_freq, double attention_factor,
          bool interleaved, Stream& stream);

// Causal attention over a ragged batch: each token attends to the tokens of its own sequence up
// to and including itself. q[T, nH, dq], k[T, nKV, dq], v[T, nKV, dv] with row strides in
// elements (between consecutive tokens); out fp32 [T, nH, dv] contiguous. Query head h reads kv
// head h / (nH / nKV) (GQA; MLA passes nKV = nH, dq = d_nope + d_rope, dv = v_head_dim). Scores
// and softmax in fp32 (online softmax, no [T, T] buffer). dq, dv <= 512. seq_offsets int64
// [n_seq + 1] (device), T = seq_offsets[n_seq].
void attention_causal(const float* q, int64_t q_stride, const float* k, int64_t k_stride,
                      const float* v, int64_t v_stride, const int64_t* seq_offsets, int64_t n_seq,
                      int64_t T, int64_t n_heads, int64_t n_kv_heads, int64_t dq, int64_t dv,
                      float scale, float* out, Stream& stream);

// ---- routing and expert dispatch --------------------------------------------------------------

// Top-k of each row of x fp32 [rows, n]: idx int32 [rows, k], largest first, ties to the lower
// index (ops::top_k). A row with NaNs gets its non-NaN values first; the remaining picks (when
// fewer than k values are not NaN) are unspecified in-range indices.
void top_k(const float* x, int64_t rows, int64_t n, int64_t k, int32_t* idx, Stream& stream);

// Softmax routing (Qwen MoE, Mixtral): p = softmax_fp32(logits[t]); chosen = top-k of p;
// weight = p_chosen, divided by their sum when `renormalize`. logits fp32 [T, E] (left
// unchanged), chosen int32 [T, K], weight fp32 [T, K].
void route_softmax_topk(const float* logits, int64_t T, int64_t E, int64_t K, bool renormalize,
                        int32_t* chosen, float* weight, Stream& stream);

// Sigmoid routing with group-limited selection (DeepSeek-V3 noaux_tc): s = sigmoid(logits);
// choice = s + bias (bias fp32 [E], or null for none); groups of E / n_group experts scored by
// the sum of their top-2 choices (top-1 when a group has one expert); keep the topk_group best
// groups; chosen = top-K of choice among kept experts; weight = s_chosen (/ (Σ s_chosen + 1e-20)
// when `renormalize`) * scaling. Ties to the lower index throughout. n_group <= 64.
void route_sigmoid_grouped(const float* logits, int64_t T, int64_t E, int64_t K, const float* bias,
                           int64_t n_group, int64_t topk_group, bool renormalize, float scaling,
                           int32_t* chosen, float* weight, Stream& stream);

// Sorts the T*K routing slots (slot s = t*K + j, expert chosen[s]) by expert, stably (slots of
// one expert in increasing s, as the CPU moe_dispatch_combine visits them):
//   sorted_slot int32 [T*K]   row r of the expert-sorted buffer holds slot sorted_slot[r]
//   row_of_slot int32 [T*K]   inverse permutation
//   offsets     int64 [E + 1] device, expert e owns sorted rows [offsets[e], offsets[e+1])
//   offsets_host int64 [E + 1] HOST copy of offsets (for linear_grouped); this SYNCHRONIZES.
// Throws strata::Error if a chosen id is outside [0, E).
void moe_sort(const int32_t* chosen, int64_t T, int64_t K, int64_t E, int32_t* sorted_slot,
              int32_t* row_of_slot, int64_t* offsets, int64_t* offsets_host, Stream& stream);

// out[r, :] = x[sorted_slot[r] / K, :] for r < R = T*K. x fp32 [T, H], out fp32 [R, H].
void moe_gather(const float* x, int64_t H, const int32_t* sorted_slot, int64_t R, int64_t K,
                float* out, Stream& stream);

// y[t, c] = Σ_j weight[t, j] * expert_out[row_of_slot[t*K + j], c], summed in j order.
// expert_out fp32 [T*K, H] (expert-sorted rows), weight fp32 [T, K], y fp32 [T, H].
void moe_combine(const float* expert_out, const int32_t* row_of_slot, const float* weight,
                 int64_t T, int64_t K, int64_t H, float* y, Stream& stream);

// ---- observers (amax) -------------------------------------------------------------------------

// *out = max(*out, max |x[i]|) over n fp32 elements; NaN anywhere makes *out NaN (ops::amax).
// out is one fp32 slot of a device array, initialised to 0 by the caller. Exact.
void amax(const float* x, int64_t n, float* out, Stream& stream);

// Same over a bf16 buffer (weights): x bf16 bits [n].
void amax_bf16(const uint16_t* x, int64_t n, float* out, Stream& stream);

// Per routed expert: out[g] = max(out[g], max |x[r, c]|) over the rows r of group g, i.e.
// rows [offsets[g], offsets[g+1]) of x fp32 [R, cols] (expert-sorted, moe_sort's device
// offsets int64 [n_groups + 1]). Groups with no rows leave out[g] unchanged.
void amax_grouped(const float* x, int64_t cols, const int64_t* offsets, int64_t n_groups,
                  float* out, Stream& stream);

}  // namespace strata::ops::cuda
