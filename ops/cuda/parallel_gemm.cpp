#include "ops/cuda/parallel_gemm.h"

#include <cuda_runtime.h>

#include "core/error.h"
#include "ops/cuda/gemm.h"

namespace strata::ops::cuda {

ParallelGemms::ParallelGemms(int threads, bool bf16) : bf16_(bf16) {
  STRATA_CHECK(cudaGetDevice(&device_) == cudaSuccess, "CUDA: cannot read the current device");
  if (threads <= 1) return;
  workers_.resize(static_cast<size_t>(threads));
  for (Worker& w : workers_) {
    w.stream = std::make_unique<gpu::Stream>();
    w.blas = gemm_handle_create(w.stream->handle());
    w.done = std::make_unique<gpu::Event>();
  }
  for (size_t i = 0; i < workers_.size(); ++i)
    workers_[i].thread = std::thread([this, i]() { work(i); });
}

ParallelGemms::~ParallelGemms() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  go_.notify_all();
  for (Worker& w : workers_) {
    if (w.thread.joinable()) w.thread.join();
    w.stream->synchronize();
    gemm_handle_destroy(w.blas);
  }
}

void ParallelGemms::work(size_t index) {
  cudaSetDevice(device_);
  Worker& me = workers_[index];
  uint64_t seen = 0;
  for (;;) {
    const std::vector<GemmJob>* jobs = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      go_.wait(lock, [&]() { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      jobs = jobs_;
    }
    std::exception_ptr err;
    try {
      start_.wait(*me.stream);
      for (size_t j = index; j < jobs->size(); j += workers_.size()) {
        const GemmJob& g = (*jobs)[j];
        gemm(me.blas, g.x, g.w, g.y, g.M, g.N, g.K, bf16_);
      }
      me.done->record(*me.stream);
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (err && !error_) error_ = err;
      ++done_count_;
    }
    finished_.notify_one();
  }
}

void ParallelGemms::run(const gpu::Stream& main, void* main_blas,
                        const std::vector<GemmJob>& jobs) {
  if (workers_.empty() || jobs.size() <= 1) {
    for (const GemmJob& g : jobs)
      gemm(main_blas, g.x, g.w, g.y, g.M, g.N, g.K, bf16_);
    return;
  }
  start_.record(main);
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_ = &jobs;
    done_count_ = 0;
    ++generation_;
  }
  go_.notify_all();
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> lock(mu_);
    finished_.wait(lock, [&]() { return done_count_ == workers_.size(); });
    err = error_;
    error_ = nullptr;
  }
  if (err) std::rethrow_exception(err);
  for (Worker& w : workers_)
    w.done->wait(main);
}

}  // namespace strata::ops::cuda
