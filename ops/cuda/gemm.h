// cuBLAS GEMMs of the forward (ops/cuda/gemm.cu); conventions: ops/cuda/convert.h. The routed
// experts' GEMMs, every expert in one launch: ops/cuda/expert_gemm.h.
#pragma once

#include <cstdint>

namespace strata::ops::cuda {

// Loads cuBLAS (libcublas.so.<major>, once a process; the first handle does too): a thread that
// sets up the GPU ahead of its use calls it so that the load overlaps other work. Throws
// strata::Error naming the library when it cannot be loaded.
void gemm_library_load();

// A cuBLAS handle whose work goes to `stream`; destroy it with gemm_handle_destroy (null: no-op).
void* gemm_handle_create(void* stream);
void gemm_handle_destroy(void* handle);

// ops::linear without bias on the device: y[M, N] = x[M, K] . w[N, K]^T with fp32 accumulation
// and output. bf16: x and w are bf16 bits (the products are exact in fp32); else both fp32 with
// pedantic fp32 (no TF32), which matches ops::linear up to summation order (cuBLAS's, which may
// depend on the shape).
void gemm(void* handle, const void* x, const void* w, float* y, int64_t M, int64_t N, int64_t K,
          bool bf16);

// Attention through GEMMs (ops::attention_causal for `batch` (sequence, head) pairs of one
// length L, in three steps):
//   S_i = Q_i K_i^T            (gemm_batched_qk: S_i [L, L] fp32; Q_i [L, dq] row stride
//                              q_stride, K_i [L, dq] row stride k_stride)
//   P_i = causal_softmax(scale * S_i), in place (ops/cuda/attention.h)
//   O_i = P_i V_i              (gemm_batched_pv: O_i [L, dv] row stride o_stride)
// Pointer arrays are device arrays of `batch` pointers. Inputs are fp32, with TF32 tensor cores
// (fast) or pedantic fp32 (exact products), per `tf32`.
void gemm_batched_qk(void* handle, const float* const* q, int64_t q_stride, const float* const* k,
                     int64_t k_stride, float* const* s, int64_t L, int64_t dq, int64_t batch,
                     bool tf32);
void gemm_batched_pv(void* handle, const float* const* p, const float* const* v, int64_t v_stride,
                     float* const* o, int64_t o_stride, int64_t L, int64_t dv, int64_t batch,
                     bool tf32);

}  // namespace strata::ops::cuda
