// What the CUDA op tests (tests/ops/cuda/*_test.cpp, binary cuda_ops_test, label gpu) share: a
// fixture that skips itself without a device and owns a stream and a memory budget, copies
// between host vectors and device buffers, and random inputs.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/device.h"
#include "core/gpu_memory.h"

namespace strata::ops::cuda {

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    stream_ = std::make_unique<gpu::Stream>();
  }
  const gpu::Stream& s() const { return *stream_; }
  void* st() const { return stream_->handle(); }

  // Uninitialised device memory of `bytes` (at least 4).
  gpu::DeviceBuffer buffer(uint64_t bytes) {
    return gpu::DeviceBuffer(budget_, std::max<uint64_t>(bytes, 4), "test buffer");
  }
  template <typename T>
  gpu::DeviceBuffer up(const std::vector<T>& v) {
    gpu::DeviceBuffer b = buffer(v.size() * sizeof(T));
    if (!v.empty()) s().copy_to_device(b.data(), v.data(), v.size() * sizeof(T));
    return b;
  }
  // The first n values of b, after everything queued so far.
  template <typename T>
  std::vector<T> down(const gpu::DeviceBuffer& b, size_t n) {
    std::vector<T> v(n);
    if (n > 0) s().copy_to_host(v.data(), b.data(), n * sizeof(T));
    s().synchronize();
    return v;
  }

  std::vector<float> normal(size_t n, float sd = 1.0f) {
    std::normal_distribution<float> d(0.0f, sd);
    std::vector<float> v(n);
    for (float& x : v)
      x = d(rng_);
    return v;
  }
  std::vector<float> uniform(size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (float& x : v)
      x = d(rng_);
    return v;
  }
  std::mt19937& rng() { return rng_; }
  gpu::DeviceBudget& budget() { return budget_; }

 private:
  gpu::DeviceBudget budget_{8ull << 30};
  std::unique_ptr<gpu::Stream> stream_;
  std::mt19937 rng_{12345};
};

inline uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// A ragged batch: sequences of these lengths concatenated; bounds [n + 1] and each token's
// sequence start.
struct Ragged {
  std::vector<int64_t> bounds, start;
  int64_t T = 0;
  explicit Ragged(const std::vector<int64_t>& lengths) {
    bounds.push_back(0);
    for (int64_t len : lengths) {
      for (int64_t i = 0; i < len; ++i)
        start.push_back(bounds.back());
      bounds.push_back(bounds.back() + len);
    }
    T = bounds.back();
  }
  int64_t seqs() const { return static_cast<int64_t>(bounds.size()) - 1; }
};

}  // namespace strata::ops::cuda
