// core/gpu_memory.h in a build without CUDA: no devices; PinnedBuffer is ordinary aligned memory;
// every other handle refuses.
#include <cstdlib>
#include <utility>

#include "core/error.h"
#include "core/gpu_memory.h"

namespace strata::gpu {
namespace {

[[noreturn]] void no_cuda(const char* what) {
  fail(what,
       ": this strata was built without CUDA; use --device cpu, or rebuild with a CUDA "
       "toolkit (-DSTRATA_CUDA=ON)");
}

}  // namespace

DeviceMemoryInfo cuda_memory_info() {
  return {};
}

DeviceBudget::DeviceBudget(uint64_t limit) : limit_(limit) {}
void DeviceBudget::take(uint64_t, const char*) {
  no_cuda("GPU memory");
}

DeviceBuffer::DeviceBuffer(DeviceBudget&, uint64_t, const char*) {
  no_cuda("GPU memory");
}
DeviceBuffer::~DeviceBuffer() = default;
void DeviceBuffer::reset() {}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : budget_(std::exchange(o.budget_, nullptr)),
      ptr_(std::exchange(o.ptr_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  budget_ = std::exchange(o.budget_, nullptr);
  ptr_ = std::exchange(o.ptr_, nullptr);
  bytes_ = std::exchange(o.bytes_, 0);
  return *this;
}

PinnedBuffer::PinnedBuffer(uint64_t bytes) {
  reserve(bytes);
}
PinnedBuffer::~PinnedBuffer() {
  reset();
}
void PinnedBuffer::reset() {
  std::free(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}
void PinnedBuffer::reserve(uint64_t bytes) {
  if (bytes <= bytes_) return;
  reset();
  bytes = (bytes + 4095) / 4096 * 4096;
  ptr_ = static_cast<uint8_t*>(std::aligned_alloc(4096, bytes));
  STRATA_CHECK(ptr_, "host memory: cannot allocate ", bytes, " bytes for a staging buffer");
  bytes_ = bytes;
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
  no_cuda("CUDA stream");
}
Stream::~Stream() = default;
void Stream::synchronize() const {}
void Stream::copy_to_device(void*, const void*, uint64_t) const {}
void Stream::copy_to_host(void*, const void*, uint64_t) const {}
void Stream::copy_device(void*, const void*, uint64_t) const {}
void Stream::zero(void*, uint64_t) const {}

Event::Event(bool) {
  no_cuda("CUDA event");
}
Event::~Event() = default;
void Event::record(const Stream&) {}
void Event::wait(const Stream&) const {}
void Event::synchronize() const {}
double Event::ms_since(const Event&) const {
  return 0;
}

void cuda_check_last(const char*) {}

}  // namespace strata::gpu
