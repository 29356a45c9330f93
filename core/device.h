// What accelerators this process can use, and the host-only handles of the CUDA backend: a
// stream and device memory. The CUDA build implements them in core/cuda_device.cu; a build
// without CUDA reports no device, and everything in strata::cuda throws strata::Error there.
// No CUDA header is needed to include this file (docs/CUDA.md).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace strata {

// True when strata was built with the CUDA backend.
bool cuda_compiled();
// Number of usable CUDA devices (0 without CUDA, without a driver, or without a GPU).
int cuda_device_count();
// The wall seconds the first cuda_device_count() took (the CUDA driver's start; 0 before it and
// without CUDA). quantize logs it among its start-up steps.
double cuda_probe_seconds();
// The refusal of --device cuda where cuda_device_count() is 0, after "--device cuda: ".
inline constexpr const char* kNoCudaDevice =
    "no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES); use --device cpu";
// "NVIDIA H200 (sm_90, 139.8 GiB)" for device i, or an empty string.
std::string cuda_device_description(int i);

// For compute-sanitizer's initcheck only (docs/CUDA.md): it does not record the stores of
// cuBLAS's bf16 GEMMs, so ops/cuda, when this is on, first sets each bf16 GEMM's output to
// all-ones bytes (a NaN in every element); what initcheck then reports is a real read of memory
// nothing wrote. cli/ turns it on for STRATA_CUDA_PRESET_GEMM_OUTPUTS=1, as does the GPU tests'
// tests/gpu_test_env.cpp.
inline std::atomic<bool>& preset_gemm_outputs() {
  static std::atomic<bool> on{false};
  return on;
}

}  // namespace strata

namespace strata::cuda {

// One CUDA stream on one device, with the scratch space the quantizers use. Every launcher in
// quant/cuda takes a Stream& (those of ops/cuda take a cudaStream_t as void*, e.g. a
// gpu::Stream's handle()): work is queued in order on it and is asynchronous to the host unless
// the launcher's comment says it synchronizes. Not thread-safe: one Stream per host thread.
// Creating one makes `device` current on the calling thread.
class Stream {
 public:
  // high_priority: the device's highest stream priority, so that its kernels' blocks go before
  // other streams' waiting blocks (the weight quantizer's small kernels beside the forward's).
  explicit Stream(int device = 0, bool high_priority = false);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Waits for all work queued so far; throws strata::Error naming the CUDA error if any kernel
  // on the stream failed.
  void synchronize();
  int device() const;
  // The cudaStream_t, as an opaque pointer (for .cu files only).
  void* native() const;
  // A device buffer of at least `bytes`, owned by the stream, reused across calls (grown when
  // asked for more). Valid until the next scratch() call with a larger size: launchers use it
  // for their temporaries; callers must not hold on to it across launcher calls.
  void* scratch(size_t bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Device memory. device_alloc throws strata::Error naming the size when the device is out of
// memory; device_free(nullptr) does nothing.
void* device_alloc(size_t bytes);
void device_free(void* p);

// Owning device buffer of `bytes` bytes (uninitialised), freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : p_(bytes ? device_alloc(bytes) : nullptr), bytes_(bytes) {}
  ~DeviceBuffer() { device_free(p_); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) {
    o.p_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      device_free(p_);
      p_ = o.p_;
      bytes_ = o.bytes_;
      o.p_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  void* data() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Copies queued on `stream`. copy_to_device reads `src` when the copy runs, so the host buffer
// must stay alive and unchanged until the stream is synchronized. copy_to_host synchronizes the
// stream before returning (the host data is ready). copy_device copies device to device.
void copy_to_device(void* dst, const void* src, size_t bytes, Stream& stream);
void copy_to_host(void* dst, const void* src, size_t bytes, Stream& stream);
// As copy_to_host without the synchronization: `dst` (pinned, to run asynchronously) holds the
// bytes once the stream is synchronized.
void copy_to_host_async(void* dst, const void* src, size_t bytes, Stream& stream);
void copy_device(void* dst, const void* src, size_t bytes, Stream& stream);
void fill_zero(void* dst, size_t bytes, Stream& stream);

}  // namespace strata::cuda
