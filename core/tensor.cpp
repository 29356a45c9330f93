#include "core/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include "core/error.h"

namespace strata {

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    STRATA_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) {
      fail("shape ", shape_str(shape), " has more elements than fit in 64 bits");
    }
    n *= d;
  }
  return n;
}

namespace {
// Zeroed and 64-byte aligned. From calloc, which does not write a block it knows to be zero
// already: a large one is freshly mapped (the kernel zeroes each page when it is first written),
// so the zeroing costs nothing until then, instead of a pass that faults in every page only for
// the caller to overwrite it (the writer's fused gpt-oss experts, 0.5 GB a layer, and every
// decompressed or quantized tensor).
struct AlignedBuffer {
  void* raw;
  void* ptr;
  explicit AlignedBuffer(size_t n) {
    const size_t rounded = std::max<size_t>((n + 63) / 64 * 64, 64);
    raw = std::calloc(rounded + 64, 1);
    if (!raw) throw std::bad_alloc();
    ptr = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(raw) + 63) / 64 * 64);
  }
  ~AlignedBuffer() { std::free(raw); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
};
}  // namespace

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.numel_ = shape_numel(shape);
  t.shape_ = std::move(shape);
  t.nbytes_ = dtype_bytes(dtype, t.numel_);
  auto buffer = std::make_shared<AlignedBuffer>(t.nbytes_);
  t.data_ = static_cast<const uint8_t*>(buffer->ptr);
  t.storage_ = std::move(buffer);
  return t;
}

Tensor Tensor::view(DType dtype, Shape shape, const void* data, size_t nbytes,
                    std::shared_ptr<const void> owner) {
  Tensor t;
  t.dtype_ = dtype;
  t.numel_ = shape_numel(shape);
  t.shape_ = std::move(shape);
  t.nbytes_ = dtype_bytes(dtype, t.numel_);
  STRATA_ASSERT(t.nbytes_ == nbytes, "view of ", nbytes, " bytes for a ", dtype_name(dtype), " ",
                shape_str(t.shape_), " tensor");
  STRATA_ASSERT(owner != nullptr);
  t.read_only_ = true;
  t.data_ = static_cast<const uint8_t*>(data);
  t.storage_ = std::move(owner);
  return t;
}

Tensor Tensor::scalar_f32(float value) {
  Tensor t = zeros(DType::kF32, {});
  *t.mutable_data<float>() = value;
  return t;
}

int64_t Tensor::dim(int64_t i) const {
  if (i < 0) i += ndim();
  STRATA_ASSERT(i >= 0 && i < ndim(), "dim ", i, " of a ", ndim(), "-d tensor");
  return shape_[static_cast<size_t>(i)];
}

const uint8_t* Tensor::bytes() const {
  STRATA_ASSERT(device_ == Device::kCPU, "host access to a device tensor");
  return data_;
}

uint8_t* Tensor::mutable_bytes() {
  STRATA_ASSERT(!read_only_, "write to a read-only tensor view");
  STRATA_ASSERT(device_ == Device::kCPU, "host access to a device tensor");
  return const_cast<uint8_t*>(data_);
}

float Tensor::item_f32(int64_t i) const {
  STRATA_ASSERT(i >= 0 && i < numel_, "element ", i, " of ", numel_);
  return load_f32(dtype_, bytes(), i);
}

Tensor Tensor::to_f32() const {
  Tensor out = zeros(DType::kF32, shape_);
  float* dst = out.mutable_data<float>();
  const uint8_t* src = bytes();
  if (dtype_ == DType::kF32) {
    std::memcpy(dst, src, nbytes_);
  } else if (dtype_ == DType::kBF16) {
    for (int64_t i = 0; i < numel_; ++i) {
      uint16_t b;
      std::memcpy(&b, src + 2 * i, 2);
      dst[i] = bf16_to_f32(b);
    }
  } else {
    for (int64_t i = 0; i < numel_; ++i)
      dst[i] = load_f32(dtype_, src, i);
  }
  return out;
}

Tensor Tensor::reshape(Shape shape) const {
  STRATA_ASSERT(shape_numel(shape) == numel_, "reshape ", shape_str(shape_), " to ",
                shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = zeros(dtype_, shape_);
  if (nbytes_) std::memcpy(t.mutable_bytes(), bytes(), nbytes_);
  return t;
}

}  // namespace strata
