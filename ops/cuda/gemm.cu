// cuBLAS GEMMs of the forward (host launchers: ops/cuda/gemm.h): the projections, and the
// batched attention GEMMs around ops/cuda/attention.h's causal_softmax. cuBLAS is loaded on first
// use (dlopen), not when strata starts: its libraries are over half a gigabyte, and mapping and
// relocating them took 0.44 s of a cold process start on the development machine, on every run,
// a CPU run too. A GPU run loads it on a helper thread from its first moment (engine/gpu_runner.h
// gpu_library_preload).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <string>

#include "core/device.h"
#include "core/error.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/launch.cuh"

namespace strata::ops::cuda {

using launch::st;

namespace {

// The entry points strata calls, by their exported names (cublas_v2.h maps cublasCreate and the
// stream calls to their _v2 symbols).
struct Cublas {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasGetStream_v2) get_stream;
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t);
  cublasStatus_t (*gemm_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                    int, const void*, const void* const[], cudaDataType, int,
                                    const void* const[], cudaDataType, int, const void*,
                                    void* const[], cudaDataType, int, int, cublasComputeType_t,
                                    cublasGemmAlgo_t);
};

const Cublas& cublas() {
  static const Cublas lib = [] {
    const std::string name = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* why = dlerror();
      fail("cuBLAS: cannot load ", name, " (", why ? why : "not found",
           "); install the CUDA toolkit's cuBLAS ", CUBLAS_VER_MAJOR,
           " or add its library folder to LD_LIBRARY_PATH");
    }
    auto sym = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, symbol));
      STRATA_CHECK(fn != nullptr, "cuBLAS: ", name, " has no ", symbol,
                   "; install the CUDA toolkit's cuBLAS ", CUBLAS_VER_MAJOR);
    };
    Cublas c{};
    sym(c.create, "cublasCreate_v2");
    sym(c.destroy, "cublasDestroy_v2");
    sym(c.set_stream, "cublasSetStream_v2");
    sym(c.get_stream, "cublasGetStream_v2");
    sym(c.gemm_ex, "cublasGemmEx");
    sym(c.gemm_batched_ex, "cublasGemmBatchedEx");
    return c;  // the library stays loaded for the process
  }();
  return lib;
}

}  // namespace

void gemm_library_load() {
  cublas();
}

void gemm_batched_qk(void* handle, const float* const* q, int64_t q_stride, const float* const* k,
                     int64_t k_stride, float* const* s, int64_t L, int64_t dq, int64_t batch,
                     bool tf32) {
  if (batch == 0 || L == 0) return;
  // Row-major S[L, L] = Q[L, dq] K[L, dq]^T: column-major S^T = K^T' ... as gemm(): A = K (op T,
  // lda k_stride), B = Q (op N, ldb q_stride), C = S (ldc L).
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t r = cublas().gemm_batched_ex(
      static_cast<cublasHandle_t>(handle), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(L),
      static_cast<int>(L), static_cast<int>(dq), &alpha, reinterpret_cast<const void* const*>(k),
      CUDA_R_32F, static_cast<int>(k_stride), reinterpret_cast<const void* const*>(q), CUDA_R_32F,
      static_cast<int>(q_stride), &beta, reinterpret_cast<void* const*>(s), CUDA_R_32F,
      static_cast<int>(L), static_cast<int>(batch),
      tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT);
  STRATA_CHECK(r == CUBLAS_STATUS_SUCCESS, "cuBLAS: attention scores (", batch, " x [", L, ", ", dq,
               "]) failed (status ", static_cast<int>(r), ")");
}

void gemm_batched_pv(void* handle, const float* const* p, const float* const* v, int64_t v_stride,
                     float* const* o, int64_t o_stride, int64_t L, int64_t dv, int64_t batch,
                     bool tf32) {
  if (batch == 0 || L == 0) return;
  // Row-major O[L, dv] = P[L, L] V[L, dv]: column-major O^T = V^T P^T: A = V (op N, lda
  // v_stride), B = P (op N, ldb L), C = O (ldc o_stride).
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t r = cublas().gemm_batched_ex(
      static_cast<cublasHandle_t>(handle), CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(dv),
      static_cast<int>(L), static_cast<int>(L), &alpha, reinterpret_cast<const void* const*>(v),
      CUDA_R_32F, static_cast<int>(v_stride), reinterpret_cast<const void* const*>(p), CUDA_R_32F,
      static_cast<int>(L), &beta, reinterpret_cast<void* const*>(o), CUDA_R_32F,
      static_cast<int>(o_stride), static_cast<int>(batch),
      tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT);
  STRATA_CHECK(r == CUBLAS_STATUS_SUCCESS, "cuBLAS: attention output (", batch, " x [", L, ", ", dv,
               "]) failed (status ", static_cast<int>(r), ")");
}

void* gemm_handle_create(void* stream) {
  cublasHandle_t h;
  STRATA_CHECK(cublas().create(&h) == CUBLAS_STATUS_SUCCESS, "cuBLAS: cannot create a handle");
  cublas().set_stream(h, st(stream));
  return h;
}
void gemm_handle_destroy(void* handle) {
  if (handle) cublas().destroy(static_cast<cublasHandle_t>(handle));
}

void gemm(void* handle, const void* x, const void* w, float* y, int64_t M, int64_t N, int64_t K,
          bool bf16) {
  if (M == 0 || N == 0) return;
  if (bf16 && strata::preset_gemm_outputs()) {  // initcheck runs (core/device.h)
    cudaStream_t stream = nullptr;
    cublas().get_stream(static_cast<cublasHandle_t>(handle), &stream);
    STRATA_CHECK(
        cudaMemsetAsync(y, 0xFF, static_cast<size_t>(M * N) * sizeof(float), stream) == cudaSuccess,
        "CUDA: presetting a GEMM output failed");
  }
  // Row-major y[M, N] = x[M, K] w[N, K]^T is column-major y^T[N, M] = w^T... : with w read as
  // column-major [K, N] (ld K) transposed, and x as column-major [K, M] (ld K).
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasComputeType_t c = bf16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_PEDANTIC;
  const cublasStatus_t r = cublas().gemm_ex(
      static_cast<cublasHandle_t>(handle), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N),
      static_cast<int>(M), static_cast<int>(K), &alpha, w, t, static_cast<int>(K), x, t,
      static_cast<int>(K), &beta, y, CUDA_R_32F, static_cast<int>(N), c, CUBLAS_GEMM_DEFAULT);
  STRATA_CHECK(r == CUBLAS_STATUS_SUCCESS, "cuBLAS: gemm [", M, ", ", K, "] x [", N, ", ", K,
               "]^T failed (status ", static_cast<int>(r), ")");
}

}  // namespace strata::ops::cuda
