#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>

#include "core/device.h"
#include "core/error.h"

namespace strata {

bool cuda_compiled() {
  return true;
}

namespace {
std::atomic<double> probe_seconds{0.0};
}  // namespace

int cuda_device_count() {
  const auto t0 = std::chrono::steady_clock::now();
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" / "no device" error
    n = 0;
  }
  double none = 0.0;  // the first call's time is kept
  probe_seconds.compare_exchange_strong(
      none, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return n;
}

double cuda_probe_seconds() {
  return probe_seconds.load();
}

std::string cuda_device_description(int i) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s (sm_%d%d, %.1f GiB)", prop.name, prop.major, prop.minor,
                static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace strata

namespace strata::cuda {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA error in ", what, ": ", cudaGetErrorString(e));
}

}  // namespace

struct Stream::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
};

Stream::Stream(int device, bool high_priority) : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  check(cudaSetDevice(device), "cudaSetDevice");
  int least = 0, greatest = 0;
  if (high_priority)
    check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "stream priorities");
  check(cudaStreamCreateWithPriority(&impl_->stream, cudaStreamNonBlocking,
                                     high_priority ? greatest : 0),
        "cudaStreamCreate");
}

Stream::~Stream() {
  cudaStreamSynchronize(impl_->stream);
  cudaFree(impl_->scratch);
  cudaStreamDestroy(impl_->stream);
}

void Stream::synchronize() {
  check(cudaStreamSynchronize(impl_->stream), "a kernel on the stream");
}

int Stream::device() const {
  return impl_->device;
}

void* Stream::native() const {
  return impl_->stream;
}

void* Stream::scratch(size_t bytes) {
  if (bytes <= impl_->scratch_bytes) return impl_->scratch;
  // Work queued earlier may still read the old buffer.
  check(cudaStreamSynchronize(impl_->stream), "a kernel on the stream");
  cudaFree(impl_->scratch);
  impl_->scratch = nullptr;
  impl_->scratch_bytes = 0;
  const size_t grown = std::max(bytes, size_t{1} << 20);
  impl_->scratch = device_alloc(grown);
  impl_->scratch_bytes = grown;
  return impl_->scratch;
}

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail("CUDA: cannot allocate ", bytes, " bytes of device memory (", cudaGetErrorString(e),
         "); use a smaller calibration batch or a GPU with more memory");
  }
  return p;
}

void device_free(void* p) {
  if (p) cudaFree(p);
}

void copy_to_device(void* dst, const void* src, size_t bytes, Stream& stream) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
                        static_cast<cudaStream_t>(stream.native())),
        "copy to device");
}

void copy_to_host(void* dst, const void* src, size_t bytes, Stream& stream) {
  if (bytes != 0) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost,
                          static_cast<cudaStream_t>(stream.native())),
          "copy to host");
  }
  stream.synchronize();
}

void copy_to_host_async(void* dst, const void* src, size_t bytes, Stream& stream) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost,
                        static_cast<cudaStream_t>(stream.native())),
        "copy to host");
}

void copy_device(void* dst, const void* src, size_t bytes, Stream& stream) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                        static_cast<cudaStream_t>(stream.native())),
        "device copy");
}

void fill_zero(void* dst, size_t bytes, Stream& stream) {
  if (bytes == 0) return;
  check(cudaMemsetAsync(dst, 0, bytes, static_cast<cudaStream_t>(stream.native())), "fill_zero");
}

}  // namespace strata::cuda
