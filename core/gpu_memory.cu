#include <cuda_runtime.h>
#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "core/device.h"
#include "core/error.h"
#include "core/gpu_memory.h"
#include "core/parallel.h"

namespace strata::gpu {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail("CUDA: ", what, ": ", cudaGetErrorString(e));
  }
}

std::string gib(uint64_t b) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

}  // namespace

DeviceMemoryInfo cuda_memory_info() {
  size_t f = 0, t = 0;
  if (cudaMemGetInfo(&f, &t) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  return {f, t};
}

DeviceBudget::DeviceBudget(uint64_t limit) : limit_(limit) {
  if (limit_ == 0) limit_ = cuda_memory_info().free / 20 * 19;
}

void DeviceBudget::take(uint64_t bytes, const char* what) {
  STRATA_CHECK(used_ + bytes <= limit_, "GPU memory: ", what, " needs ", gib(bytes), " with ",
               gib(used_), " of the ", gib(limit_),
               " budget in use; raise --max_gpu_memory_gb or lower --batch_size");
  used_ += bytes;
  if (used_ > peak_) peak_ = used_;
}

DeviceBuffer::DeviceBuffer(DeviceBudget& budget, uint64_t bytes, const char* what) {
  if (bytes == 0) return;
  budget.take(bytes, what);
  const cudaError_t e = cudaMalloc(&ptr_, bytes);
  if (e != cudaSuccess) {
    budget.give(bytes);
    ptr_ = nullptr;
    cudaGetLastError();
    fail("GPU memory: cudaMalloc of ", gib(bytes), " for ", what,
         " failed: ", cudaGetErrorString(e), "; lower --max_gpu_memory_gb or --batch_size");
  }
  budget_ = &budget;
  bytes_ = bytes;
}

DeviceBuffer::~DeviceBuffer() {
  reset();
}

void DeviceBuffer::reset() {
  if (ptr_) {
    cudaFree(ptr_);
    budget_->give(bytes_);
  }
  ptr_ = nullptr;
  bytes_ = 0;
  budget_ = nullptr;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : budget_(std::exchange(o.budget_, nullptr)),
      ptr_(std::exchange(o.ptr_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    budget_ = std::exchange(o.budget_, nullptr);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

PinnedBuffer::PinnedBuffer(uint64_t bytes) {
  reserve(bytes);
}
PinnedBuffer::~PinnedBuffer() {
  reset();
}

void PinnedBuffer::reset() {
  if (ptr_) {
    if (pinned_) cudaHostUnregister(ptr_);
    ::munmap(ptr_, bytes_);
  }
  ptr_ = nullptr;
  bytes_ = 0;
  pinned_ = false;
}

void PinnedBuffer::reserve(uint64_t bytes) {
  if (bytes <= bytes_) return;
  reset();
  // Anonymous memory on 2 MiB boundaries, asked for transparent huge pages and faulted in on
  // several threads, then page-locked in place (cudaHostRegister): cudaMallocHost faults in,
  // clears and locks 4 KiB pages on the calling thread, about half a second per GiB (docs/CUDA.md
  // "The engine on the GPU", start-up), which a run's start waited for.
  constexpr uint64_t kHuge = uint64_t{2} << 20;
  bytes = (bytes + kHuge - 1) / kHuge * kHuge;
  void* m =
      ::mmap(nullptr, bytes + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  STRATA_CHECK(m != MAP_FAILED, "host memory: cannot allocate ", gib(bytes),
               " for a staging buffer");
  const uintptr_t begin = reinterpret_cast<uintptr_t>(m);
  const uintptr_t at = (begin + kHuge - 1) / kHuge * kHuge;
  if (at > begin) ::munmap(m, at - begin);
  ::munmap(reinterpret_cast<void*>(at + bytes), begin + kHuge - at);  // at < begin + kHuge
  uint8_t* p = reinterpret_cast<uint8_t*>(at);
  ::madvise(p, bytes, MADV_HUGEPAGE);  // a hint: without huge pages, 4 KiB pages as before
  parallel_chunks(bytes / kHuge, std::min<size_t>(startup_threads(), 8), 16,
                  [p](size_t b, size_t e) {
                    for (uint64_t i = b * kHuge; i < e * kHuge; i += 4096)
                      p[i] = 0;
                  });
  ptr_ = p;
  bytes_ = bytes;
  if (cuda_device_count() > 0 && cudaHostRegister(p, bytes, cudaHostRegisterDefault) == cudaSuccess)
    pinned_ = true;
  else
    cudaGetLastError();  // used unpinned: copies are synchronous staging, still correct
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      pinned_(std::exchange(o.pinned_, false)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    pinned_ = std::exchange(o.pinned_, false);
  }
  return *this;
}

Stream::Stream() {
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  s_ = s;
}
Stream::~Stream() {
  cudaStreamDestroy(static_cast<cudaStream_t>(s_));
}
void Stream::synchronize() const {
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(s_)), "stream synchronize");
}
void Stream::copy_to_device(void* dst, const void* src, uint64_t bytes) const {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(s_)),
        "copy to device");
}
void Stream::copy_to_host(void* dst, const void* src, uint64_t bytes) const {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(s_)),
        "copy to host");
}
void Stream::copy_device(void* dst, const void* src, uint64_t bytes) const {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(s_)),
        "device copy");
}
void Stream::zero(void* dst, uint64_t bytes) const {
  if (bytes == 0) return;
  check(cudaMemsetAsync(dst, 0, bytes, static_cast<cudaStream_t>(s_)), "memset");
}

Event::Event(bool timing) {
  cudaEvent_t e;
  check(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming),
        "cudaEventCreate");
  e_ = e;
}
Event::~Event() {
  cudaEventDestroy(static_cast<cudaEvent_t>(e_));
}
void Event::record(const Stream& s) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(e_), static_cast<cudaStream_t>(s.handle())),
        "event record");
}
void Event::wait(const Stream& s) const {
  check(cudaStreamWaitEvent(static_cast<cudaStream_t>(s.handle()), static_cast<cudaEvent_t>(e_), 0),
        "stream wait");
}
void Event::synchronize() const {
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(e_)), "event synchronize");
}

double Event::ms_since(const Event& start) const {
  float ms = 0;
  check(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.e_), static_cast<cudaEvent_t>(e_)),
        "event elapsed time");
  return ms;
}

void cuda_check_last(const char* what) {
  const cudaError_t e = cudaGetLastError();
  STRATA_CHECK(e == cudaSuccess, "CUDA: ", what, ": ", cudaGetErrorString(e));
}

}  // namespace strata::gpu
