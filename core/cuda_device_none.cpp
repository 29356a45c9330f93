#include "core/device.h"
#include "core/error.h"

namespace strata {

bool cuda_compiled() {
  return false;
}
int cuda_device_count() {
  return 0;
}
double cuda_probe_seconds() {
  return 0.0;
}
std::string cuda_device_description(int) {
  return {};
}

}  // namespace strata

namespace strata::cuda {

namespace {
[[noreturn]] void no_cuda() {
  fail(
      "this strata was built without the CUDA backend; rebuild with nvcc installed "
      "(-DSTRATA_CUDA=ON) to use a GPU");
}
}  // namespace

struct Stream::Impl {};
Stream::Stream(int, bool) {
  no_cuda();
}
Stream::~Stream() = default;
void Stream::synchronize() {
  no_cuda();
}
int Stream::device() const {
  no_cuda();
}
void* Stream::native() const {
  no_cuda();
}
void* Stream::scratch(size_t) {
  no_cuda();
}
void* device_alloc(size_t) {
  no_cuda();
}
void device_free(void* p) {
  if (p) no_cuda();
}
void copy_to_device(void*, const void*, size_t, Stream&) {
  no_cuda();
}
void copy_to_host(void*, const void*, size_t, Stream&) {
  no_cuda();
}
void copy_to_host_async(void*, const void*, size_t, Stream&) {
  no_cuda();
}
void copy_device(void*, const void*, size_t, Stream&) {
  no_cuda();
}
void fill_zero(void*, size_t, Stream&) {
  no_cuda();
}

}  // namespace strata::cuda
