// Many small GEMMs issued from several host threads (the routed experts of a MoE layer: one GEMM
// per expert, a few hundred rows each when the GPU memory cap makes chunks small).
//
// Why: one host thread issues cuBLAS calls at about 14 us each on the H200 machine
// (bench/expert_gemm_bench.cu: 128 expert GEMMs of ~290 rows take 1.8 ms to issue, while one GEMM
// over all their rows runs in 0.15 ms), so the device idles between them; and such a GEMM fills a
// fraction of the SMs. With N threads, each owning a stream and a cuBLAS handle, N calls are
// issued at once and the device runs them side by side. cuBLAS has no grouped GEMM with bf16
// inputs and fp32 outputs (cublasGemmGroupedBatchedEx answers NOT_SUPPORTED there).
//
// Every GEMM is the same cuBLAS call with the same arguments as on one stream, so the results do
// not depend on the thread count (engine.gpu_mode.qwen3_moe.gemm_threads checks it).
//
//   ParallelGemms pg(threads, bf16);             // threads <= 1: issued by the caller, in order
//   pg.run(stream, blas, jobs);                  // after the work queued on `stream` so far;
//                                                // `stream` then waits for every job
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/gpu_memory.h"

namespace strata::ops::cuda {

// y[M, N] = x[M, K] . w[N, K]^T (ops/cuda/gemm.h gemm).
struct GemmJob {
  const void* x;
  const void* w;
  float* y;
  int64_t M, N, K;
};

class ParallelGemms {
 public:
  ParallelGemms(int threads, bool bf16);
  ~ParallelGemms();
  ParallelGemms(const ParallelGemms&) = delete;
  ParallelGemms& operator=(const ParallelGemms&) = delete;
  int threads() const { return static_cast<int>(workers_.size()); }
  // Issues `jobs` (worker i takes jobs i, i + N, ...) after the work queued on `main`, then makes
  // `main` wait for them. Returns once they are queued. Without workers, issues them on
  // `main_blas` (a handle on `main`) in order.
  void run(const gpu::Stream& main, void* main_blas, const std::vector<GemmJob>& jobs);

 private:
  struct Worker {
    std::unique_ptr<gpu::Stream> stream;
    void* blas = nullptr;
    std::unique_ptr<gpu::Event> done;
    std::thread thread;
  };
  void work(size_t index);

  bool bf16_;
  int device_ = 0;
  std::vector<Worker> workers_;
  gpu::Event start_;
  std::mutex mu_;
  std::condition_variable go_, finished_;
  const std::vector<GemmJob>* jobs_ = nullptr;
  uint64_t generation_ = 0;
  size_t done_count_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace strata::ops::cuda
