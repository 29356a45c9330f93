// Routed-expert GEMMs on the GPU, the way the MoE block of model/cuda/gpu_forward.cpp runs them:
// E experts, expert e with rows[e] routed rows, y_e[rows_e, N] = x_e[rows_e, K] . w_e[N, K]^T,
// bf16 inputs, fp32 accumulation. Prints, per rows-per-expert setting, the time of:
//   loop     one cublasGemmEx per expert (ops::cuda::gemm, fp32 output), issued by one host thread
//   Nthr     the same calls issued by N host threads, each with its own stream and handle
//            (ops::cuda::ParallelGemms: what the forward does), for N = 2, 4, 8
//   grouped  one cublasGemmGroupedBatchedEx over all experts, fp32 output, and with bf16 output
//   one      a single GEMM of the same total rows against one expert's weight (the ceiling)
// and how many output values of 4 threads differ from `loop` (bit for bit; 0 expected).
//
//   expert_gemm_bench [--experts 128] [--n 768] [--k 2048] [--rows 64,290,1024,16384] [--reps 20]
//
// Rows are uneven around the mean (a multinomial-like spread, fixed seed) like real routing.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/gpu_memory.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/parallel_gemm.h"

namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

__global__ void k_fill(uint16_t* p, int64_t n, uint32_t seed) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  const float v = (static_cast<float>(h & 0xFFFF) / 65536.0f - 0.5f) * 0.1f;
  const __nv_bfloat16 b = __float2bfloat16(v);
  std::memcpy(p + i, &b, 2);
}

void fill(uint16_t* p, int64_t n, uint32_t seed) {
  k_fill<<<static_cast<unsigned>((n + 255) / 256), 256>>>(p, n, seed);
}

double ms_of(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  ck(cudaEventElapsedTime(&ms, a, b), "elapsed");
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  int E = 128, N = 768, K = 2048, reps = 20;
  std::vector<int> rows_list = {64, 290, 1024, 16384};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--experts") {
      E = std::stoi(v);
    } else if (a == "--n") {
      N = std::stoi(v);
    } else if (a == "--k") {
      K = std::stoi(v);
    } else if (a == "--reps") {
      reps = std::stoi(v);
    } else if (a == "--rows") {
      rows_list.clear();
      size_t at = 0;
      while (at < v.size()) {
        const size_t c = v.find(',', at);
        rows_list.push_back(std::stoi(v.substr(at, c - at)));
        at = c == std::string::npos ? v.size() : c + 1;
      }
    } else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  strata::gpu::Stream main_stream;
  cudaStream_t s = static_cast<cudaStream_t>(main_stream.handle());
  void* handle = strata::ops::cuda::gemm_handle_create(s);
  const int thread_counts[3] = {2, 4, 8};
  std::vector<std::unique_ptr<strata::ops::cuda::ParallelGemms>> pools;
  for (int t : thread_counts)
    pools.push_back(std::make_unique<strata::ops::cuda::ParallelGemms>(t, true));
  cublasHandle_t h = static_cast<cublasHandle_t>(handle);
  cudaEvent_t e0, e1;
  ck(cudaEventCreate(&e0), "event");
  ck(cudaEventCreate(&e1), "event");
  uint16_t* w = nullptr;
  ck(cudaMalloc(&w, static_cast<size_t>(E) * N * K * 2), "weights");
  fill(w, static_cast<int64_t>(E) * N * K, 7);
  std::printf("experts %d, y[rows, %d] = x[rows, %d] . w^T, bf16 in, fp32 accumulate\n", E, N, K);
  std::printf("%10s %10s %12s %12s %10s %10s %10s %12s %12s %12s %10s\n", "rows/exp", "GEMMs",
              "loop us", "loop host us", "2thr us", "4thr us", "8thr us", "grouped us",
              "grp bf16 us", "one us", "differ");
  for (const int mean : rows_list) {
    std::mt19937 rng(20261203u + static_cast<uint32_t>(mean));
    std::uniform_real_distribution<double> u(0.5, 1.5);
    std::vector<int> rows(static_cast<size_t>(E));
    int64_t total = 0;
    for (int e = 0; e < E; ++e) {
      rows[e] = std::max(0, static_cast<int>(mean * u(rng)));
      total += rows[e];
    }
    std::vector<int64_t> off(static_cast<size_t>(E) + 1, 0);
    for (int e = 0; e < E; ++e)
      off[e + 1] = off[e] + rows[e];
    uint16_t *x = nullptr, *y16 = nullptr;
    float *y = nullptr, *yg = nullptr;
    ck(cudaMalloc(&x, static_cast<size_t>(total) * K * 2), "x");
    ck(cudaMalloc(&y, static_cast<size_t>(total) * N * 4), "y");
    ck(cudaMalloc(&yg, static_cast<size_t>(total) * N * 4), "yg");
    ck(cudaMalloc(&y16, static_cast<size_t>(total) * N * 2), "y16");
    fill(x, total * K, 11);
    ck(cudaDeviceSynchronize(), "fill");
    // loop
    auto loop = [&]() {
      for (int e = 0; e < E; ++e)
        strata::ops::cuda::gemm(handle, x + off[e] * K, w + static_cast<int64_t>(e) * N * K,
                                y + off[e] * N, rows[e], N, K, true);
    };
    loop();
    ck(cudaStreamSynchronize(s), "warm");
    double host = 0;
    ck(cudaEventRecord(e0, s), "rec");
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      loop();
      host +=
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    }
    ck(cudaEventRecord(e1, s), "rec");
    ck(cudaEventSynchronize(e1), "sync");
    const double loop_us = ms_of(e0, e1) * 1000 / reps;
    std::vector<strata::ops::cuda::GemmJob> jobs;
    for (int e = 0; e < E; ++e) {
      if (rows[e] > 0)
        jobs.push_back(
            {x + off[e] * K, w + static_cast<int64_t>(e) * N * K, y + off[e] * N, rows[e], N, K});
    }
    double thr_us[3];
    for (int p = 0; p < 3; ++p) {
      pools[p]->run(main_stream, handle, jobs);
      ck(cudaStreamSynchronize(s), "warm");
      ck(cudaEventRecord(e0, s), "rec");
      for (int r = 0; r < reps; ++r)
        pools[p]->run(main_stream, handle, jobs);
      ck(cudaEventRecord(e1, s), "rec");
      ck(cudaEventSynchronize(e1), "sync");
      thr_us[p] = ms_of(e0, e1) * 1000 / reps;
    }
    // grouped: one group per expert (their row counts differ)
    std::vector<cublasOperation_t> ta(E, CUBLAS_OP_T), tb(E, CUBLAS_OP_N);
    std::vector<int> m(E), n(E), k(E), lda(E, K), ldb(E, K), ldc(E, N), gs(E, 1);
    std::vector<float> alpha(E, 1.0f), beta(E, 0.0f);
    std::vector<const void*> A(E), B(E);
    std::vector<void*> C(E), C16(E);
    int groups = 0;
    for (int e = 0; e < E; ++e) {
      if (rows[e] == 0) continue;
      m[groups] = N;
      n[groups] = rows[e];
      k[groups] = K;
      A[groups] = w + static_cast<int64_t>(e) * N * K;
      B[groups] = x + off[e] * K;
      C[groups] = yg + off[e] * N;
      C16[groups] = y16 + off[e] * N;
      ++groups;
    }
    void** dptr = nullptr;
    ck(cudaMalloc(&dptr, 4 * sizeof(void*) * E), "ptrs");
    ck(cudaMemcpy(dptr, A.data(), sizeof(void*) * E, cudaMemcpyHostToDevice), "A");
    ck(cudaMemcpy(dptr + E, B.data(), sizeof(void*) * E, cudaMemcpyHostToDevice), "B");
    ck(cudaMemcpy(dptr + 2 * E, C.data(), sizeof(void*) * E, cudaMemcpyHostToDevice), "C");
    ck(cudaMemcpy(dptr + 3 * E, C16.data(), sizeof(void*) * E, cudaMemcpyHostToDevice), "C16");
    auto grouped = [&](bool out16) {
      return cublasGemmGroupedBatchedEx(
          h, ta.data(), tb.data(), m.data(), n.data(), k.data(), alpha.data(),
          reinterpret_cast<const void* const*>(dptr), CUDA_R_16BF, lda.data(),
          reinterpret_cast<const void* const*>(dptr + E), CUDA_R_16BF, ldb.data(), beta.data(),
          out16 ? dptr + 3 * E : dptr + 2 * E, out16 ? CUDA_R_16BF : CUDA_R_32F, ldc.data(), groups,
          gs.data(), CUBLAS_COMPUTE_32F);
    };
    double grouped_us[2] = {-1, -1};
    for (int o = 0; o < 2; ++o) {
      const cublasStatus_t st = grouped(o == 1);
      if (st != CUBLAS_STATUS_SUCCESS) {
        std::printf("  grouped (%s output): status %d\n", o ? "bf16" : "fp32",
                    static_cast<int>(st));
        continue;
      }
      ck(cudaStreamSynchronize(s), "grouped");
      ck(cudaEventRecord(e0, s), "rec");
      for (int r = 0; r < reps; ++r)
        grouped(o == 1);
      ck(cudaEventRecord(e1, s), "rec");
      ck(cudaEventSynchronize(e1), "sync");
      grouped_us[o] = ms_of(e0, e1) * 1000 / reps;
    }
    // Bits: the loop's outputs against 4 threads' (into yg).
    int64_t differ = 0;
    {
      loop();
      std::vector<strata::ops::cuda::GemmJob> into_yg = jobs;
      for (int e = 0, j = 0; e < E; ++e) {
        if (rows[e] > 0) into_yg[j++].y = yg + off[e] * N;
      }
      pools[1]->run(main_stream, handle, into_yg);
      ck(cudaStreamSynchronize(s), "cmp");
      std::vector<float> a(static_cast<size_t>(total) * N), b(a.size());
      ck(cudaMemcpy(a.data(), y, a.size() * 4, cudaMemcpyDeviceToHost), "a");
      ck(cudaMemcpy(b.data(), yg, b.size() * 4, cudaMemcpyDeviceToHost), "b");
      differ = 0;
      for (size_t i = 0; i < a.size(); ++i)
        differ += std::memcmp(&a[i], &b[i], 4) != 0;
    }
    // one GEMM of all rows against expert 0's weight
    strata::ops::cuda::gemm(handle, x, w, y, total, N, K, true);
    ck(cudaStreamSynchronize(s), "one");
    ck(cudaEventRecord(e0, s), "rec");
    for (int r = 0; r < reps; ++r)
      strata::ops::cuda::gemm(handle, x, w, y, total, N, K, true);
    ck(cudaEventRecord(e1, s), "rec");
    ck(cudaEventSynchronize(e1), "sync");
    const double one_us = ms_of(e0, e1) * 1000 / reps;
    const double flop = 2.0 * static_cast<double>(total) * N * K;
    std::printf("%10d %10d %12.1f %12.1f %10.1f %10.1f %10.1f %12.1f %12.1f %12.1f %10lld\n", mean,
                groups, loop_us, host / reps, thr_us[0], thr_us[1], thr_us[2], grouped_us[0],
                grouped_us[1], one_us, static_cast<long long>(differ));
    std::printf("%10s %10s %12.1f %12s %10.1f %10.1f %10.1f %12.1f %12.1f %12.1f   TFLOP/s\n", "",
                "", flop / loop_us / 1e6, "", flop / thr_us[0] / 1e6, flop / thr_us[1] / 1e6,
                flop / thr_us[2] / 1e6, grouped_us[0] > 0 ? flop / grouped_us[0] / 1e6 : 0.0,
                grouped_us[1] > 0 ? flop / grouped_us[1] / 1e6 : 0.0, flop / one_us / 1e6);
    cudaFree(dptr);
    cudaFree(x);
    cudaFree(y);
    cudaFree(yg);
    cudaFree(y16);
  }
  pools.clear();
  strata::ops::cuda::gemm_handle_destroy(handle);
  cudaFree(w);
  return 0;
}
