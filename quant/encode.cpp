#include "quant/encode.h"

#include <cmath>
#include <cstring>

#include "core/error.h"

namespace strata::quant_detail {

void check_weight(const Tensor& weight, std::string_view name, int64_t block,
                  std::string_view format) {
  STRATA_CHECK(weight.defined(), format, ": tensor ", name, " is empty (undefined)");
  const DType dt = weight.dtype();
  STRATA_CHECK(dt == DType::kBF16 || dt == DType::kF16 || dt == DType::kF32, format, ": tensor ",
               name, " is ", dtype_name(dt), "; only bf16, f16 and f32 weights can be quantized");
  STRATA_CHECK(weight.ndim() >= 1, format, ": tensor ", name,
               " is 0-d; a weight needs an input dimension");
  const int64_t width = weight.dim(-1);
  STRATA_CHECK(width > 0 && width % block == 0, format, ": tensor ", name, " has shape ",
               shape_str(weight.shape()), "; its last (input) dimension ", width,
               " must be a positive multiple of the block size ", block,
               " (exclude the module from quantization in the recipe)");
}

void load_finite_f32(const Tensor& weight, int64_t first, int64_t count, float* out,
                     std::string_view name) {
  const uint8_t* base = weight.bytes();
  switch (weight.dtype()) {
    case DType::kBF16:
      for (int64_t i = 0; i < count; ++i) {
        uint16_t b;
        std::memcpy(&b, base + 2 * (first + i), 2);
        out[i] = std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
      }
      break;
    case DType::kF16:
      for (int64_t i = 0; i < count; ++i) {
        uint16_t b;
        std::memcpy(&b, base + 2 * (first + i), 2);
        out[i] = f16_to_f32(b);
      }
      break;
    case DType::kF32:
      std::memcpy(out, base + 4 * first, static_cast<size_t>(count) * 4);
      break;
    default:
      STRATA_ASSERT(false, "load_finite_f32 on ", dtype_name(weight.dtype()));
  }
  bool finite = true;
  for (int64_t i = 0; i < count; ++i)
    finite &= std::isfinite(out[i]);
  if (!finite) [[unlikely]] {
    for (int64_t i = 0; i < count; ++i) {
      if (!std::isfinite(out[i])) {
        fail("tensor ", name, " holds a non-finite value (", out[i], ") at flat element ",
             first + i, "; the checkpoint is damaged and cannot be quantized");
      }
    }
  }
}

float round_to(DType dtype, float x) {
  switch (dtype) {
    case DType::kBF16:
      return bf16_to_f32(f32_to_bf16(x));
    case DType::kF16:
      return f16_to_f32(f32_to_f16(x));
    case DType::kF32:
      return x;
    default:
      STRATA_ASSERT(false, "round_to ", dtype_name(dtype));
  }
  return x;
}

}  // namespace strata::quant_detail
