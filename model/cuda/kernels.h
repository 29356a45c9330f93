// Host launchers of the GPU decoder-layer forward's kernels (model/cuda/kernels.cu). No CUDA
// header here: streams are passed as void* (cudaStream_t), pointers are device pointers.
// Every launcher is asynchronous on `stream`. Layouts are row-major; shapes are in the comments.
// These are the plain kernels the forward needs to be correct; the tuned ones of ops/cuda/
// replace them one by one.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace strata::gpu {

// dst[n] = src[n] converted from a floating dtype (F32, F16, BF16) to fp32 / bf16 bits.
void convert_to_f32(const void* src, DType dtype, float* dst, int64_t n, void* stream);
void convert_to_bf16(const void* src, DType dtype, uint16_t* dst, int64_t n, void* stream);
// A DeepSeek FP8-block weight w8 F8_E4M3 [out, in] with scale_inv [ceil(out/block),
// ceil(in/block)] (F32, F16 or BF16) decompressed as the CPU does (io/source_weights.h): one fp32
// product rounded to bf16; dst is bf16 bits (to_bf16) or the fp32 value of that bf16.
void dequant_fp8_block(const uint8_t* w8, int64_t out, int64_t in, int64_t block,
                       const void* scale_inv, DType scale_dtype, void* dst, bool to_bf16,
                       void* stream);
// y[n] = bf16(x[n]) (nearest, ties to even; NaN stays NaN).
void cast_bf16(const float* x, uint16_t* y, int64_t n, void* stream);
void bf16_to_f32(const uint16_t* x, float* y, int64_t n, void* stream);
// x[n] = float(bf16(x[n])), in place.
void round_bf16(float* x, int64_t n, void* stream);

// y[rows, dim] = x / sqrt(mean(x^2) + eps) * w (w may be null); sums in fp64 as ops::rms_norm.
void rms_norm(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y,
              void* stream);
// x[n] += y[n]
void add(float* x, const float* y, int64_t n, void* stream);
// y[rows, cols] += b[cols]
void add_bias(float* y, int64_t rows, int64_t cols, const float* b, void* stream);
// h[n] = silu(g) * u
void swiglu(const float* g, const float* u, int64_t n, float* h, void* stream);
// y[T, H] += sigmoid(g[T]) * s[T, H]
void add_sigmoid_gated(float* y, const float* s, const float* g, int64_t T, int64_t H,
                       void* stream);

// Half-split (or interleaved) RoPE in place on x[T, nH, stride], columns [offset, offset+rot).
// Angle fp32(inv_freq[i]) * fp32(pos[t]); cos/sin in fp64 times attention_factor, as ops::rope.
void rope(float* x, int64_t T, int64_t n_heads, int64_t stride, int64_t offset, int64_t rot_dim,
          const int64_t* pos, const float* inv_freq, double attention_factor, bool interleaved,
          void* stream);

// Causal attention per sequence over a ragged batch: q[T, nH, dq] (row stride q_stride),
// k[T, nKV, dq], v[T, nKV, dv] (strides k_stride, v_stride), out[T, nH, dv]. Token t belongs to
// sequence seq_of[t], which spans [seq_start[seq], t]. Softmax in fp32.
void attention(const float* q, int64_t q_stride, const float* k, int64_t k_stride, const float* v,
               int64_t v_stride, int64_t T, int64_t n_heads, int64_t n_kv, int64_t dq, int64_t dv,
               float scale, const int64_t* seq_start_of_token, float* out, void* stream);

// Attention through GEMMs, for `batch` (sequence, head) pairs of one length L:
//   S_i = Q_i K_i^T            (gemm_batched_qk: S_i [L, L] fp32; Q_i [L, dq] row stride
//                              q_stride, K_i [L, dq] row stride k_stride)
//   P_i = causal_softmax(scale * S_i), in place (rows: fp32 max, exp, fp64 sum, as
//                              ops::attention_causal; zeros above the diagonal)
//   O_i = P_i V_i              (gemm_batched_pv: O_i [L, dv] row stride o_stride)
// Pointer arrays are device arrays of `batch` pointers. bf16 is unused here: fp32 inputs with
// TF32 tensor cores (fast) or pedantic fp32 (exact products), per `tf32`.
void gemm_batched_qk(void* handle, const float* const* q, int64_t q_stride, const float* const* k,
                     int64_t k_stride, float* const* s, int64_t L, int64_t dq, int64_t batch,
                     bool tf32);
void causal_softmax(float* s, int64_t batch, int64_t L, float scale, void* stream);
void gemm_batched_pv(void* handle, const float* const* p, const float* const* v, int64_t v_stride,
                     float* const* o, int64_t o_stride, int64_t L, int64_t dv, int64_t batch,
                     bool tf32);

// Observers: slots are fp32 amaxes kept as their bit patterns (uint32), so that atomicMax on
// them is max on |x| with NaN winning (NaN's bits exceed infinity's).
void amax(const float* x, int64_t n, uint32_t* slot, void* stream);
// Row r of x[rows, cols] goes to slots[row_slot[r * per_row + j]] for each j < per_row (a
// token's hidden state to each of its K experts' slots: per_row = K, row_slot = chosen).
void amax_rows(const float* x, int64_t rows, int64_t cols, const int32_t* row_slot, uint32_t* slots,
               void* stream, int64_t per_row = 1);

// Routing, one thread per token: p = softmax(logits[t, :E]) (sigmoid-free, Qwen MoE); the top
// K of p (ties: lower expert first), weight = p (/ sum of the top K when norm). chosen[T, K],
// weight[T, K]; counts[E] += tokens per expert (zero it first).
void route_softmax_topk(const float* logits, int64_t T, int64_t E, int64_t K, bool norm,
                        int32_t* chosen, float* weight, int32_t* counts, void* stream);
// Sigmoid routing with group-limited selection (DeepSeek-V3 noaux_tc, model/deepseek_v3.h
// SigmoidMoe::route), one thread per token; bias fp32 [E] or null; counts[E] += tokens per expert.
void route_sigmoid_grouped(const float* logits, int64_t T, int64_t E, int64_t K, const float* bias,
                           int64_t n_group, int64_t topk_group, bool norm, float scaling,
                           int32_t* chosen, float* weight, int32_t* counts, void* stream);
// dst[r, 0:cols] = src[r, 0:cols] for r < rows; strides in elements.
void copy_cols(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
               int64_t cols, void* stream);
// MLA's per-head K and V: k[T, nH, dn + dr] = [kv[t, h, 0:dn] | kr[t, 0:dr]] (kr shared by the
// heads), v[T, nH, dv] = kv[t, h, dn:dn + dv], from kv[T, nH, dn + dv] and kr[T, dr].
void mla_kv(const float* kv, const float* kr, int64_t T, int64_t n_heads, int64_t dn, int64_t dr,
            int64_t dv, float* k, float* v, void* stream);
// Slots s = t*K + j are grouped by expert: pos[s] = offsets[e] + (order of arrival); cursor[E]
// zeroed first. row_expert[pos] = e.
void moe_scatter(const int32_t* chosen, int64_t slots, const int32_t* offsets, int32_t* cursor,
                 int32_t* pos, int32_t* row_expert, void* stream);
// xg[pos[s], :] = n[s / K, :] for every slot; n[T, H], xg[T*K, H]; fp32 or bf16 bits.
void moe_gather(const float* n, int64_t T, int64_t H, int64_t K, const int32_t* pos, float* xg,
                void* stream);
void moe_gather(const uint16_t* n, int64_t T, int64_t H, int64_t K, const int32_t* pos,
                uint16_t* xg, void* stream);
// y[t, :] = sum_j weight[t, j] * outg[pos[t*K + j], :] in slot order.
void moe_combine(const float* outg, const int32_t* pos, const float* weight, int64_t T, int64_t K,
                 int64_t H, float* y, void* stream);

// cuBLAS: y[M, N] = x[M, K] . w[N, K]^T with fp32 accumulation and output. bf16: x and w are
// bf16 bits; else both fp32 (pedantic fp32, no TF32). `handle` is from gemm_handle().
void* gemm_handle_create(void* stream);
void gemm_handle_destroy(void* handle);
void gemm(void* handle, const void* x, const void* w, float* y, int64_t M, int64_t N, int64_t K,
          bool bf16);

}  // namespace strata::gpu
