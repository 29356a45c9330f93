// The CUDA quantizers of quant/cuda/quant_cuda.h against the CPU quantizers (whose bytes
// tests/quant/*_test.cpp check against the scalar references and ModelOpt vectors): byte-for-byte
// equality on fresh random weights of every source dtype, including zero blocks, subnormal-range
// values, outliers and block amaxes at 448 * 2^k. Label `gpu`: skipped without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "quant/cuda/quant_cuda.h"
#include "quant/fp8.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"
#include "tests/quant/test_util.h"

namespace strata {
namespace {

namespace gpu = strata::quant::cuda;
using quant_test::bits;
using quant_test::bytes_of;
using quant_test::make_weight;
using strata::cuda::DeviceBuffer;
using strata::cuda::Stream;

class CudaQuant : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    stream_ = std::make_unique<Stream>(0);
  }
  Stream& s() { return *stream_; }

  DeviceBuffer up(const Tensor& t) {
    DeviceBuffer b(t.nbytes());
    strata::cuda::copy_to_device(b.data(), t.bytes(), t.nbytes(), s());
    s().synchronize();
    return b;
  }
  std::vector<uint8_t> down(const DeviceBuffer& b, size_t n) {
    std::vector<uint8_t> v(n);
    strata::cuda::copy_to_host(v.data(), b.data(), n, s());
    return v;
  }

  // Random weights [rows, cols] with the awkward cases mixed in: whole zero blocks of 32,
  // values spanning many binades (subnormal e4m3 range after scaling), rare outliers, and one
  // block whose amax is exactly 448 * 2^-3 (an exact power-of-two MXFP8 descale).
  std::vector<float> weights(int64_t rows, int64_t cols) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> binade(-20, 2), pick(0, 99);
    std::vector<float> w(rows * cols);
    for (float& x : w) {
      const int p = pick(rng_);
      x = normal(rng_) * std::ldexp(1.0f, binade(rng_));
      if (p == 0) x *= 50.0f;
    }
    for (int64_t b = 96; b + 32 <= rows * cols; b += 32 * 7)
      std::fill_n(&w[b], 32, 0.0f);
    if (rows * cols >= 64) {
      std::fill_n(&w[32], 32, 1.0f);
      w[40] = 56.0f;  // 448 * 2^-3
    }
    return w;
  }

  std::mt19937 rng_{777};

 private:
  std::unique_ptr<Stream> stream_;
};

const DType kDtypes[] = {DType::kBF16, DType::kF16, DType::kF32};
const int64_t kShapes[][2] = {{1, 32}, {3, 96}, {37, 160}, {128, 1024}};

float cpu_amax(const Tensor& t) {
  float m = 0.0f;
  for (int64_t i = 0; i < t.numel(); ++i)
    m = std::max(m, std::fabs(t.item_f32(i)));
  return m;
}

TEST_F(CudaQuant, WeightAmaxIsExact) {
  for (DType dt : kDtypes) {
    for (const auto& sh : kShapes) {
      const Tensor w = make_weight(dt, {sh[0], sh[1]}, weights(sh[0], sh[1]));
      DeviceBuffer dw = up(w), out(4);
      strata::cuda::fill_zero(out.data(), 4, s());
      gpu::weight_amax(dw.data(), dt, w.numel(), out.as<float>(), s());
      float got;
      strata::cuda::copy_to_host(&got, out.data(), 4, s());
      ASSERT_EQ(bits(got), bits(cpu_amax(w))) << dtype_name(dt) << " " << sh[0] << "x" << sh[1];
    }
  }
}

TEST_F(CudaQuant, Nvfp4BytesEqualCpu) {
  for (DType dt : kDtypes) {
    for (const auto& sh : kShapes) {
      const int64_t rows = sh[0], cols = sh[1];
      const Tensor w = make_weight(dt, {rows, cols}, weights(rows, cols));
      // The tensor's own amax, and a larger group amax (a fused group's max).
      for (float amax : {cpu_amax(w), cpu_amax(w) * 1.7f}) {
        const Nvfp4Weight want = nvfp4_quantize(w, amax, "w");
        DeviceBuffer dw = up(w), packed(rows * cols / 2), scales(rows * cols / 16);
        const float gs = gpu::nvfp4_quantize(dw.data(), dt, rows, cols, amax, packed.as<uint8_t>(),
                                             scales.as<uint8_t>(), "w", s());
        ASSERT_EQ(bits(gs), bits(want.global_scale.item_f32()));
        ASSERT_EQ(down(packed, rows * cols / 2), bytes_of(want.packed))
            << dtype_name(dt) << " " << rows << "x" << cols;
        ASSERT_EQ(down(scales, rows * cols / 16), bytes_of(want.block_scale))
            << dtype_name(dt) << " " << rows << "x" << cols;
      }
    }
  }
}

TEST_F(CudaQuant, Fp8BytesEqualCpu) {
  for (DType dt : kDtypes) {
    for (const auto& sh : kShapes) {
      const int64_t rows = sh[0], cols = sh[1] + 3;  // FP8 has no block: odd widths too
      const Tensor w = make_weight(dt, {rows, cols}, weights(rows, cols));
      for (float amax : {cpu_amax(w), cpu_amax(w) * 3.0f}) {
        const Fp8Weight want = fp8_quantize(w, amax, "w");
        DeviceBuffer dw = up(w), out(rows * cols);
        const float scale =
            gpu::fp8_quantize(dw.data(), dt, rows * cols, amax, out.as<uint8_t>(), "w", s());
        ASSERT_EQ(bits(scale), bits(want.scale.item_f32()));
        ASSERT_EQ(down(out, rows * cols), bytes_of(want.weight))
            << dtype_name(dt) << " " << rows << "x" << cols;
      }
    }
  }
}

TEST_F(CudaQuant, Mxfp8BytesEqualCpu) {
  for (DType dt : kDtypes) {
    for (const auto& sh : kShapes) {
      const int64_t rows = sh[0], cols = sh[1];
      const Tensor w = make_weight(dt, {rows, cols}, weights(rows, cols));
      const Mxfp8Weight want = mxfp8_quantize(w, "w");
      DeviceBuffer dw = up(w), out(rows * cols), scales(rows * cols / 32);
      gpu::mxfp8_quantize(dw.data(), dt, rows, cols, out.as<uint8_t>(), scales.as<uint8_t>(), "w",
                          s());
      ASSERT_EQ(down(out, rows * cols), bytes_of(want.weight))
          << dtype_name(dt) << " " << rows << "x" << cols;
      ASSERT_EQ(down(scales, rows * cols / 32), bytes_of(want.scale))
          << dtype_name(dt) << " " << rows << "x" << cols;
    }
  }
}

TEST_F(CudaQuant, BadWeightsThrowLikeCpu) {
  std::vector<float> v = weights(4, 64);
  const Tensor good = make_weight(DType::kF32, {4, 64}, v);
  const float amax = cpu_amax(good);
  DeviceBuffer buf(4 * 64), scales(64), dw = up(good);
  // amax below max|W|
  EXPECT_THROW(gpu::nvfp4_quantize(dw.data(), DType::kF32, 4, 64, amax * 0.5f, buf.as<uint8_t>(),
                                   scales.as<uint8_t>(), "w", s()),
               Error);
  DeviceBuffer out8(4 * 64);
  EXPECT_THROW(
      gpu::fp8_quantize(dw.data(), DType::kF32, 4 * 64, amax * 0.5f, out8.as<uint8_t>(), "w", s()),
      Error);
  EXPECT_THROW(
      gpu::fp8_quantize(dw.data(), DType::kF32, 4 * 64, 0.0f, out8.as<uint8_t>(), "w", s()), Error);
  // A NaN element.
  v[77] = NAN;
  const Tensor bad = make_weight(DType::kF32, {4, 64}, v);
  DeviceBuffer db = up(bad);
  EXPECT_THROW(gpu::mxfp8_quantize(db.data(), DType::kF32, 4, 64, out8.as<uint8_t>(),
                                   scales.as<uint8_t>(), "w", s()),
               Error);
  EXPECT_THROW(gpu::nvfp4_quantize(db.data(), DType::kF32, 4, 64, amax, buf.as<uint8_t>(),
                                   scales.as<uint8_t>(), "w", s()),
               Error);
  // Width not a multiple of the block.
  EXPECT_THROW(gpu::nvfp4_quantize(dw.data(), DType::kF32, 16, 8, amax, buf.as<uint8_t>(),
                                   scales.as<uint8_t>(), "w", s()),
               Error);
  // A dtype no format takes.
  EXPECT_THROW(gpu::mxfp8_quantize(dw.data(), DType::kU8, 4, 64, out8.as<uint8_t>(),
                                   scales.as<uint8_t>(), "w", s()),
               Error);
}

}  // namespace
}  // namespace strata
