// The operations a decoder-layer forward needs, on the CPU, in fp32.
//
// Conventions: activations are row-major fp32 buffers with one row per token; shapes are given
// in comments as [rows, cols]. Weights are Tensors in the checkpoint's layout W[out, in] and any
// floating dtype (bf16 usually); they are upcast exactly to fp32. Every reduction runs in a fixed
// order, so results do not depend on the thread count (docs/DESIGN.md "Numerics of the forward").
//
// The CUDA backend will implement the same declarations behind host launchers.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace strata::ops {

// W as a dense fp32 [out, in] buffer (exact upcast).
std::vector<float> weight_f32(const Tensor& w);

// Threads of the CPU kernels (OpenMP regions and OpenBLAS), e.g. cores / ranks per host when
// ranks share a host (docs/SCALEOUT.md). n >= 1.
void set_threads(int n);

// y[m, n] = x[m, k] · W[n, k]^T (+ bias[n]); fp32 accumulate. W given as fp32 [n, k].
void linear(const float* x, int64_t m, int64_t k, const float* w, int64_t n, float* y,
            const float* bias = nullptr);

// Rounds every element to the nearest bf16 value (ties to even), in place.
void round_bf16(float* x, int64_t n);

// Per row of x[rows, dim]: x / sqrt(mean(x^2) + eps) * w, computed in fp32.
void rms_norm(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y);

// Per row of x[rows, dim]: softmax in place.
void softmax(float* x, int64_t rows, int64_t dim);

inline float silu(float z) { return z / (1.0f + std::exp(-z)); }
inline float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

// h[m, i] = silu(gate[m, i]) * up[m, i]
void swiglu(const float* gate, const float* up, int64_t count, float* h);

// Rotary embedding frequencies f_i (i < rot_dim/2) for a RoPE variant.
struct RopeParams {
  enum class Kind { kDefault, kLinear, kLlama3, kYarn };
  Kind kind = Kind::kDefault;
  double theta = 10000.0;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position = 0.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double attention_factor = 1.0;  // multiplies cos and sin (YaRN)
};
std::vector<double> rope_inv_freq(const RopeParams& p, int64_t rot_dim);

// Rotates x[n_tokens, n_heads, head_stride] in place: for each head, the rot_dim values starting
// at column `offset` are rotated by angle pos[t] * f_i. Half-split pairs (i, i + rot_dim/2), or
// interleaved pairs (2i, 2i+1).
void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_stride, int64_t offset,
          int64_t rot_dim, const int64_t* pos, const std::vector<double>& inv_freq,
          double attention_factor, bool interleaved);

// Causal attention for one sequence. q[T, nH, dq], k[T, nKV, dq], v[T, nKV, dv] with row strides
// given per tensor (elements between consecutive tokens); out[T, nH, dv] contiguous.
// Query head h reads kv head h / (nH / nKV). Softmax in fp32.
void attention_causal(const float* q, int64_t q_stride, const float* k, int64_t k_stride,
                      const float* v, int64_t v_stride, int64_t T, int64_t n_heads,
                      int64_t n_kv_heads, int64_t dq, int64_t dv, float scale, float* out);

// Causal depthwise convolution over one sequence, no bias: x[T, C] with row stride x_stride,
// w[C, K] (the checkpoint's [C, 1, K]), y[T, C] contiguous:
//   y[t, c] = sum_{j < K} w[c, j] * x[t - (K - 1) + j, c],   x[s, c] = 0 for s < 0,
// so w[c, K-1] multiplies the current token.
void causal_conv1d(const float* x, int64_t x_stride, int64_t T, int64_t C, const float* w,
                   int64_t K, float* y);

// Per row of x[rows, dim], in place: x / sqrt(sum(x^2) + eps) (fla's l2norm: eps inside the root).
void l2_norm(float* x, int64_t rows, int64_t dim, float eps);

// The gated delta rule with a decay per key channel (Kimi Delta Attention; Gated DeltaNet is the
// case of one decay per head) over one sequence, in fp32, from a zero state. Per head h, with
// state S[dk, dv]:
//   S <- diag(exp(g_t)) S;   S <- S + beta_t k_t (v_t - S^T k_t)^T;   o_t = S^T q_t.
// q, k, g: [T, nH, dk]; v: [T, nH, dv]; beta: [T, nH]; out: [T, nH, dv]. g is the log decay
// (<= 0); q and k arrive normalised and q scaled, as the caller wants them.
void gated_delta_rule(const float* q, const float* k, const float* v, const float* g,
                      const float* beta, int64_t T, int64_t n_heads, int64_t dk, int64_t dv,
                      float* out);

// Top-k of one row: indices of the k largest values, largest first; ties go to the lower index.
std::vector<int32_t> top_k(const float* x, int64_t n, int64_t k);

// Element-wise max |x| over n values (NaN propagates as NaN).
float amax(const float* x, int64_t n);

}  // namespace strata::ops
