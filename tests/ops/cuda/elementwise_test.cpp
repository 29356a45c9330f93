// ops/cuda/elementwise.h against ops::swiglu, ops::sigmoid and exact references.
#include <cmath>
#include <vector>

#include "ops/cuda/elementwise.h"
#include "ops/ops.h"
#include "tests/ops/cuda/cuda_test_util.h"

namespace strata::ops::cuda {
namespace {

// add, add_bias and copy_cols round as the CPU does (one fp32 add, or none): bit-identical.
TEST_F(CudaOps, AddBiasAndCopyColsAreExact) {
  const int64_t rows = 13, cols = 77, n = rows * cols;
  const auto x = normal(n, 3.0f), y = normal(n), b = normal(cols);
  gpu::DeviceBuffer dx = up(x), dy = up(y), db = up(b);
  add(dx.as<float>(), dy.as<float>(), n, st());
  const auto sum = down<float>(dx, n);
  add_bias(dy.as<float>(), rows, cols, db.as<float>(), st());
  const auto biased = down<float>(dy, n);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(bits_of(sum[i]), bits_of(x[i] + y[i])) << i;
    ASSERT_EQ(bits_of(biased[i]), bits_of(y[i] + b[i % cols])) << i;
  }
  gpu::DeviceBuffer dc = buffer(rows * 5 * 4);
  copy_cols(dx.as<float>() + 3, cols, dc.as<float>(), 5, rows, 5, st());
  const auto c = down<float>(dc, rows * 5);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < 5; ++j)
      ASSERT_EQ(bits_of(c[r * 5 + j]), bits_of(sum[r * cols + 3 + j])) << r << "," << j;
}

// swiglu and the sigmoid gates against ops::swiglu / ops::sigmoid: expf within 2 ulp and a fused
// multiply-add where the CPU rounds twice: 1e-6 relative (~8 ulp), and for the gated add 1e-6 of
// the magnitudes summed.
// gpt-oss's clamped SwiGLU against ops::swiglu_clamped, with values beyond the limit and NaN.
TEST_F(CudaOps, SwigluClampedMatchesOps) {
  const int64_t n = 1001;
  auto gu = normal(2 * n, 6.0f);
  gu[10] = NAN;  // a gate
  gu[13] = NAN;  // an up
  gpu::DeviceBuffer dgu = up(gu), dh = buffer(n * 4);
  swiglu_clamped(dgu.as<float>(), n, 1.702f, 7.0f, dh.as<float>(), st());
  const auto h = down<float>(dh, n);
  std::vector<float> want(n);
  ops::swiglu_clamped(gu.data(), n, 1.702f, 7.0f, want.data());
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(want[i])) {
      ASSERT_TRUE(std::isnan(h[i])) << i;
      continue;
    }
    ASSERT_NEAR(h[i], want[i], 1e-6f * std::fabs(want[i]) + 1e-38f) << i;
  }
}

TEST_F(CudaOps, SwigluAndSigmoidGatesMatchOps) {
  const int64_t rows = 13, cols = 77, n = rows * cols;
  const auto g = normal(n, 3.0f), u = normal(n), y0 = normal(n), logit = normal(rows, 2.0f);
  gpu::DeviceBuffer dg = up(g), du = up(u), dh = buffer(n * 4), dy = up(y0), dl = up(logit);
  swiglu(dg.as<float>(), du.as<float>(), n, dh.as<float>(), st());
  const auto h = down<float>(dh, n);
  std::vector<float> want(n);
  ops::swiglu(g.data(), u.data(), n, want.data());
  for (int64_t i = 0; i < n; ++i)
    ASSERT_NEAR(h[i], want[i], 1e-6f * std::fabs(want[i]) + 1e-38f) << i;

  add_sigmoid_gated(dy.as<float>(), dh.as<float>(), dl.as<float>(), rows, cols, st());
  const auto y = down<float>(dy, n);
  for (int64_t i = 0; i < n; ++i) {
    const float e = y0[i] + ops::sigmoid(logit[i / cols]) * h[i];
    ASSERT_NEAR(y[i], e, 1e-6f * (std::fabs(y0[i]) + std::fabs(h[i])) + 1e-38f) << i;
  }

  // In place: swiglu's output over its gate.
  swiglu(dg.as<float>(), du.as<float>(), n, dg.as<float>(), st());
  const auto h2 = down<float>(dg, n);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(bits_of(h2[i]), bits_of(h[i])) << i;

  const auto x = uniform(200, -8.0f, 8.0f), gate = uniform(200, -24.0f, 24.0f);
  gpu::DeviceBuffer dx = up(x), dgate = up(gate), dsig = up(gate);
  sigmoid_inplace(dsig.as<float>(), static_cast<int64_t>(gate.size()), st());
  mul_sigmoid(dx.as<float>(), dgate.as<float>(), static_cast<int64_t>(x.size()), st());
  const auto sig = down<float>(dsig, gate.size());
  const auto xs = down<float>(dx, x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float sg = ops::sigmoid(gate[i]);
    ASSERT_NEAR(sig[i], sg, 1e-6f * sg + 1e-30f) << i;
    ASSERT_NEAR(xs[i], x[i] * sg, 1e-6f * std::fabs(x[i] * sg) + 1e-30f) << i;
  }
}

}  // namespace
}  // namespace strata::ops::cuda
