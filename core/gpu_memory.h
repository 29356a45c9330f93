// Device memory under a budget, streams, events and pinned host memory: the handles of the GPU
// engine (engine/gpu_runner.h, model/cuda/gpu_forward.h). Host-only (no CUDA header): the CUDA
// build implements them in core/gpu_memory.cu; a build without CUDA in core/gpu_memory_none.cpp,
// where every handle but PinnedBuffer refuses with a strata::Error (PinnedBuffer falls back to
// ordinary aligned memory, so host code that stages reads in it runs and is tested without a
// GPU). The kernels' own stream and buffers (strata::cuda, core/device.h) are separate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace strata::gpu {

// Free and total memory of the current device in bytes ({0, 0} without one).
struct DeviceMemoryInfo {
  uint64_t free = 0, total = 0;
};
DeviceMemoryInfo cuda_memory_info();

// The bytes of device memory a run may hold (--max_gpu_memory_gb): every DeviceBuffer draws
// from it, and an allocation beyond it is a strata::Error naming the flag. limit 0: the device's
// free memory at creation, less a 5% margin for the CUDA context and cuBLAS workspaces.
class DeviceBudget {
 public:
  explicit DeviceBudget(uint64_t limit);
  uint64_t limit() const { return limit_; }
  uint64_t used() const { return used_; }
  uint64_t peak() const { return peak_; }
  uint64_t left() const { return limit_ > used_ ? limit_ - used_ : 0; }
  // Called by DeviceBuffer; `what` names the allocation in the error.
  void take(uint64_t bytes, const char* what);
  void give(uint64_t bytes) { used_ -= bytes; }

 private:
  uint64_t limit_ = 0, used_ = 0, peak_ = 0;
};

// Device memory (cudaMalloc), freed on destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBudget& budget, uint64_t bytes, const char* what);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  uint64_t bytes() const { return bytes_; }

 private:
  void reset();
  DeviceBudget* budget_ = nullptr;
  void* ptr_ = nullptr;
  uint64_t bytes_ = 0;
};

// Page-locked host memory (cudaMallocHost), so that copies to and from the device run
// asynchronously at full bandwidth; ordinary aligned memory without CUDA. 4096-byte aligned, so
// it can take O_DIRECT reads. Move-only.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(uint64_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  uint8_t* data() const { return ptr_; }
  uint64_t bytes() const { return bytes_; }
  bool pinned() const { return pinned_; }
  // Grows (never shrinks) to at least `bytes`; the contents are lost when it grows.
  void reserve(uint64_t bytes);

 private:
  void reset();
  uint8_t* ptr_ = nullptr;
  uint64_t bytes_ = 0;
  bool pinned_ = false;
};

// A CUDA stream (non-blocking with respect to the legacy default stream).
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  void* handle() const { return s_; }  // cudaStream_t
  void synchronize() const;
  // Asynchronous copies on this stream (host memory should be pinned).
  void copy_to_device(void* dst, const void* src, uint64_t bytes) const;
  void copy_to_host(void* dst, const void* src, uint64_t bytes) const;
  void copy_device(void* dst, const void* src, uint64_t bytes) const;
  void zero(void* dst, uint64_t bytes) const;

 private:
  void* s_ = nullptr;
};

// A CUDA event: record on one stream, make another wait on it. Timing is off unless asked for
// (ms_since then gives the device time between two recorded timing events).
class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(const Stream& s);
  void wait(const Stream& s) const;  // s waits for the last record
  void synchronize() const;          // the host waits
  // Milliseconds from `start` to this event; both timing events, both complete.
  double ms_since(const Event& start) const;

 private:
  [[maybe_unused]] void* e_ = nullptr;  // cudaEvent_t; unused by the no-CUDA build
};

// Throws a strata::Error naming `what` when the last CUDA call failed asynchronously (a kernel
// fault); a no-op without CUDA.
void cuda_check_last(const char* what);

}  // namespace strata::gpu
