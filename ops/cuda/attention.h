// Causal attention on the device (ops/cuda/attention.cu); conventions: ops/cuda/convert.h. The
// GPU forward runs attention as batched GEMMs (ops/cuda/gemm.h) around causal_softmax;
// `attention` is its one-kernel path, taken when the score buffers do not fit the memory cap
// (and forced by a test option).
#pragma once

#include <cstdint>

namespace strata::ops::cuda {

// The rounding of the backend's bf16_ops inside attention (ops.h ops::Bf16Attention, the same
// values): none, torch's fused sdpa kernels, or transformers' eager attention.
enum class AttentionRounding { kNone = 0, kFlash = 1, kEager = 2 };

// ops::attention_causal over a ragged batch: q[T, nH, dq] (row stride q_stride), k[T, nKV, dq],
// v[T, nKV, dv] (strides k_stride, v_stride), out[T, nH, dv]. Token t's sequence starts at
// seq_start_of_token[t] (int64 [T]), and it attends to [seq_start, t]. Query head h reads kv head
// h / (nH / nKV). One warp per (token, head), online softmax in fp32 (no [T, T] buffer).
// dv <= 256 (else strata::Error). gpt-oss's variants as ops::attention_causal: `window` > 0
// keeps the keys j with t - j < window; `sinks` (device fp32 [nH], or null) joins one logit per
// head to the softmax (its max and its denominator). DeepSeek-V3.2's: `keep` (device [T,
// keep_words], or null) keeps only the keys whose bit (their position in the sequence) is set
// in the query's row. `rounding`: as ops::attention_causal's (the scores computed again for each
// pass over the keys that it needs: the max first, so that every exponential is rounded against
// the row's final max).
void attention(const float* q, int64_t q_stride, const float* k, int64_t k_stride, const float* v,
               int64_t v_stride, int64_t T, int64_t n_heads, int64_t n_kv, int64_t dq, int64_t dv,
               float scale, const int64_t* seq_start_of_token, float* out, void* stream,
               int64_t window = 0, const float* sinks = nullptr, const uint32_t* keep = nullptr,
               int64_t keep_words = 0, AttentionRounding rounding = AttentionRounding::kNone);

// s [batch, L, L] in place, row i of each matrix: p_j = exp(scale * s_j - max) / sum for j <= i
// (max in fp32, exp in fp32, sum in fp64, as ops::softmax on the row's first i + 1 scaled
// values), p_j = 0 for j > i. With `window` > 0 only j > i - window count (the others are 0);
// with `sinks` (device fp32 [n_heads], matrix b being head b % n_heads) exp(sink - max) joins the
// sum and the sink the max. With `keep_rows` (device [batch] pointers, or null), row i of matrix
// b counts only the j whose bit is set in keep_rows[b][i * keep_words, ...] (the others are 0).
// `rounding` (then P·V's output is to be rounded by the caller): kFlash rounds exp(s - max) to
// bf16 and multiplies it by the fp32 1 / sum; kEager rounds the score, its product with the
// scale, its difference with the max and the probability, as ops::attention_causal's.
void causal_softmax(float* s, int64_t batch, int64_t L, float scale, void* stream,
                    int64_t window = 0, const float* sinks = nullptr, int64_t n_heads = 1,
                    const uint32_t* const* keep_rows = nullptr, int64_t keep_words = 0,
                    AttentionRounding rounding = AttentionRounding::kNone);

// MLA's per-head K and V: k[T, nH, dn + dr] = [kv[t, h, 0:dn] | kr[t, 0:dr]] (kr shared by the
// heads), v[T, nH, dv] = kv[t, h, dn:dn + dv], from kv[T, nH, dn + dv] and kr[T, dr]. Exact.
void mla_kv(const float* kv, const float* kr, int64_t T, int64_t n_heads, int64_t dn, int64_t dr,
            int64_t dv, float* k, float* v, void* stream);

}  // namespace strata::ops::cuda
