// Does compute-sanitizer's initcheck see what cuBLAS writes? A probe, not a benchmark: run it
// under `compute-sanitizer --tool initcheck` and count the reports per step (docs/CUDA.md).
//
// Each step allocates fresh device memory (never memset), writes it one way, then reads all of it
// with a kernel of ours (k_sum), or with a cuBLAS GEMM that takes it as input:
//   kernel   our kernel writes y, k_sum reads it                  (control: 0 reports expected)
//   bf16     ops::cuda::gemm bf16 x bf16 -> fp32 writes y [M, N], k_sum reads it
//   fp32     ops::cuda::gemm fp32 pedantic writes y, k_sum reads it
//   chain    a bf16 GEMM writes y, converted to fp32 by our kernel, a fp32 GEMM reads that
//            (the forward's order: GEMM output -> our kernel -> next GEMM)
//   memset   cudaMemset(y), then the bf16 GEMM writes y, k_sum reads it
// Every written element is read exactly once by k_sum: a report in a `k_sum` of a GEMM step means
// initcheck did not record the GEMM's stores (the GEMM writes all M x N outputs with beta 0).
//
//   sanitizer_probe [--m 256] [--n 1024] [--k 1024]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ops/cuda/gemm.h"

namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

__global__ void k_fill_bf16(uint16_t* p, int64_t n, uint32_t seed) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const uint32_t h = (static_cast<uint32_t>(i) * 2654435761u) ^ seed;
  const __nv_bfloat16 b = __float2bfloat16((static_cast<float>(h & 0xFFFF) / 65536.0f) - 0.5f);
  std::memcpy(p + i, &b, 2);
}

__global__ void k_fill_f32(float* p, int64_t n, float scale) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) p[i] = scale * static_cast<float>(i % 97);
}

__global__ void k_copy_f32(const float* x, float* y, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = x[i];
}

__global__ void k_sum(const float* p, int64_t n, float* out) {
  float s = 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    s += p[i];
  atomicAdd(out, s);
}

unsigned blocks(int64_t n) {
  return static_cast<unsigned>((n + 255) / 256);
}

template <class T>
T* fresh(int64_t n) {
  void* p = nullptr;
  ck(cudaMalloc(&p, static_cast<size_t>(n) * sizeof(T)), "cudaMalloc");
  return static_cast<T*>(p);
}

float read_sum(const float* y, int64_t n) {
  float* out = fresh<float>(1);
  ck(cudaMemset(out, 0, sizeof(float)), "memset");
  k_sum<<<64, 256>>>(y, n, out);
  float h = 0.0f;
  ck(cudaMemcpy(&h, out, sizeof(float), cudaMemcpyDeviceToHost), "copy");
  ck(cudaFree(out), "free");
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t M = 256, N = 1024, K = 1024;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int64_t v = std::strtoll(argv[i + 1], nullptr, 10);
    if (a == "--m")
      M = v;
    else if (a == "--n")
      N = v;
    else if (a == "--k")
      K = v;
    else {
      std::fprintf(stderr, "unknown option %s (--m, --n, --k)\n", a.c_str());
      return 2;
    }
  }
  namespace oc = strata::ops::cuda;
  void* h = oc::gemm_handle_create(nullptr);
  uint16_t* xb = fresh<uint16_t>(M * K);
  uint16_t* wb = fresh<uint16_t>(N * K);
  k_fill_bf16<<<blocks(M * K), 256>>>(xb, M * K, 1u);
  k_fill_bf16<<<blocks(N * K), 256>>>(wb, N * K, 2u);
  float* xf = fresh<float>(M * K);
  float* wf = fresh<float>(N * K);
  k_fill_f32<<<blocks(M * K), 256>>>(xf, M * K, 1e-3f);
  k_fill_f32<<<blocks(N * K), 256>>>(wf, N * K, 1e-3f);

  auto step = [&](const char* name, float* y) {
    ck(cudaDeviceSynchronize(), name);
    std::printf("step %-7s sum %.6g\n", name, read_sum(y, M * N));
    std::fflush(stdout);
    ck(cudaDeviceSynchronize(), name);
  };
  {
    float* y = fresh<float>(M * N);
    k_fill_f32<<<blocks(M * N), 256>>>(y, M * N, 1.0f);
    step("kernel", y);
  }
  {
    float* y = fresh<float>(M * N);
    oc::gemm(h, xb, wb, y, M, N, K, true);
    step("bf16", y);
  }
  {
    float* y = fresh<float>(M * N);
    oc::gemm(h, xf, wf, y, M, N, K, false);
    step("fp32", y);
  }
  {
    // y1 [M, N] from a bf16 GEMM; copied by our kernel; then y2 [M, N] = y1c . w2^T with
    // w2 [N, N] fp32: the fp32 GEMM reads what our kernel wrote.
    float* y1 = fresh<float>(M * N);
    oc::gemm(h, xb, wb, y1, M, N, K, true);
    float* y1c = fresh<float>(M * N);
    k_copy_f32<<<blocks(M * N), 256>>>(y1, y1c, M * N);
    float* w2 = fresh<float>(N * N);
    k_fill_f32<<<blocks(N * N), 256>>>(w2, N * N, 1e-4f);
    float* y2 = fresh<float>(M * N);
    oc::gemm(h, y1c, w2, y2, M, N, N, false);
    step("chain", y2);
  }
  {
    float* y = fresh<float>(M * N);
    ck(cudaMemset(y, 0, static_cast<size_t>(M * N) * sizeof(float)), "memset");
    oc::gemm(h, xb, wb, y, M, N, K, true);
    step("memset", y);
  }
  oc::gemm_handle_destroy(h);
  std::printf("done\n");
  return 0;
}
