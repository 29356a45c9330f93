// Small helpers shared by the quant tests: building weights from fp32 values.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace strata::quant_test {

// A tensor of `dtype` (BF16, F16 or F32) holding `values` rounded to that dtype.
inline Tensor make_weight(DType dtype, Shape shape, const std::vector<float>& values) {
  Tensor t = Tensor::zeros(dtype, std::move(shape));
  uint8_t* p = t.mutable_bytes();
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(p + 4 * i, &values[i], 4);
    } else {
      const uint16_t b = dtype == DType::kBF16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
      std::memcpy(p + 2 * i, &b, 2);
    }
  }
  return t;
}

inline std::vector<uint8_t> bytes_of(const Tensor& t) {
  return std::vector<uint8_t>(t.bytes(), t.bytes() + t.nbytes());
}

inline uint32_t bits(float x) {
  return std::bit_cast<uint32_t>(x);
}

}  // namespace strata::quant_test
