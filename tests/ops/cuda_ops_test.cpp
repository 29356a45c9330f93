// Every CUDA op of ops/cuda/ops_cuda.h against the CPU reference (ops/ops.h, or the routing
// formulas of spec/architectures.md written out here) on fresh random inputs. Label `gpu`:
// skipped where no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "ops/cuda/ops_cuda.h"
#include "ops/ops.h"

namespace strata::ops {
namespace {

namespace gpu = strata::ops::cuda;
using strata::cuda::copy_to_device;
using strata::cuda::copy_to_host;
using strata::cuda::DeviceBuffer;
using strata::cuda::Stream;

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    stream_ = std::make_unique<Stream>(0);
  }
  Stream& s() { return *stream_; }

  template <typename T>
  DeviceBuffer up(const std::vector<T>& v) {
    DeviceBuffer b(std::max<size_t>(v.size(), 1) * sizeof(T));
    copy_to_device(b.data(), v.data(), v.size() * sizeof(T), s());
    s().synchronize();
    return b;
  }
  template <typename T>
  std::vector<T> down(const DeviceBuffer& b, size_t n) {
    std::vector<T> v(n);
    copy_to_host(v.data(), b.data(), n * sizeof(T), s());
    return v;
  }

  std::mt19937 rng_{12345};
  std::vector<float> normal(size_t n, float sd = 1.0f) {
    std::normal_distribution<float> d(0.0f, sd);
    std::vector<float> v(n);
    for (float& x : v)
      x = d(rng_);
    return v;
  }
  std::vector<uint16_t> bf16_of(const std::vector<float>& v) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      b[i] = f32_to_bf16(v[i]);
    return b;
  }
  std::vector<float> f32_of(const std::vector<uint16_t>& b) {
    std::vector<float> v(b.size());
    for (size_t i = 0; i < b.size(); ++i)
      v[i] = bf16_to_f32(b[i]);
    return v;
  }

 private:
  std::unique_ptr<Stream> stream_;
};

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// ---- conversions ---------------------------------------------------------------------------

TEST_F(CudaOps, Bf16ConversionsMatchCoreBitForBit) {
  std::vector<float> x = normal(5000, 100.0f);
  // Ties, overflow to inf, subnormals, signed zeros, NaN.
  const uint32_t special[] = {0x3F808000u, 0x3F818000u, 0x7F7FFFFFu, 0x7F7F8000u, 0x00000001u,
                              0x80008000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00001u};
  for (uint32_t u : special) {
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);
  }
  const size_t n = x.size();
  DeviceBuffer dx = up(x), dy(n * 2), dr(n * 4);
  gpu::f32_to_bf16(dx.as<float>(), n, dy.as<uint16_t>(), s());
  gpu::bf16_to_f32(dy.as<uint16_t>(), n, dr.as<float>(), s());
  const auto y = down<uint16_t>(dy, n);
  const auto back = down<float>(dr, n);
  gpu::round_bf16(dx.as<float>(), n, s());
  const auto rounded = down<float>(dx, n);
  std::vector<float> cpu = x;
  ops::round_bf16(cpu.data(), n);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(y[i], f32_to_bf16(x[i])) << "element " << i << " = " << x[i];
    ASSERT_EQ(bits(back[i]), bits(bf16_to_f32(y[i]))) << i;
    ASSERT_EQ(bits(rounded[i]), bits(cpu[i])) << i;
  }
}

// ---- GEMMs --------------------------------------------------------------------------------

// Both sides multiply the same bf16 values exactly and accumulate k products in fp32 in
// different orders: each result lies within k * u * Σ|x_i w_i| of the exact sum (u = 2^-24 for
// round-to-nearest; tensor-core accumulation may truncate, 2u), so the two differ by at most
// 2 * k * 2u * Σ|x_i w_i|; adding the bias rounds once more (one ulp of the result).
void expect_gemm_close(const std::vector<float>& got, const std::vector<float>& want,
                       const std::vector<float>& x, const std::vector<float>& w, int64_t m,
                       int64_t k, int64_t n, const char* what) {
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c) {
      double mag = 0.0;
      for (int64_t d = 0; d < k; ++d)
        mag += std::fabs(static_cast<double>(x[r * k + d]) * w[c * k + d]);
      const double tol = 4.0 * static_cast<double>(k) * 0x1p-24 * mag +
                         0x1p-23 * std::fabs(want[r * n + c]) + 1e-30;
      ASSERT_NEAR(got[r * n + c], want[r * n + c], tol)
          << what << " m=" << m << " k=" << k << " n=" << n << " at " << r << "," << c;
    }
  }
}

TEST_F(CudaOps, LinearMatchesCpuWithinAccumulationBound) {
  const int64_t shapes[][3] = {{64, 256, 384}, {1, 16, 8}, {7, 37, 13}, {33, 128, 65}, {3, 1, 5}};
  for (const auto& sh : shapes) {
    const int64_t m = sh[0], k = sh[1], n = sh[2];
    const int64_t fallbacks = gpu::gemm_fallback_count();
    std::vector<float> x = normal(m * k);
    const std::vector<uint16_t> wb = bf16_of(normal(n * k, 0.05f));
    const std::vector<float> w = f32_of(wb);
    const std::vector<float> bias = normal(n);
    DeviceBuffer dx = up(x), dw = up(wb), dbias = up(bias), dy(m * n * 4), dxb(m * k * 2);
    gpu::linear(dx.as<float>(), m, k, dw.as<uint16_t>(), n, dy.as<float>(), s(), dbias.as<float>());
    const auto y = down<float>(dy, m * n);
    // The GPU rounds x to bf16 first; the CPU reference gets the same rounded x.
    std::vector<float> xr = x;
    ops::round_bf16(xr.data(), m * k);
    std::vector<float> want(m * n);
    ops::linear(xr.data(), m, k, w.data(), n, want.data(), bias.data());
    expect_gemm_close(y, want, xr, w, m, k, n, "linear");

    // linear_bf16 from the same bf16 x, without bias.
    gpu::f32_to_bf16(dx.as<float>(), m * k, dxb.as<uint16_t>(), s());
    gpu::linear_bf16(dxb.as<uint16_t>(), m, k, dw.as<uint16_t>(), n, dy.as<float>(), s());
    const auto y2 = down<float>(dy, m * n);
    ops::linear(xr.data(), m, k, w.data(), n, want.data());
    expect_gemm_close(y2, want, xr, w, m, k, n, "linear_bf16");
    // Aligned shapes must run on cuBLASLt, not on the fallback kernel.
    if (k % 8 == 0 && n % 8 == 0) {
      EXPECT_EQ(gpu::gemm_fallback_count(), fallbacks) << m << "x" << k;
    }
  }
}

TEST_F(CudaOps, GroupedLinearMatchesPerGroupCpu) {
  const int64_t k = 40, n = 24;
  const std::vector<int64_t> rows = {5, 0, 1, 17, 0, 8};  // empty groups included
  const int64_t G = static_cast<int64_t>(rows.size());
  std::vector<int64_t> off(G + 1, 0);
  for (int64_t g = 0; g < G; ++g)
    off[g + 1] = off[g] + rows[g];
  const int64_t R = off[G];
  std::vector<float> x = normal(R * k);
  std::vector<std::vector<uint16_t>> wb(G);
  std::vector<DeviceBuffer> dw;
  std::vector<const uint16_t*> wptr(G);
  for (int64_t g = 0; g < G; ++g) {
    wb[g] = bf16_of(normal(n * k, 0.1f));
    dw.push_back(up(wb[g]));
    wptr[g] = rows[g] > 0 ? dw.back().as<uint16_t>() : nullptr;
  }
  DeviceBuffer dx = up(x), dy(R * n * 4);
  gpu::linear_grouped(dx.as<float>(), off.data(), G, k, wptr.data(), n, dy.as<float>(), s());
  const auto y = down<float>(dy, R * n);
  std::vector<float> xr = x;
  ops::round_bf16(xr.data(), R * k);
  for (int64_t g = 0; g < G; ++g) {
    if (rows[g] == 0) continue;
    const std::vector<float> w = f32_of(wb[g]);
    std::vector<float> want(rows[g] * n);
    std::vector<float> xg(xr.begin() + off[g] * k, xr.begin() + off[g + 1] * k);
    ops::linear(xg.data(), rows[g], k, w.data(), n, want.data());
    std::vector<float> got(y.begin() + off[g] * n, y.begin() + off[g + 1] * n);
    expect_gemm_close(got, want, xg, w, rows[g], k, n, "linear_grouped");
  }
}

// ---- element-wise and row-wise -------------------------------------------------------------

TEST_F(CudaOps, RmsNormMatchesCpu) {
  const int64_t shapes[][2] = {{1, 1}, {3, 17}, {9, 1000}, {4, 4096}};
  for (const auto& sh : shapes) {
    const int64_t rows = sh[0], dim = sh[1];
    const auto x = normal(rows * dim, 3.0f);
    const auto w = normal(dim);
    DeviceBuffer dx = up(x), dw = up(w), dy(rows * dim * 4);
    for (bool with_w : {true, false}) {
      gpu::rms_norm(dx.as<float>(), rows, dim, with_w ? dw.as<float>() : nullptr, 1e-6f,
                    dy.as<float>(), s());
      const auto y = down<float>(dy, rows * dim);
      std::vector<float> want(rows * dim);
      ops::rms_norm(x.data(), rows, dim, with_w ? w.data() : nullptr, 1e-6f, want.data());
      // Same fp32 steps; only the fp64 sum of squares is added in another order, which can move
      // the fp32 mean by one ulp: a few ulps on the result.
      for (int64_t i = 0; i < rows * dim; ++i)
        ASSERT_NEAR(y[i], want[i], 1e-6f * std::fabs(want[i]) + 1e-37f) << i;
    }
  }
}

TEST_F(CudaOps, SoftmaxMatchesCpu) {
  const int64_t shapes[][2] = {{1, 1}, {5, 7}, {3, 300}, {2, 5000}};
  for (const auto& sh : shapes) {
    const int64_t rows = sh[0], dim = sh[1];
    auto x = normal(rows * dim, 4.0f);
    DeviceBuffer dx = up(x);
    gpu::softmax(dx.as<float>(), rows, dim, s());
    const auto y = down<float>(dx, rows * dim);
    ops::softmax(x.data(), rows, dim);
    // expf on the GPU is within 2 ulp of the CPU's exp; the fp64 sum order differs.
    for (int64_t i = 0; i < rows * dim; ++i)
      ASSERT_NEAR(y[i], x[i], 1e-6f * x[i] + 1e-38f) << i;
  }
}

TEST_F(CudaOps, SwigluAddGateAndCopyMatchCpu) {
  const int64_t rows = 13, cols = 77, n = rows * cols;
  const auto g = normal(n, 3.0f), u = normal(n), yv = normal(n), logit = normal(rows, 2.0f);
  DeviceBuffer dg = up(g), du = up(u), dh(n * 4), dy = up(yv), dl = up(logit);
  gpu::swiglu(dg.as<float>(), du.as<float>(), n, dh.as<float>(), s());
  const auto h = down<float>(dh, n);
  std::vector<float> want(n);
  ops::swiglu(g.data(), u.data(), n, want.data());
  for (int64_t i = 0; i < n; ++i)
    ASSERT_NEAR(h[i], want[i], 1e-6f * std::fabs(want[i]) + 1e-38f) << i;

  gpu::add_sigmoid_gated(dy.as<float>(), dh.as<float>(), dl.as<float>(), rows, cols, s());
  gpu::add(dy.as<float>(), dg.as<float>(), n, s());
  const auto y = down<float>(dy, n);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      const float e = (yv[i] + ops::sigmoid(logit[r]) * h[i]) + g[i];
      ASSERT_NEAR(y[i], e, 1e-6f * (std::fabs(yv[i]) + std::fabs(h[i]) + std::fabs(g[i]))) << i;
    }
  }

  DeviceBuffer dc(rows * 5 * 4);
  gpu::copy_cols(dg.as<float>() + 3, cols, dc.as<float>(), 5, rows, 5, s());
  const auto c = down<float>(dc, rows * 5);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < 5; ++j)
      ASSERT_EQ(bits(c[r * 5 + j]), bits(g[r * cols + 3 + j]));
}

// ---- RoPE ----------------------------------------------------------------------------------

TEST_F(CudaOps, RopeVariantsMatchCpu) {
  RopeParams def;
  RopeParams lin;
  lin.kind = RopeParams::Kind::kLinear;
  lin.factor = 4.0;
  RopeParams l3;
  l3.kind = RopeParams::Kind::kLlama3;
  l3.theta = 500000.0;
  l3.factor = 8.0;
  l3.original_max_position = 8192;
  RopeParams yarn;
  yarn.kind = RopeParams::Kind::kYarn;
  yarn.factor = 40.0;
  yarn.original_max_position = 4096;
  yarn.attention_factor = 1.3465735902799727;
  struct Case {
    RopeParams p;
    int64_t head_stride, offset, rot_dim;
    bool interleaved;
  };
  const Case cases[] = {{def, 64, 0, 64, false},     {lin, 32, 0, 16, false},
                        {l3, 128, 0, 128, false},    {yarn, 192, 128, 64, true},
                        {yarn, 192, 128, 64, false}, {def, 10, 2, 6, true}};
  const int64_t T = 37, nH = 3;
  std::vector<int64_t> pos(T);
  for (int64_t t = 0; t < T; ++t)
    pos[t] = (t * 977) % 6000;  // ragged positions, not in order
  DeviceBuffer dpos = up(pos);
  for (const Case& c : cases) {
    auto x = normal(T * nH * c.head_stride);
    const std::vector<double> f = rope_inv_freq(c.p, c.rot_dim);
    std::vector<float> ff(f.begin(), f.end());
    DeviceBuffer dx = up(x), df = up(ff);
    gpu::rope(dx.as<float>(), T, nH, c.head_stride, c.offset, c.rot_dim, dpos.as<int64_t>(),
              df.as<float>(), c.p.attention_factor, c.interleaved, s());
    const auto y = down<float>(dx, x.size());
    const std::vector<float> x0 = x;
    ops::rope(x.data(), T, nH, c.head_stride, c.offset, c.rot_dim, pos.data(), f,
              c.p.attention_factor, c.interleaved);
    // Same fp32 angle; cos/sin may differ by one ulp between the two math libraries.
    for (size_t i = 0; i < x.size(); ++i) {
      const float mag = std::fabs(x0[i]) + 1.0f;
      ASSERT_NEAR(y[i], x[i], 1e-6f * mag * 4) << "case rot_dim " << c.rot_dim << " at " << i;
    }
  }
}

// ---- attention -----------------------------------------------------------------------------

TEST_F(CudaOps, RaggedCausalAttentionMatchesCpuPerSequence) {
  struct Case {
    int64_t nH, nKV, dq, dv, q_stride, k_stride, v_stride;
  };
  // GQA (head_dim 64, 4 query heads per kv head), MHA with odd dims, and an MLA-like layout
  // (dq = 128 + 64, dv = 128, k and v rows strided as slices of one fused [k | v] buffer).
  const Case cases[] = {{8, 2, 64, 64, 8 * 64, 2 * 64, 2 * 64},
                        {3, 3, 37, 19, 3 * 37 + 5, 3 * 37, 3 * 19 + 1},
                        {4, 4, 192, 128, 4 * 192, 4 * (192 + 128), 4 * (192 + 128)}};
  const std::vector<int64_t> lens = {1, 5, 17, 64, 2};
  std::vector<int64_t> off = {0};
  for (int64_t l : lens)
    off.push_back(off.back() + l);
  const int64_t T = off.back(), n_seq = static_cast<int64_t>(lens.size());
  DeviceBuffer doff = up(off);
  for (const Case& c : cases) {
    const auto q = normal(T * c.q_stride), k = normal(T * c.k_stride), v = normal(T * c.v_stride);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.dq));
    DeviceBuffer dq = up(q), dk = up(k), dv = up(v), dout(T * c.nH * c.dv * 4);
    gpu::attention_causal(dq.as<float>(), c.q_stride, dk.as<float>(), c.k_stride, dv.as<float>(),
                          c.v_stride, doff.as<int64_t>(), n_seq, T, c.nH, c.nKV, c.dq, c.dv, scale,
                          dout.as<float>(), s());
    const auto out = down<float>(dout, T * c.nH * c.dv);
    for (int64_t sq = 0; sq < n_seq; ++sq) {
      const int64_t t0 = off[sq], L = lens[sq];
      std::vector<float> want(L * c.nH * c.dv);
      ops::attention_causal(q.data() + t0 * c.q_stride, c.q_stride, k.data() + t0 * c.k_stride,
                            c.k_stride, v.data() + t0 * c.v_stride, c.v_stride, L, c.nH, c.nKV,
                            c.dq, c.dv, scale, want.data());
      // Online softmax vs two-pass, different summation orders: fp32 rounding only.
      for (int64_t i = 0; i < L * c.nH * c.dv; ++i)
        ASSERT_NEAR(out[t0 * c.nH * c.dv + i], want[i], 2e-5f * (1.0f + std::fabs(want[i])))
            << "seq " << sq << " element " << i << " dq " << c.dq;
    }
  }
}

// ---- routing -------------------------------------------------------------------------------

TEST_F(CudaOps, TopKMatchesCpuExactlyWithTies) {
  const int64_t shapes[][3] = {{1, 1, 1}, {9, 8, 2}, {31, 64, 8}, {4, 257, 13}};
  std::uniform_int_distribution<int> level(-4, 4);
  for (const auto& sh : shapes) {
    const int64_t rows = sh[0], n = sh[1], k = sh[2];
    std::vector<float> x(rows * n);
    for (float& v : x)
      v = static_cast<float>(level(rng_)) * 0.5f;  // few levels: many ties
    x[0] = -INFINITY;
    DeviceBuffer dx = up(x), di(rows * k * 4);
    gpu::top_k(dx.as<float>(), rows, n, k, di.as<int32_t>(), s());
    const auto idx = down<int32_t>(di, rows * k);
    for (int64_t r = 0; r < rows; ++r) {
      const auto want = ops::top_k(&x[r * n], n, k);
      for (int64_t j = 0; j < k; ++j)
        ASSERT_EQ(idx[r * k + j], want[j]) << "row " << r << " pick " << j;
    }
  }
}

// The k-th and (k+1)-th largest of v differ by more than `gap` (relative): a selection that does
// not hinge on the last ulp of exp.
bool clear_cut(std::vector<float> v, int64_t k, float gap) {
  if (k >= static_cast<int64_t>(v.size())) return true;
  std::sort(v.begin(), v.end(), std::greater<float>());
  return v[k - 1] - v[k] > gap * std::fabs(v[k - 1]);
}

TEST_F(CudaOps, SoftmaxRoutingMatchesQwenMoeFormula) {
  const int64_t T = 50, E = 60, K = 4;
  for (bool renorm : {true, false}) {
    const auto logits = normal(T * E, 2.0f);
    DeviceBuffer dl = up(logits), dc(T * K * 4), dw(T * K * 4);
    gpu::route_softmax_topk(dl.as<float>(), T, E, K, renorm, dc.as<int32_t>(), dw.as<float>(), s());
    const auto chosen = down<int32_t>(dc, T * K);
    const auto weight = down<float>(dw, T * K);
    // spec/architectures.md §2: p = softmax_fp32(logits); top-k; w = p_top (/ Σ p_top).
    std::vector<float> p = logits;
    ops::softmax(p.data(), T, E);
    int checked = 0;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<float> row(p.begin() + t * E, p.begin() + (t + 1) * E);
      if (!clear_cut(row, K, 1e-5f)) continue;
      ++checked;
      const auto idx = ops::top_k(row.data(), E, K);
      float sum = 0.0f;
      for (int64_t j = 0; j < K; ++j)
        sum += row[idx[j]];
      for (int64_t j = 0; j < K; ++j) {
        ASSERT_EQ(chosen[t * K + j], idx[j]) << "token " << t;
        const float w = row[idx[j]] / (renorm ? sum : 1.0f);
        ASSERT_NEAR(weight[t * K + j], w, 2e-6f * w) << "token " << t;
      }
    }
    EXPECT_GT(checked, T * 9 / 10);
  }
}

TEST_F(CudaOps, SigmoidGroupedRoutingMatchesDeepseekFormula) {
  struct Case {
    int64_t E, K, n_group, topk_group;
    bool renorm, bias;
    float scaling;
  };
  const Case cases[] = {{64, 6, 8, 3, true, true, 2.5f},
                        {16, 2, 1, 1, false, true, 1.0f},
                        {12, 3, 4, 2, true, false, 1.5f}};
  const int64_t T = 40;
  for (const Case& c : cases) {
    const auto logits = normal(T * c.E, 2.0f);
    const auto bias = normal(c.E, 0.5f);
    DeviceBuffer dl = up(logits), db = up(bias), dc(T * c.K * 4), dw(T * c.K * 4);
    gpu::route_sigmoid_grouped(dl.as<float>(), T, c.E, c.K, c.bias ? db.as<float>() : nullptr,
                               c.n_group, c.topk_group, c.renorm, c.scaling, dc.as<int32_t>(),
                               dw.as<float>(), s());
    const auto chosen = down<int32_t>(dc, T * c.K);
    const auto weight = down<float>(dw, T * c.K);
    // spec/architectures.md §3 (noaux_tc), as model/deepseek_v3.cpp computes it.
    const int64_t per = c.E / c.n_group;
    int checked = 0;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<float> sc(c.E), choice(c.E);
      for (int64_t e = 0; e < c.E; ++e) {
        sc[e] = ops::sigmoid(logits[t * c.E + e]);
        choice[e] = sc[e] + (c.bias ? bias[e] : 0.0f);
      }
      std::vector<float> group_score(c.n_group);
      for (int64_t g = 0; g < c.n_group; ++g) {
        auto top = ops::top_k(&choice[g * per], per, std::min<int64_t>(2, per));
        float sum = 0.0f;
        for (int32_t i : top)
          sum += choice[g * per + i];
        group_score[g] = sum;
      }
      auto keep = ops::top_k(group_score.data(), c.n_group, c.topk_group);
      std::vector<float> masked(c.E, -INFINITY);
      for (int32_t g : keep)
        std::copy_n(&choice[g * per], per, &masked[g * per]);
      if (!clear_cut(group_score, c.topk_group, 1e-5f) || !clear_cut(masked, c.K, 1e-5f)) continue;
      ++checked;
      auto idx = ops::top_k(masked.data(), c.E, c.K);
      float sum = 0.0f;
      for (int64_t j = 0; j < c.K; ++j)
        sum += sc[idx[j]];
      for (int64_t j = 0; j < c.K; ++j) {
        ASSERT_EQ(chosen[t * c.K + j], idx[j]) << "token " << t << " E " << c.E;
        float w = sc[idx[j]];
        if (c.renorm) w /= (sum + 1e-20f);
        w *= c.scaling;
        ASSERT_NEAR(weight[t * c.K + j], w, 2e-6f * w) << "token " << t;
      }
    }
    EXPECT_GT(checked, T * 8 / 10);
  }
}

TEST_F(CudaOps, MoeSortGatherCombineMatchCpuDispatch) {
  const int64_t T = 37, K = 3, E = 11, H = 21, S = T * K;
  std::vector<int32_t> chosen(S);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> e(E);
    std::iota(e.begin(), e.end(), 0);
    std::shuffle(e.begin(), e.end() - 2, rng_);  // experts 9 and 10 are never chosen
    std::copy_n(e.begin(), K, &chosen[t * K]);
  }
  const auto x = normal(T * H), weight = normal(S);
  DeviceBuffer dc = up(chosen), dsorted(S * 4), dinv(S * 4), doff((E + 1) * 8), dx = up(x),
               dg(S * H * 4), dw = up(weight), dy(T * H * 4), damax((E + 1) * 4);
  std::vector<int64_t> off(E + 1);
  gpu::moe_sort(dc.as<int32_t>(), T, K, E, dsorted.as<int32_t>(), dinv.as<int32_t>(),
                doff.as<int64_t>(), off.data(), s());
  const auto sorted = down<int32_t>(dsorted, S);
  const auto inv = down<int32_t>(dinv, S);
  // The CPU dispatch visits experts in order and, per expert, slots in increasing order.
  std::vector<int32_t> want_sorted;
  std::vector<int64_t> want_off = {0};
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t sl = 0; sl < S; ++sl)
      if (chosen[sl] == e) want_sorted.push_back(static_cast<int32_t>(sl));
    want_off.push_back(static_cast<int64_t>(want_sorted.size()));
  }
  ASSERT_EQ(sorted, want_sorted);
  ASSERT_EQ(off, want_off);
  ASSERT_EQ(down<int64_t>(doff, E + 1), want_off);
  for (int64_t r = 0; r < S; ++r)
    ASSERT_EQ(inv[sorted[r]], r);

  gpu::moe_gather(dx.as<float>(), H, dsorted.as<int32_t>(), S, K, dg.as<float>(), s());
  const auto g = down<float>(dg, S * H);
  for (int64_t r = 0; r < S; ++r)
    for (int64_t c = 0; c < H; ++c)
      ASSERT_EQ(bits(g[r * H + c]), bits(x[(sorted[r] / K) * H + c]));

  // Per-expert amax over exactly the rows routed to it; a preset value above stays.
  std::vector<float> preset(E + 1, 0.0f);
  preset[3] = 100.0f;
  copy_to_device(damax.data(), preset.data(), preset.size() * 4, s());
  gpu::amax_grouped(dg.as<float>(), H, doff.as<int64_t>(), E, damax.as<float>(), s());
  const auto am = down<float>(damax, E + 1);
  for (int64_t e = 0; e < E; ++e) {
    float want = preset[e];
    for (int64_t r = off[e]; r < off[e + 1]; ++r)
      want = std::max(want, ops::amax(&g[r * H], H));
    ASSERT_EQ(bits(am[e]), bits(want)) << "expert " << e;
  }
  ASSERT_EQ(am[E], 0.0f);  // not a group: untouched

  // Combine: the expert outputs here are the gathered rows scaled by their row number.
  std::vector<float> eo(S * H);
  for (int64_t r = 0; r < S; ++r)
    for (int64_t c = 0; c < H; ++c)
      eo[r * H + c] = g[r * H + c] * static_cast<float>(r + 1);
  DeviceBuffer deo = up(eo);
  gpu::moe_combine(deo.as<float>(), dinv.as<int32_t>(), dw.as<float>(), T, K, H, dy.as<float>(),
                   s());
  const auto y = down<float>(dy, T * H);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < H; ++c) {
      float acc = 0.0f;
      for (int64_t j = 0; j < K; ++j)
        acc += weight[t * K + j] * eo[inv[t * K + j] * H + c];
      ASSERT_EQ(bits(y[t * H + c]), bits(acc)) << t << "," << c;
    }
  }

  chosen[5] = static_cast<int32_t>(E);  // out of range
  DeviceBuffer dbad = up(chosen);
  EXPECT_THROW(gpu::moe_sort(dbad.as<int32_t>(), T, K, E, dsorted.as<int32_t>(), dinv.as<int32_t>(),
                             doff.as<int64_t>(), off.data(), s()),
               Error);
}

// ---- amax ----------------------------------------------------------------------------------

TEST_F(CudaOps, AmaxIsExactAndPropagatesNan) {
  for (int64_t n : {1, 7, 1000, 300001}) {
    auto x = normal(n, 10.0f);
    const std::vector<uint16_t> xb = bf16_of(x);
    DeviceBuffer dx = up(x), dxb = up(xb), dout(8);
    strata::cuda::fill_zero(dout.data(), 8, s());
    gpu::amax(dx.as<float>(), n, dout.as<float>(), s());
    gpu::amax_bf16(dxb.as<uint16_t>(), n, dout.as<float>() + 1, s());
    const auto a = down<float>(dout, 2);
    ASSERT_EQ(bits(a[0]), bits(ops::amax(x.data(), n))) << n;
    const auto xf = f32_of(xb);
    ASSERT_EQ(bits(a[1]), bits(ops::amax(xf.data(), n))) << n;
    // Accumulates: a second, smaller tensor leaves the slot unchanged.
    std::vector<float> small(5, 1e-3f);
    DeviceBuffer ds = up(small);
    gpu::amax(ds.as<float>(), 5, dout.as<float>(), s());
    ASSERT_EQ(bits(down<float>(dout, 1)[0]), bits(a[0]));
    x[n / 2] = NAN;
    DeviceBuffer dn = up(x);
    gpu::amax(dn.as<float>(), n, dout.as<float>(), s());
    ASSERT_TRUE(std::isnan(down<float>(dout, 1)[0]));
  }
}

// Rough timings on the GPU machine (not a test; run with --gtest_also_run_disabled_tests).
TEST_F(CudaOps, DISABLED_Timings) {
  auto time_ms = [&](auto&& f) {
    f();
    s().synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    const int reps = 5;
    for (int i = 0; i < reps; ++i)
      f();
    s().synchronize();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
               .count() /
           reps;
  };
  const int64_t T = 4096, H = 4096, I = 14336;
  DeviceBuffer x(T * I * 4), w(I * H * 2), y(T * I * 4);
  strata::cuda::fill_zero(x.data(), T * I * 4, s());
  strata::cuda::fill_zero(w.data(), I * H * 2, s());
  const double gemm =
      time_ms([&] { gpu::linear(x.as<float>(), T, H, w.as<uint16_t>(), I, y.as<float>(), s()); });
  std::printf("linear %ldx%ld · %ldx%ld: %.3f ms, %.1f TFLOP/s\n", T, H, I, H, gemm,
              2.0 * T * H * I / gemm * 1e-9);
  const int64_t nH = 32, nKV = 8, hd = 128;
  std::vector<int64_t> off = {0, T};
  DeviceBuffer doff = up(off), q(T * nH * hd * 4), k(T * nKV * hd * 4), o(T * nH * hd * 4);
  strata::cuda::fill_zero(q.data(), T * nH * hd * 4, s());
  strata::cuda::fill_zero(k.data(), T * nKV * hd * 4, s());
  const double att = time_ms([&] {
    gpu::attention_causal(q.as<float>(), nH * hd, k.as<float>(), nKV * hd, k.as<float>(), nKV * hd,
                          doff.as<int64_t>(), 1, T, nH, nKV, hd, hd, 0.088f, o.as<float>(), s());
  });
  std::printf("attention T=%ld nH=%ld nKV=%ld d=%ld (one sequence): %.3f ms\n", T, nH, nKV, hd,
              att);
  DeviceBuffer dm(4);
  const double am = time_ms([&] { gpu::amax(y.as<float>(), T * I, dm.as<float>(), s()); });
  std::printf("amax over %ld fp32: %.3f ms\n", T * I, am);
}

}  // namespace
}  // namespace strata::ops
