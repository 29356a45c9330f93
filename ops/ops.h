// The operations a decoder-layer forward needs, on the CPU, in fp32.
//
// Conventions: activations are row-major fp32 buffers with one row per token; shapes are given
// in comments as [rows, cols]. Weights are Tensors in the checkpoint's layout W[out, in] and any
// floating dtype (bf16 usually); they are upcast exactly to fp32. Every reduction runs in a fixed
// order, so results do not depend on the thread count (docs/DESIGN.md "Numerics of the forward").
//
// The CPU backend (ops/cpu_backend.h) is built on these ops. Their CUDA implementations are the
// launchers of ops/cuda/ (namespace strata::ops::cuda, one header per op family, CUDA builds
// only; docs/CUDA.md), on which the CUDA backend (ops/cuda/cuda_backend.h) is built: the same
// math on device buffers, queued on a stream, over a ragged batch of sequences where the CPU op
// takes one sequence. Each op below names its CUDA counterpart; the counterpart's comment says
// how closely it matches (bit for bit, or within a few ulp where nvcc fuses multiply-adds and
// CUDA's expf differs from the host's).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/tensor.h"

namespace strata::ops {

// W as a dense fp32 [out, in] buffer (exact upcast).
std::vector<float> weight_f32(const Tensor& w);

// Threads of the CPU kernels (OpenMP regions and OpenBLAS), e.g. cores / ranks per host when
// ranks share a host (docs/SCALEOUT.md). n >= 1.
void set_threads(int n);
// The threads the CPU kernels use (OpenMP's), as set_threads left them.
int threads();

// y[m, n] = x[m, k] · W[n, k]^T (+ bias[n]); fp32 accumulate. W given as fp32 [n, k].
// CUDA: ops/cuda/gemm.h gemm (bf16 or fp32 inputs), then elementwise.h add_bias.
void linear(const float* x, int64_t m, int64_t k, const float* w, int64_t n, float* y,
            const float* bias = nullptr);

// Rounds every element to the nearest bf16 value (ties to even), in place; NaN becomes the
// canonical 0x7FC0 (core/dtype.h f32_to_bf16). CUDA: ops/cuda/convert.h round_bf16, the same for
// every non-NaN value (a NaN keeps its sign and top payload bits there).
void round_bf16(float* x, int64_t n);
// x rounded to the nearest bf16 value, as a float (round_bf16 of one value).
inline float bf16(float x) {
  const uint32_t b = static_cast<uint32_t>(f32_to_bf16_fast(x)) << 16;
  float y;
  std::memcpy(&y, &b, 4);
  return y;
}

// Per row of x[rows, dim]: x / sqrt(mean(x^2) + eps) * w (w may be null): the sum of squares in
// fp64, the rest in fp32. With w_offset != 0 the weight is used as (w_offset + w) in fp32
// (Qwen3-Next's zero-centred norms store w - 1 and multiply by 1 + w). CUDA: ops/cuda/norm.h
// rms_norm.
void rms_norm(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y,
              float w_offset = 0.0f);

// Per row of x[rows, dim]: (x - mean) / sqrt(var + eps) * w + b (torch.nn.LayerNorm, biased
// variance; w and b may be null): mean and variance in fp64, the rest in fp32. y may equal x.
// CUDA: ops/cuda/norm.h layer_norm.
void layer_norm(const float* x, int64_t rows, int64_t dim, const float* w, const float* b,
                float eps, float* y);

// Per row of x[rows, dim]: softmax in place (max subtracted, exp in fp32, sum in fp64). CUDA:
// inside ops/cuda/routing.h route_softmax_topk and attention.h causal_softmax.
void softmax(float* x, int64_t rows, int64_t dim);

inline float silu(float z) {
  return z / (1.0f + std::exp(-z));
}
inline float sigmoid(float z) {
  return 1.0f / (1.0f + std::exp(-z));
}

// h[m, i] = silu(gate[m, i]) * up[m, i]; with `bf16`, as a bf16 PyTorch model's
// act_fn(gate) * up: silu(gate) rounded to bf16, then the product. CUDA: ops/cuda/elementwise.h
// swiglu (sigmoid: sigmoid_inplace, mul_sigmoid, add_sigmoid_gated).
void swiglu(const float* gate, const float* up, int64_t count, float* h, bool bf16 = false);

// gpt-oss's clamped SwiGLU on gate and up interleaved in gu[count, 2] (gate_i = gu[2i],
// up_i = gu[2i + 1]):
//   g = min(gate_i, limit),  u = clamp(up_i, -limit, limit),  h[i] = (u + 1) * g * sigmoid(alpha *
//   g)
// (gate is not clamped from below). With `bf16`, as transformers' GptOssExperts in bf16: g · alpha,
// its sigmoid, g times that, u + 1 and the final product each rounded to bf16 (the clamps are
// exact). CUDA: ops/cuda/elementwise.h swiglu_clamped.
void swiglu_clamped(const float* gu, int64_t count, float alpha, float limit, float* h,
                    bool bf16 = false);

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
  bool truncate = true;           // YaRN: floor lo and ceil hi (transformers' `truncate`)
};
std::vector<double> rope_inv_freq(const RopeParams& p, int64_t rot_dim);

// Rotates x[n_tokens, n_heads, head_stride] in place: for each head, the rot_dim values starting
// at column `offset` are rotated by angle pos[t] * f_i (fp32(f_i) * fp32(pos[t]), cos and sin in
// fp32, then times attention_factor). Half-split pairs (i, i + rot_dim/2), or interleaved pairs
// (2i, 2i+1). With `bf16`, as transformers' apply_rotary_pos_emb in bf16: cos and sin rounded to
// bf16, then x0·cos, x1·sin and their difference (x1·cos, x0·sin and their sum) each rounded.
// CUDA: ops/cuda/rope.h rope (f_i passed as fp32).
void rope(float* x, int64_t n_tokens, int64_t n_heads, int64_t head_stride, int64_t offset,
          int64_t rot_dim, const int64_t* pos, const std::vector<double>& inv_freq,
          double attention_factor, bool interleaved, bool bf16 = false);

// Causal attention for one sequence. q[T, nH, dq], k[T, nKV, dq], v[T, nKV, dv] with row strides
// given per tensor (elements between consecutive tokens); out[T, nH, dv] contiguous.
// Query head h reads kv head h / (nH / nKV). Softmax in fp32 (sum in fp64). CUDA:
// ops/cuda/attention.h attention (a ragged batch, online softmax), or gemm.h's batched GEMMs
// around attention.h causal_softmax.
// gpt-oss's variants: `window` > 0 lets query i see only keys j with i - j < window (a sliding
// window of `window` tokens, its own included); `sinks` [n_heads] (or null) adds one logit per
// head to the softmax's denominator (and to its max), with no value:
//   p_ij = exp(s_ij - m) / (sum_j' exp(s_ij' - m) + exp(sink_h - m)),  m = max(s_i., sink_h).
// DeepSeek-V3.2's sparse attention: with `keep` (or null), query i sees only the causal keys j
// whose bit is set in its row keep[i, 0:keep_words] (bit j % 32 of word j / 32), as
// ops::index_topk writes them; the others leave the softmax (a masked score, exp 0).
// `rounding`: how a bf16 PyTorch model rounds inside attention (Backend::bf16_ops):
//   kNone   fp32 throughout (above);
//   kFlash  torch's fused sdpa kernels (the CPU's flash kernel, as flash attention on a GPU):
//           s = (q·k)·scale and the softmax in fp32; e_j = exp(s_j - max) rounded to bf16 before
//           it multiplies v_j (fp32 sums); out = Σ_j e_j v_j / Σ_j exp(s_j - max) (the unrounded
//           sum), rounded;
//   kEager  transformers' eager attention (gpt-oss): q·k rounded, times scale rounded, minus the
//           row's max (the sink's logit included) rounded; the softmax over the row and the sink
//           in fp32, each probability rounded; out = Σ_j p_j v_j, rounded.
enum class Bf16Attention { kNone, kFlash, kEager };
void attention_causal(const float* q, int64_t q_stride, const float* k, int64_t k_stride,
                      const float* v, int64_t v_stride, int64_t T, int64_t n_heads,
                      int64_t n_kv_heads, int64_t dq, int64_t dv, float scale, float* out,
                      const float* sinks = nullptr, int64_t window = 0,
                      const uint32_t* keep = nullptr, int64_t keep_words = 0,
                      Bf16Attention rounding = Bf16Attention::kNone);

// DeepSeek-V3.2's lightning indexer over one sequence: q[T, nH, d] and k[T, d] (after their
// RoPE), head weights w[T, nH]; for query i and key j <= i the index score
//   s_ij = sum_h (w[i, h] * w_scale) * relu((q[i, h, :] . k[j, :]) * scale)
// (each product rounded to fp32, heads summed in order)
// and the keys i attends to: the top_k keys of row i by s (ties to the lower j, as ops::top_k),
// or every j <= i when i + 1 <= top_k. Writes the bit mask keep[T, words] (bit j % 32 of word
// j / 32 of row i; bits beyond i clear); words >= ceil(T / 32), top_k >= 1. CUDA:
// ops/cuda/indexer.h index_topk.
void index_topk(const float* q, const float* k, const float* w, int64_t T, int64_t n_heads,
                int64_t d, float scale, float w_scale, int64_t top_k, uint32_t* keep,
                int64_t words);

// Causal depthwise convolution over one sequence, no bias: x[T, C] with row stride x_stride,
// w[C, K] (the checkpoint's [C, 1, K]), y[T, C] contiguous:
//   y[t, c] = sum_{j < K} w[c, j] * x[t - (K - 1) + j, c],   x[s, c] = 0 for s < 0,
// so w[c, K-1] multiplies the current token. CUDA: ops/cuda/kda.h kda_conv_silu (then silu).
void causal_conv1d(const float* x, int64_t x_stride, int64_t T, int64_t C, const float* w,
                   int64_t K, float* y);

// Per row of x[rows, dim], in place: x / sqrt(sum(x^2) + eps) (fla's l2norm: eps inside the root),
// the sum in fp64. CUDA: ops/cuda/norm.h l2_norm_scale.
void l2_norm(float* x, int64_t rows, int64_t dim, float eps);

// The gated delta rule with a decay per key channel (Kimi Delta Attention) or, when
// `head_decay`, one decay per head (Gated DeltaNet: Qwen3-Next, Qwen3.5) over one sequence, in
// fp32, from a zero state. Per head h, with state S[dk, dv]:
//   S <- diag(exp(g_t)) S;   S <- S + beta_t k_t (v_t - S^T k_t)^T;   o_t = S^T q_t.
// q, k: [T, nH, dk]; g: [T, nH, dk], or [T, nH] when head_decay; v: [T, nH, dv]; beta: [T, nH];
// out: [T, nH, dv]. g is the log decay (<= 0); q and k arrive normalised and q scaled, as the
// caller wants them. CUDA: ops/cuda/kda.h gated_delta_rule.
void gated_delta_rule(const float* q, const float* k, const float* v, const float* g,
                      const float* beta, int64_t T, int64_t n_heads, int64_t dk, int64_t dv,
                      float* out, bool head_decay = false);
// Its scalar reference, the recurrence as written above, one element at a time: gated_delta_rule
// gives its values bit for bit (its loops vectorize).
void gated_delta_rule_reference(const float* q, const float* k, const float* v, const float* g,
                                const float* beta, int64_t T, int64_t n_heads, int64_t dk,
                                int64_t dv, float* out, bool head_decay = false);

// Top-k of one row: indices of the k largest values, largest first; ties go to the lower index.
// (Rows with NaN: unspecified.) CUDA: inside ops/cuda/routing.h, the same order.
std::vector<int32_t> top_k(const float* x, int64_t n, int64_t k);

// Element-wise max |x| over n values (NaN propagates as the canonical NaN). CUDA:
// ops/cuda/amax.h amax, amax_rows (the same value; a NaN's own bits).
float amax(const float* x, int64_t n);

// Per-column statistics of x[rows, cols] (the affine KV cache's calibration, calib/max_calib.h
// "Affine KV cache"): sum[c] = the sum of x[r, c] over the rows in double, in row order; max[c],
// min[c] the largest and smallest x[r, c] (a NaN sticks). rows == 0: 0, -inf, +inf. CUDA:
// ops/cuda/amax.h column_stats (the same values, bit for bit).
void column_stats(const float* x, int64_t rows, int64_t cols, double* sum, float* max, float* min);

}  // namespace strata::ops
