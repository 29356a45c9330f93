// ops/cuda/norm.h against ops::rms_norm and ops::l2_norm.
#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/cuda/norm.h"
#include "ops/ops.h"
#include "tests/ops/cuda/cuda_test_util.h"

namespace strata::ops::cuda {
namespace {

// Rows of a head's width and of a hidden state's (one warp per row), wider than 8192 (one block
// per row), with and without a weight, in place and not. The same fp32 steps as ops::rms_norm;
// only the fp64 sum of squares is added in another order, which can move the fp32 mean by an ulp:
// a few ulp on the result (1e-6 relative ~ 8 ulp).
TEST_F(CudaOps, RmsNormMatchesOps) {
  for (auto [rows, dim] :
       {std::pair<int64_t, int64_t>{37, 128}, {5, 2048}, {3, 7}, {1, 1}, {2, 9000}}) {
    const std::vector<float> x = normal(rows * dim, 3.0f);
    std::vector<float> w = normal(dim, 0.1f);
    for (float& v : w)
      v += 1.0f;
    gpu::DeviceBuffer dx = up(x), dw = up(w), dy = buffer(x.size() * 4);
    for (bool with_w : {true, false}) {
      const float eps = 1e-6f;
      rms_norm(dx.as<float>(), rows, dim, with_w ? dw.as<float>() : nullptr, eps, dy.as<float>(),
               st());
      const auto y = down<float>(dy, x.size());
      std::vector<float> want(x.size());
      ops::rms_norm(x.data(), rows, dim, with_w ? w.data() : nullptr, eps, want.data());
      for (size_t i = 0; i < y.size(); ++i)
        ASSERT_NEAR(y[i], want[i], std::fabs(want[i]) * 1e-6f + 1e-30f)
            << rows << "x" << dim << " element " << i << (with_w ? " weighted" : "");
    }
    // Zero-centred weights (w_offset 1, Qwen3-Next): w - 1 stored, (1 + w) applied.
    {
      std::vector<float> wz = w;
      for (float& v : wz)
        v -= 1.0f;
      gpu::DeviceBuffer dwz = up(wz);
      rms_norm(dx.as<float>(), rows, dim, dwz.as<float>(), 1e-6f, dy.as<float>(), st(), 1.0f);
      const auto y = down<float>(dy, x.size());
      std::vector<float> want(x.size());
      ops::rms_norm(x.data(), rows, dim, wz.data(), 1e-6f, want.data(), 1.0f);
      for (size_t i = 0; i < y.size(); ++i)
        ASSERT_NEAR(y[i], want[i], std::fabs(want[i]) * 1e-6f + 1e-30f)
            << rows << "x" << dim << " element " << i << " offset 1";
    }
    rms_norm(dx.as<float>(), rows, dim, dw.as<float>(), 1e-6f, dx.as<float>(), st());
    const auto in_place = down<float>(dx, x.size());
    std::vector<float> want(x.size());
    ops::rms_norm(x.data(), rows, dim, w.data(), 1e-6f, want.data());
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_NEAR(in_place[i], want[i], std::fabs(want[i]) * 1e-6f + 1e-30f) << "in place " << i;
  }
}

// L2 norm per head (then the CPU's separate scale) against ops::l2_norm: the same fp64 sum up to
// order, the same float sqrt and division, so a few ulp at most (1e-6 relative ~ 8 ulp).
TEST_F(CudaOps, L2NormScaleMatchesOps) {
  for (auto [rows, dim, scale] : {std::tuple<int64_t, int64_t, float>{66, 32, 1.0f},
                                  {9, 128, 1.0f / std::sqrt(128.0f)},
                                  {5, 7, 0.5f}}) {
    std::vector<float> x = normal(rows * dim, 2.0f);
    x[0] = 0.0f;  // a row with a zero still normalises
    std::vector<float> want = x;
    ops::l2_norm(want.data(), rows, dim, 1e-6f);
    for (float& v : want)
      v *= scale;
    gpu::DeviceBuffer dx = up(x);
    l2_norm_scale(dx.as<float>(), rows, dim, 1e-6f, scale, st());
    const auto y = down<float>(dx, x.size());
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_NEAR(y[i], want[i], 1e-6f * std::fabs(want[i]) + 1e-30f)
          << rows << "x" << dim << " element " << i;
  }
}

}  // namespace
}  // namespace strata::ops::cuda
