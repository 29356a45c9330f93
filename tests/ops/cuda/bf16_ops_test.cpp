// The kernels' bf16_ops rounding (ops/backend.h "Precision"; a `bf16` flag or a rounding mode on
// each launcher) against the CPU ops' and the CPU backend's same rounding, on random inputs.
//
// Both sides round at the same points and compute the same fp32 steps between them, with two
// differences: expf on the device is within 2 ulp of the host's exp, and some sums run in another
// order. So a rounding to bf16 can come out the other way only where its fp32 argument lies within
// a few fp32 ulp of a midpoint between two bf16 values: a few in 2^16 of the roundings. Each check
// asks that almost every value is bit-identical (kSameFraction) and that the others are close:
// the flipped rounding moves its value by one bf16 ulp (2^-8 relative), which the steps after it
// carry on in proportion to the magnitudes involved (each test's `scale`).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "ops/cuda/attention.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/kda.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/norm.h"
#include "ops/cuda/rope.h"
#include "ops/ops.h"
#include "tests/ops/cuda/cuda_test_util.h"

namespace strata::ops::cuda {
namespace {

constexpr double kSameFraction = 0.99;
constexpr float kUlp = 1.0f / 256.0f;  // one bf16 ulp, relative (2^-8)

// got vs want: at least kSameFraction bit-identical; every value a bf16 value and within
// tol * scale[i] of want[i].
void expect_rounded_alike(const std::vector<float>& got, const std::vector<float>& want,
                          const std::vector<float>& scale, float tol, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  int64_t same = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    same += bits_of(got[i]) == bits_of(want[i]);
    ASSERT_EQ(bits_of(got[i]) & 0xffffu, 0u) << what << " " << i << ": not a bf16 value";
    ASSERT_LE(std::fabs(got[i] - want[i]), tol * scale[i] + 1e-30f)
        << what << " " << i << ": " << got[i] << " vs " << want[i];
  }
  EXPECT_GE(static_cast<double>(same), kSameFraction * static_cast<double>(got.size())) << what;
}

std::vector<float> bf16_values(std::vector<float> v) {
  ops::round_bf16(v.data(), static_cast<int64_t>(v.size()));
  return v;
}

std::vector<float> magnitude(const std::vector<float>& v) {
  std::vector<float> m(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    m[i] = std::fabs(v[i]);
  return m;
}

TEST_F(CudaOps, Bf16OpsElementwiseMatchCpu) {
  const int64_t rows = 29, cols = 77, n = rows * cols;
  const auto g = bf16_values(normal(n, 3.0f)), u = bf16_values(normal(n));
  const auto y0 = bf16_values(normal(n)), logit = normal(rows, 2.0f);
  gpu::DeviceBuffer dg = up(g), du = up(u), dh = buffer(n * 4), dy = up(y0), dl = up(logit);

  swiglu(dg.as<float>(), du.as<float>(), n, dh.as<float>(), st(), true);
  const auto h = down<float>(dh, n);
  std::vector<float> want(n);
  ops::swiglu(g.data(), u.data(), n, want.data(), true);
  expect_rounded_alike(h, want, magnitude(want), 2 * kUlp, "swiglu");

  // CpuBackend::add_sigmoid_gated under bf16_ops.
  add_sigmoid_gated(dy.as<float>(), dh.as<float>(), dl.as<float>(), rows, cols, st(), true);
  const auto y = down<float>(dy, n);
  std::vector<float> gated(n), scale(n);
  for (int64_t i = 0; i < n; ++i) {
    const float w = ops::bf16(ops::sigmoid(ops::bf16(logit[i / cols])));
    gated[i] = ops::bf16(y0[i] + ops::bf16(w * h[i]));
    scale[i] = std::fabs(y0[i]) + std::fabs(h[i]);
  }
  expect_rounded_alike(y, gated, scale, 2 * kUlp, "add_sigmoid_gated");

  // CpuBackend::mul_sigmoid under bf16_ops.
  gpu::DeviceBuffer dx = up(u);
  mul_sigmoid(dx.as<float>(), dg.as<float>(), n, st(), true);
  const auto x = down<float>(dx, n);
  for (int64_t i = 0; i < n; ++i) {
    want[i] = ops::bf16(u[i] * ops::bf16(ops::sigmoid(g[i])));
    scale[i] = std::fabs(u[i]);
  }
  expect_rounded_alike(x, want, scale, 2 * kUlp, "mul_sigmoid");

  // gpt-oss's clamped SwiGLU, values past the limit included.
  const auto gu = bf16_values(normal(2 * n, 6.0f));
  gpu::DeviceBuffer dgu = up(gu), dc = buffer(n * 4);
  swiglu_clamped(dgu.as<float>(), n, 1.702f, 7.0f, dc.as<float>(), st(), true);
  const auto c = down<float>(dc, n);
  ops::swiglu_clamped(gu.data(), n, 1.702f, 7.0f, want.data(), true);
  expect_rounded_alike(c, want, magnitude(want), 2 * kUlp, "swiglu_clamped");
}

TEST_F(CudaOps, Bf16OpsRmsNormMatchesCpuBackend) {
  for (int64_t dim : {64, 9000}) {  // the warp kernel and the block kernel
    const int64_t rows = 19, n = rows * dim;
    const auto x = bf16_values(normal(n, 2.0f));
    const auto w = bf16_values(uniform(dim, 0.5f, 1.5f));
    gpu::DeviceBuffer dx = up(x), dw = up(w), dy = buffer(n * 4);
    // LlamaRMSNorm: x / rms(x) rounded, then times w, rounded.
    rms_norm(dx.as<float>(), rows, dim, dw.as<float>(), 1e-6f, dy.as<float>(), st(), 0.0f,
             NormRounding::kNormalizedFirst);
    auto y = down<float>(dy, n);
    std::vector<float> want(n);
    ops::rms_norm(x.data(), rows, dim, nullptr, 1e-6f, want.data());
    for (int64_t i = 0; i < n; ++i)
      want[i] = ops::bf16(w[i % dim] * ops::bf16(want[i]));
    expect_rounded_alike(y, want, magnitude(want), 2 * kUlp, "rms_norm normalized first");
    // Zero-centred weight (Qwen3-Next): (1 + w) in fp32, one rounding.
    rms_norm(dx.as<float>(), rows, dim, dw.as<float>(), 1e-6f, dy.as<float>(), st(), 1.0f,
             NormRounding::kOnce);
    y = down<float>(dy, n);
    ops::rms_norm(x.data(), rows, dim, w.data(), 1e-6f, want.data(), 1.0f);
    ops::round_bf16(want.data(), n);
    expect_rounded_alike(y, want, magnitude(want), kUlp, "rms_norm once");
  }
}

TEST_F(CudaOps, Bf16OpsRopeMatchesOps) {
  RopeParams yarn;
  yarn.kind = RopeParams::Kind::kYarn;
  yarn.factor = 40.0;
  yarn.original_max_position = 4096;
  yarn.attention_factor = 1.3465735902799727;
  const int64_t T = 37, nH = 3;
  std::vector<int64_t> pos(T);
  std::iota(pos.begin(), pos.end(), int64_t{0});
  gpu::DeviceBuffer dpos = up(pos);
  for (bool interleaved : {false, true}) {
    for (const RopeParams& p : {RopeParams{}, yarn}) {
      const int64_t stride = 64, rot = 32, offset = interleaved ? 32 : 0;
      const auto x = bf16_values(normal(T * nH * stride, 2.0f));
      const std::vector<double> f = ops::rope_inv_freq(p, rot);
      const std::vector<float> f32(f.begin(), f.end());
      gpu::DeviceBuffer dx = up(x), df = up(f32);
      rope(dx.as<float>(), T, nH, stride, offset, rot, dpos.as<int64_t>(), df.as<float>(),
           p.attention_factor, interleaved, st(), true);
      const auto got = down<float>(dx, x.size());
      std::vector<float> want = x;
      ops::rope(want.data(), T, nH, stride, offset, rot, pos.data(), f, p.attention_factor,
                interleaved, true);
      // A pair's outputs are sums of two rounded products: scale by the pair's magnitude.
      std::vector<float> scale(x.size());
      for (int64_t th = 0; th < T * nH; ++th) {
        float m = 0.0f;
        for (int64_t c = 0; c < stride; ++c)
          m = std::max(m, std::fabs(x[th * stride + c]));
        std::fill_n(&scale[th * stride], stride, 2.0f * m * static_cast<float>(p.attention_factor));
      }
      expect_rounded_alike(got, want, scale, 2 * kUlp, interleaved ? "rope interleaved" : "rope");
    }
  }
}

TEST_F(CudaOps, Bf16OpsConvSiluMatchesOps) {
  const int64_t T = 23, C = 96, K = 4;
  std::vector<int64_t> start(T, 0);
  for (int64_t t = 11; t < T; ++t)
    start[t] = 11;  // two sequences: [0, 11) and [11, 23)
  const auto x = bf16_values(normal(T * C)), w = bf16_values(normal(C * K, 0.5f));
  gpu::DeviceBuffer dx = up(x), dw = up(w), ds = up(start), dy = buffer(T * C * 4);
  kda_conv_silu(dx.as<float>(), T, C, dw.as<float>(), K, ds.as<int64_t>(), dy.as<float>(), st(),
                true);
  const auto y = down<float>(dy, T * C);
  std::vector<float> want(T * C), scale(T * C);
  ops::causal_conv1d(x.data(), C, 11, C, w.data(), K, want.data());
  ops::causal_conv1d(x.data() + 11 * C, C, T - 11, C, w.data(), K, want.data() + 11 * C);
  for (int64_t i = 0; i < T * C; ++i) {
    want[i] = ops::bf16(ops::silu(ops::bf16(want[i])));
    scale[i] = 0.0f;
    for (int64_t j = 0; j < K; ++j)  // the convolution's terms: another summation order
      scale[i] += std::fabs(w[(i % C) * K + j]) * 3.0f;
  }
  expect_rounded_alike(y, want, scale, 2 * kUlp, "kda_conv_silu");
}

// The warp kernel's two rounding modes against ops::attention_causal's, per sequence.
TEST_F(CudaOps, Bf16OpsWarpAttentionMatchesOps) {
  const int64_t nH = 4, nKV = 2, d = 32;
  const std::vector<int64_t> lens = {1, 7, 17, 40};
  std::vector<int64_t> off = {0}, start;
  for (int64_t l : lens) {
    for (int64_t i = 0; i < l; ++i)
      start.push_back(off.back());
    off.push_back(off.back() + l);
  }
  const int64_t T = off.back();
  gpu::DeviceBuffer dstart = up(start);
  const auto q = bf16_values(normal(T * nH * d, 2.0f)), k = bf16_values(normal(T * nKV * d, 2.0f));
  const auto v = bf16_values(normal(T * nKV * d));
  const auto sinks = bf16_values(normal(nH));
  const float scale = 0.25f;
  gpu::DeviceBuffer dq = up(q), dk = up(k), dv = up(v), ds = up(sinks),
                    dout = buffer(T * nH * d * 4);
  for (const bool eager : {false, true}) {
    attention(dq.as<float>(), nH * d, dk.as<float>(), nKV * d, dv.as<float>(), nKV * d, T, nH, nKV,
              d, d, scale, dstart.as<int64_t>(), dout.as<float>(), st(), eager ? 4 : 0,
              eager ? ds.as<float>() : nullptr, nullptr, 0,
              eager ? AttentionRounding::kEager : AttentionRounding::kFlash);
    const auto out = down<float>(dout, T * nH * d);
    std::vector<float> want(T * nH * d);
    for (size_t sq = 0; sq < lens.size(); ++sq) {
      const int64_t t0 = off[sq];
      ops::attention_causal(q.data() + t0 * nH * d, nH * d, k.data() + t0 * nKV * d, nKV * d,
                            v.data() + t0 * nKV * d, nKV * d, lens[sq], nH, nKV, d, d, scale,
                            want.data() + t0 * nH * d, eager ? sinks.data() : nullptr,
                            eager ? 4 : 0, nullptr, 0,
                            eager ? ops::Bf16Attention::kEager : ops::Bf16Attention::kFlash);
    }
    // A probability rounded the other way moves the output by one ulp of it times |v|.
    float vmax = 0.0f;
    for (float x : v)
      vmax = std::max(vmax, std::fabs(x));
    std::vector<float> sc(want.size());
    for (size_t i = 0; i < want.size(); ++i)
      sc[i] = std::fabs(want[i]) + vmax;
    expect_rounded_alike(out, want, sc, 2 * kUlp, eager ? "attention eager" : "attention flash");
  }
}

// causal_softmax's rounding modes against the rows the CPU's attention would form.
TEST_F(CudaOps, Bf16OpsCausalSoftmaxRounds) {
  const int64_t batch = 3, L = 33;
  const float scale = 0.3f;
  const auto sc = normal(batch * L * L, 4.0f);
  for (const bool eager : {false, true}) {
    gpu::DeviceBuffer ds = up(sc);
    causal_softmax(ds.as<float>(), batch, L, scale, st(), 0, nullptr, 1, nullptr, 0,
                   eager ? AttentionRounding::kEager : AttentionRounding::kFlash);
    const auto p = down<float>(ds, sc.size());
    std::vector<float> want(sc.size(), 0.0f), mag(sc.size());
    for (int64_t r = 0; r < batch * L; ++r) {
      const int64_t i = r % L;
      std::vector<float> s(static_cast<size_t>(i + 1));
      float mx = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {
        s[j] = eager ? ops::bf16(ops::bf16(sc[r * L + j]) * scale) : sc[r * L + j] * scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j <= i; ++j) {
        s[j] = std::exp(eager ? ops::bf16(s[j] - mx) : s[j] - mx);
        sum += s[j];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j <= i; ++j) {
        // kFlash: bf16(e) * (1 / sum) in fp32; kEager: bf16(e / sum).
        want[r * L + j] = eager ? ops::bf16(s[j] * inv) : ops::bf16(s[j]) * inv;
        mag[r * L + j] = s[j] * inv;
      }
    }
    // kEager's outputs are bf16 values: bit-identical but for the rare flipped rounding. kFlash's
    // are fp32, bf16(e) times 1 / sum, where the sum adds the unrounded exponentials: the device's
    // expf, within 2 ulp of the host's, moves it by an fp32 ulp or so in many rows (on the H200,
    // 2,859 of 3,267 values were bit-identical), so there "alike" is within 4 fp32 ulp
    // (2^-21 relative), a thousandth of a flipped bf16 rounding.
    int64_t same = 0;
    for (size_t x = 0; x < p.size(); ++x) {
      same += eager ? bits_of(p[x]) == bits_of(want[x])
                    : std::fabs(p[x] - want[x]) <= std::ldexp(std::fabs(want[x]), -21);
      ASSERT_LE(std::fabs(p[x] - want[x]), 2 * kUlp * mag[x] + 1e-30f) << x;
    }
    EXPECT_GE(static_cast<double>(same), kSameFraction * static_cast<double>(p.size()))
        << (eager ? "eager" : "flash");
  }
}

// moe_combine's bf16 mode: CpuBackend::moe's order (increasing expert) and roundings.
TEST_F(CudaOps, Bf16OpsMoeCombineInExpertOrder) {
  const int64_t T = 31, K = 3, E = 8, H = 40, S = T * K;
  std::vector<int32_t> chosen(S), counts(E, 0), offsets(E, 0);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> e(E);
    std::iota(e.begin(), e.end(), 0);
    std::shuffle(e.begin(), e.end(), rng());
    std::copy_n(e.begin(), K, &chosen[t * K]);  // in no particular order
  }
  for (int32_t e : chosen)
    ++counts[e];
  for (int64_t e = 1; e < E; ++e)
    offsets[e] = offsets[e - 1] + counts[e - 1];
  gpu::DeviceBuffer dc = up(chosen), doff = up(offsets), dcur = up(std::vector<int32_t>(E, 0));
  gpu::DeviceBuffer dpos = buffer(S * 4), drow = buffer(S * 4);
  moe_scatter(dc.as<int32_t>(), S, doff.as<int32_t>(), dcur.as<int32_t>(), dpos.as<int32_t>(),
              drow.as<int32_t>(), st());
  const auto pos = down<int32_t>(dpos, S);
  const auto outg = bf16_values(normal(S * H)), w = uniform(S, 0.05f, 1.0f);
  gpu::DeviceBuffer dog = up(outg), dw = up(w), dy = buffer(T * H * 4);
  moe_combine(dog.as<float>(), dpos.as<int32_t>(), dw.as<float>(), T, K, H, dy.as<float>(), st(),
              true);
  const auto y = down<float>(dy, T * H);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int64_t> order(K);
    std::iota(order.begin(), order.end(), int64_t{0});
    std::sort(order.begin(), order.end(),
              [&](int64_t a, int64_t b) { return chosen[t * K + a] < chosen[t * K + b]; });
    for (int64_t c = 0; c < H; ++c) {
      float acc = 0.0f;
      for (int64_t j : order)
        acc = ops::bf16(acc + ops::bf16(w[t * K + j] * outg[pos[t * K + j] * H + c]));
      ASSERT_EQ(bits_of(y[t * H + c]), bits_of(acc)) << t << "," << c;  // no exp, one order
    }
  }
}

}  // namespace
}  // namespace strata::ops::cuda
