// The serving simulation's fake quantizers on the device (host launchers: ops/cuda/fake_quant.h).
// Each kernel is its CPU reference (quant/nvfp4.cpp nvfp4_fake_quantize, quant/fp8.cpp
// fp8_fake_quantize, quant/mxfp8.cpp mxfp8_fake_quantize) written for one thread per block (NVFP4,
// MXFP8) or element (FP8), with every fp32 operation an explicit round-to-nearest intrinsic, the
// comparisons in the CPU's order (std::max, std::min and std::clamp keep their first argument on a
// NaN), and quant/encode.h's fast e4m3 / e2m1 encoders.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda_fp.cuh"
#include "ops/cuda/fake_quant.h"
#include "ops/cuda/launch.cuh"

namespace strata::ops::cuda {
namespace {

using cuda_fp::from_e4m3;
using cuda_fp::is_finite;
using cuda_fp::is_nan;
using cuda_fp::to_e4m3;
using launch::blocks_for;
using launch::kThreads;
using launch::launched;
using launch::st;

constexpr int64_t kNvfp4Block = 16;       // quant/nvfp4.h kNvfp4BlockSize
constexpr int64_t kMxfp8Block = 32;       // quant/mxfp8.h kMxfp8BlockSize
constexpr float kMaxE4m3Scale = 448.0f;   // quant/nvfp4.h kMaxBlockScale
constexpr float kInv448 = 1.0f / 448.0f;  // fl32(1/448), as quant/mxfp8.cpp

// quant_detail::fast_f32_to_e2m1 then core/dtype.h e2m1_to_f32, for x >= 0 or NaN: the magnitude
// of the nearest E2M1 value (ties to even; > 5, infinity and NaN give 6).
__device__ __forceinline__ float e2m1_magnitude(float a) {
  if (!(a <= 5.0f)) return 6.0f;
  const int code =
      (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f);
  const float m[7] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f};
  return m[code];
}

// 2^e exactly, for e in [-149, 127] (ldexp(1, e)).
__device__ __forceinline__ float pow2(int e) {
  if (e >= -126) return __uint_as_float(static_cast<uint32_t>(e + 127) << 23);
  return __uint_as_float(1u << (e + 149));
}

__global__ void k_nvfp4(float* x, int64_t n_blocks, float global_scale) {
  const float six_global = __fmul_rn(6.0f, global_scale);
  FOR_N(b, n_blocks) {
    float* v = x + b * kNvfp4Block;
    float block_amax = 0.0f;
    bool nan = false;
    for (int i = 0; i < kNvfp4Block; ++i) {
      const float a = fabsf(v[i]);
      nan = nan || is_nan(v[i]);
      if (block_amax < a) block_amax = a;  // std::max(block_amax, a): a NaN a is skipped
    }
    // std::min(block_amax / six_global, 448); a NaN block gives a NaN scale, whose code 0x7F
    // decodes to NaN: the descale is then 1, as below.
    float descale = 1.0f;
    if (!nan) {
      float s = __fdiv_rn(block_amax, six_global);
      if (kMaxE4m3Scale < s) s = kMaxE4m3Scale;
      descale = __fmul_rn(from_e4m3(to_e4m3(s)), global_scale);
      if (!(descale >= 1e-5f)) descale = 1.0f;  // underflowed: ModelOpt's substitute
    }
    for (int i = 0; i < kNvfp4Block; ++i) {
      const float m = __fmul_rn(e2m1_magnitude(__fdiv_rn(fabsf(v[i]), descale)), descale);
      v[i] = v[i] >= 0.0f ? m : -m;
    }
  }
}

__global__ void k_fp8(float* x, int64_t n, float scale) {
  FOR_N(i, n) {
    if (is_nan(x[i])) continue;
    float q = __fdiv_rn(x[i], scale);
    q = q < -448.0f ? -448.0f : (448.0f < q ? 448.0f : q);  // std::clamp
    x[i] = __fmul_rn(from_e4m3(to_e4m3(q)), scale);
  }
}

__global__ void k_mxfp8(float* x, int64_t n_blocks) {
  FOR_N(b, n_blocks) {
    float* v = x + b * kMxfp8Block;
    float block_amax = 0.0f;
    bool finite = true;
    for (int i = 0; i < kMxfp8Block; ++i) {
      finite = finite && is_finite(v[i]);
      const float a = fabsf(v[i]);
      if (block_amax < a) block_amax = a;
    }
    if (!finite) {  // a NaN or an infinity: the block becomes NaN
      for (int i = 0; i < kMxfp8Block; ++i)
        v[i] = __uint_as_float(0x7FC00000u);
      continue;
    }
    // mxfp8_block_exponent: 0 for a zero block (2^-127), else clamp(ceil(log2(amax / 448))).
    const float d = __fmul_rn(block_amax, kInv448);
    int exponent = -127;
    if (d != 0.0f) {
      exponent = cuda_fp::ceil_log2(d);
      exponent = exponent < -127 ? -127 : (exponent > 127 ? 127 : exponent);
    }
    const float inv_scale = pow2(-exponent), scale = pow2(exponent);
    for (int i = 0; i < kMxfp8Block; ++i) {
      float q = __fmul_rn(v[i], inv_scale);
      q = q < -448.0f ? -448.0f : (448.0f < q ? 448.0f : q);
      v[i] = __fmul_rn(from_e4m3(to_e4m3(q)), scale);  // exact: ldexp
    }
  }
}

}  // namespace

void fake_quantize_nvfp4(float* x, int64_t n, float global_scale, void* s) {
  if (n == 0) return;
  const int64_t blocks = n / kNvfp4Block;
  k_nvfp4<<<blocks_for(blocks), kThreads, 0, st(s)>>>(x, blocks, global_scale);
  launched("fake_quantize_nvfp4");
}

void fake_quantize_fp8(float* x, int64_t n, float scale, void* s) {
  if (n == 0) return;
  k_fp8<<<blocks_for(n), kThreads, 0, st(s)>>>(x, n, scale);
  launched("fake_quantize_fp8");
}

void fake_quantize_mxfp8(float* x, int64_t n, void* s) {
  if (n == 0) return;
  const int64_t blocks = n / kMxfp8Block;
  k_mxfp8<<<blocks_for(blocks), kThreads, 0, st(s)>>>(x, blocks);
  launched("fake_quantize_mxfp8");
}

}  // namespace strata::ops::cuda
