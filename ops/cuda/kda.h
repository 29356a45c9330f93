// Kimi Delta Attention's kernels (ops/cuda/kda.cu), for the GPU forward's KDA layers (the CPU
// forward is model/kimi_linear.cpp); conventions: ops/cuda/convert.h. Its L2 norm is
// ops/cuda/norm.h l2_norm_scale, its sigmoids ops/cuda/elementwise.h.
//
// Precision against the CPU ops they mirror (ops/ops.h), all fp32 with the CPU's order of
// operations: per element the same formula, but CUDA's expf/logf are within 2 ulp of the host's
// libm and nvcc fuses multiply-adds, so results differ from the CPU by a few ulp per operation.
// The gated delta rule keeps its state in fp32 and sums each dot product over the key channels in
// the CPU's order (0..dk-1), so its error is the fused multiply-adds' and expf's, carried
// through the decaying state (tests/ops/cuda/kda_test.cpp bounds it).
#pragma once

#include <cstdint>

namespace strata::ops::cuda {

// Causal depthwise convolution with SiLU over a ragged batch, no bias: x[T, C], w[C, K] (the
// checkpoint's [C, 1, K]), y[T, C] (not x). Token t's sequence starts at seq_start[t]
// (chunk-relative); nothing before it is read:
//   y[t, c] = silu(sum_{j < K, s >= seq_start[t]} w[c, j] * x[s, c]),  s = t - (K - 1) + j.
// (ops::causal_conv1d per sequence, then ops::silu; `bf16`: the convolution and the SiLU each
// rounded to bf16, the backend's bf16_ops.)
void kda_conv_silu(const float* x, int64_t T, int64_t C, const float* w, int64_t K,
                   const int64_t* seq_start, float* y, void* stream, bool bf16 = false);

// KDA's forget gate, in place on g[T, nH, d] (f_b_proj's output):
//   g = -exp(a_log[h]) * softplus(g + dt_bias[h * d + i]),  softplus(z) = z for z > 20.
void kda_forget_gate(float* g, int64_t T, int64_t n_heads, int64_t d, const float* a_log,
                     const float* dt_bias, void* stream);

// The gated delta rule (ops::gated_delta_rule) over a ragged batch: sequence s spans tokens
// [seq_bounds[s], seq_bounds[s + 1]) (device array of n_seqs + 1 entries) and starts from a zero
// state. q, k [T, nH, dk], v [T, nH, dv], beta [T, nH] (already sigmoid'd), out [T, nH, dv]; the
// log decay g [T, nH, dk], or [T, nH] (one per head, Gated DeltaNet) when head_decay.
// Per (sequence, head) a block; its thread j keeps column j of the state S[dk, dv] in registers:
//   S[:, j] *= exp(g_t);  u_j = beta_t (v_t[j] - S[:, j] . k_t);  S[:, j] += k_t u_j;
//   out_t[j] = S[:, j] . q_t.
// dk and dv at most 256.
void gated_delta_rule(const float* q, const float* k, const float* v, const float* g,
                      const float* beta, const int64_t* seq_bounds, int64_t n_seqs, int64_t n_heads,
                      int64_t dk, int64_t dv, float* out, void* stream, bool head_decay = false);

}  // namespace strata::ops::cuda
