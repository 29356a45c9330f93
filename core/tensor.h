// Tensor: a dtype, a shape and a contiguous row-major byte span that is either owned host memory
// or a zero-copy view into memory someone else owns (an mmap'd safetensors file). Device memory
// arrives with the CUDA backend; Device::kCUDA is named now so that code switches over it.
//
// There are no strides: every tensor is dense and row-major. A reshape shares the storage.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace strata {

using Shape = std::vector<int64_t>;

enum class Device : uint8_t { kCPU, kCUDA };

// "[4096, 7168]"; "[]" for a 0-d tensor.
std::string shape_str(const Shape& shape);
// Product of the dimensions (1 for a 0-d tensor). Throws strata::Error on a negative dimension
// or an overflow of int64.
int64_t shape_numel(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;

  // Owned, 64-byte aligned host memory, zero-filled.
  static Tensor zeros(DType dtype, Shape shape);
  // A read-only view of `nbytes` at `data`, kept valid by `owner` (for example an mmap).
  static Tensor view(DType dtype, Shape shape, const void* data, size_t nbytes,
                     std::shared_ptr<const void> owner);
  // 0-d fp32 tensor, as ModelOpt's per-tensor scales are stored.
  static Tensor scalar_f32(float value);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t ndim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t dim(int64_t i) const;  // negative i counts from the end
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  bool read_only() const { return read_only_; }

  const uint8_t* bytes() const;
  uint8_t* mutable_bytes();  // asserts the tensor is writable

  template <typename T>
  const T* data() const {
    return reinterpret_cast<const T*>(bytes());
  }
  template <typename T>
  T* mutable_data() {
    return reinterpret_cast<T*>(mutable_bytes());
  }

  // Element i as fp32 (see load_f32).
  float item_f32(int64_t i = 0) const;
  // A new owned fp32 tensor with every element converted.
  Tensor to_f32() const;
  // Same storage, new shape with the same element count.
  Tensor reshape(Shape shape) const;
  // A deep copy into owned host memory (writable).
  Tensor clone() const;

 private:
  DType dtype_ = DType::kF32;
  Shape shape_;
  int64_t numel_ = 0;
  size_t nbytes_ = 0;
  Device device_ = Device::kCPU;
  bool read_only_ = false;
  const uint8_t* data_ = nullptr;
  std::shared_ptr<const void> storage_;  // keeps data_ alive
};

}  // namespace strata
