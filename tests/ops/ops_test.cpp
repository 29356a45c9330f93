// ops against independent references: closed forms worked out by hand, facts stated in
// spec/architectures.md (YaRN ramp bounds), and naive double-precision formulations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "ops/cpu_backend.h"
#include "ops/ops.h"

namespace strata::ops {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v)
    x = d(g);
  return v;
}

TEST(Ops, LinearMatchesNaiveSum) {
  const int64_t m = 5, k = 37, n = 11;
  auto x = randn(m * k, 1), w = randn(n * k, 2), b = randn(n, 3);
  std::vector<float> y(m * n);
  linear(x.data(), m, k, w.data(), n, y.data(), b.data());
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c) {
      double s = b[c];
      for (int64_t i = 0; i < k; ++i)
        s += static_cast<double>(x[r * k + i]) * w[c * k + i];
      EXPECT_NEAR(y[r * n + c], s, 1e-4 * (1 + std::fabs(s)));
    }
  }
}

TEST(Ops, RmsNormHandWorked) {
  // x = [3, 4]: mean square 12.5, rms = 3.5355339; w = [1, 2].
  const float x[2] = {3.0f, 4.0f}, w[2] = {1.0f, 2.0f};
  float y[2];
  rms_norm(x, 1, 2, w, 0.0f, y);
  EXPECT_NEAR(y[0], 3.0 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(y[1], 2 * 4.0 / std::sqrt(12.5), 1e-6);
  // Zero-centred weights (Qwen3-Next: 1 + w): w = [0, 1] with offset 1 scales by [1, 2] again.
  const float wz[2] = {0.0f, 1.0f};
  float yz[2];
  rms_norm(x, 1, 2, wz, 0.0f, yz, 1.0f);
  EXPECT_NEAR(yz[0], 3.0 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(yz[1], 2 * 4.0 / std::sqrt(12.5), 1e-6);
}

TEST(Ops, SoftmaxHandWorked) {
  float x[3] = {0.0f, std::log(2.0f), std::log(5.0f)};  // exp: 1, 2, 5 -> /8
  softmax(x, 1, 3);
  EXPECT_NEAR(x[0], 1.0 / 8, 1e-7);
  EXPECT_NEAR(x[1], 2.0 / 8, 1e-7);
  EXPECT_NEAR(x[2], 5.0 / 8, 1e-7);
}

TEST(Ops, RopeIsComplexRotation) {
  // Half-split RoPE of pair (a, b) by angle θ equals (a + ib)·e^{iθ}; interleaved the same on
  // adjacent pairs.
  const int64_t T = 3, H = 2, D = 8;
  const int64_t pos[T] = {0, 5, 17};
  RopeParams p;
  p.theta = 100.0;
  auto f = rope_inv_freq(p, D);
  for (int64_t i = 0; i < D / 2; ++i)
    EXPECT_NEAR(f[i], std::pow(100.0, -2.0 * i / D), 1e-15);
  for (bool interleaved : {false, true}) {
    auto x = randn(T * H * D, 7);
    auto y = x;
    rope(y.data(), T, H, D, 0, D, pos, f, 1.0, interleaved);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < D / 2; ++i) {
          int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + D / 2;
          const float* xv = &x[(t * H + h) * D];
          const float* yv = &y[(t * H + h) * D];
          std::complex<double> z(xv[a], xv[b]);
          z *= std::polar(1.0, static_cast<double>(pos[t]) * f[i]);
          EXPECT_NEAR(yv[a], z.real(), 1e-4);
          EXPECT_NEAR(yv[b], z.imag(), 1e-4);
        }
      }
    }
  }
}

TEST(Ops, YarnRampBoundsFromSpec) {
  // spec/architectures.md §3: DeepSeek-V3 (θ 1e4, s 40, L0 4096, β 32/1, d_r 64) ramps between
  // dims 10 and 23: below 10 f is kept, from 23 on it is f/s.
  RopeParams p;
  p.kind = RopeParams::Kind::kYarn;
  p.theta = 10000.0;
  p.factor = 40.0;
  p.original_max_position = 4096.0;
  p.beta_fast = 32.0;
  p.beta_slow = 1.0;
  RopeParams plain = p;
  plain.kind = RopeParams::Kind::kDefault;
  auto f = rope_inv_freq(p, 64), f0 = rope_inv_freq(plain, 64);
  for (int i = 0; i <= 10; ++i)
    EXPECT_DOUBLE_EQ(f[i], f0[i]) << i;
  for (int i = 23; i < 32; ++i)
    EXPECT_DOUBLE_EQ(f[i], f0[i] / 40.0) << i;
  for (int i = 11; i < 23; ++i) {
    EXPECT_LT(f[i], f0[i]);
    EXPECT_GT(f[i], f0[i] / 40.0);
  }
}

TEST(Ops, YarnWithoutTruncationKeepsFractionalBounds) {
  // gpt-oss (θ 150000, s 32, L0 4096, β 32/1) with `truncate` false, on a 64-dim head: the ramp
  // runs between corr(32) = 8.092779... and corr(1) = 17.398024... (worked by hand from
  // spec/architectures.md §3's formula), not between their floor 8 and ceiling 18.
  RopeParams p;
  p.kind = RopeParams::Kind::kYarn;
  p.theta = 150000.0;
  p.factor = 32.0;
  p.original_max_position = 4096.0;
  p.truncate = false;
  RopeParams plain = p;
  plain.kind = RopeParams::Kind::kDefault;
  const double lo = 8.092779115512402, hi = 17.39802450158856;
  auto f = rope_inv_freq(p, 64), f0 = rope_inv_freq(plain, 64);
  for (int i = 0; i < 32; ++i) {
    const double r = std::clamp((i - lo) / (hi - lo), 0.0, 1.0);
    EXPECT_NEAR(f[i], f0[i] * (1 - r) + f0[i] / 32 * r, 1e-12 * f0[i]) << i;
  }
  p.truncate = true;  // the default: bounds 8 and 18
  auto ft = rope_inv_freq(p, 64);
  EXPECT_NEAR(ft[9], f0[9] * 0.9 + f0[9] / 32 * 0.1, 1e-12 * f0[9]);
  EXPECT_GT(std::fabs(ft[9] - f[9]), 1e-3 * f0[9]);
}

TEST(Ops, SwigluClampedHandWorked) {
  // (gate, up) pairs interleaved; h = (clamp(up, ±7) + 1) · g · σ(1.702 g), g = min(gate, 7).
  // Expected values worked in double: 3·σ(1.702); −6·7·σ(11.914); 8·(−3)·σ(−5.106) (gate is
  // not clamped from below); 1.5·7·σ(11.914).
  const float gu[] = {0, 0, 1, 2, 10, -10, -3, 8, 7.5f, 0.5f};
  const double want[] = {0.0, 2.537387297798464, -41.99971876981991, -0.14457047766228776,
                         10.499929692454977};
  float h[5];
  swiglu_clamped(gu, 5, 1.702f, 7.0f, h);
  for (int i = 0; i < 5; ++i)
    EXPECT_NEAR(h[i], want[i], 1e-6 * std::max(1.0, std::fabs(want[i]))) << i;
}

TEST(Ops, Llama3FrequenciesHandWorked) {
  // L0 = 8192, low 1, high 4, factor 8: wavelengths under 2048 keep f, over 8192 use f/8.
  RopeParams p;
  p.kind = RopeParams::Kind::kLlama3;
  p.theta = 500000.0;
  p.factor = 8.0;
  p.original_max_position = 8192.0;
  auto f = rope_inv_freq(p, 128);
  for (size_t i = 0; i < f.size(); ++i) {
    const double f0 = std::pow(500000.0, -2.0 * static_cast<double>(i) / 128);
    const double wl = 2 * M_PI / f0;
    if (wl < 2048) {
      EXPECT_DOUBLE_EQ(f[i], f0);
    } else if (wl > 8192) {
      EXPECT_DOUBLE_EQ(f[i], f0 / 8);
    } else {
      const double a = (8192 / wl - 1) / 3;
      EXPECT_NEAR(f[i], (1 - a) * f0 / 8 + a * f0, 1e-15);
    }
  }
}

TEST(Ops, AttentionMatchesNaiveDouble) {
  const int64_t T = 6, H = 4, KV = 2, dq = 5, dv = 3;
  auto q = randn(T * H * dq, 11), k = randn(T * KV * dq, 12), v = randn(T * KV * dv, 13);
  std::vector<float> out(T * H * dv);
  const float scale = 0.37f;
  attention_causal(q.data(), H * dq, k.data(), KV * dq, v.data(), KV * dv, T, H, KV, dq, dv, scale,
                   out.data());
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h / (H / KV);
    for (int64_t i = 0; i < T; ++i) {
      std::vector<double> s(i + 1);
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double d = 0;
        for (int64_t c = 0; c < dq; ++c)
          d += static_cast<double>(q[(i * H + h) * dq + c]) * k[(j * KV + g) * dq + c];
        s[j] = d * scale;
        mx = std::max(mx, s[j]);
      }
      for (auto& x : s)
        sum += (x = std::exp(x - mx));
      for (int64_t c = 0; c < dv; ++c) {
        double o = 0;
        for (int64_t j = 0; j <= i; ++j)
          o += s[j] / sum * v[(j * KV + g) * dv + c];
        EXPECT_NEAR(out[(i * H + h) * dv + c], o, 1e-5);
      }
    }
  }
}

TEST(Ops, AttentionWithSinksAndWindowMatchesNaiveDouble) {
  // gpt-oss: keys j with i - j < window, and a per-head sink logit in the denominator (and the
  // max) with no value: p_ij = exp(s_ij) / (sum_j exp(s_ij) + exp(sink_h)).
  const int64_t T = 9, H = 4, KV = 2, dq = 5, dv = 3;
  auto q = randn(T * H * dq, 21), k = randn(T * KV * dq, 22), v = randn(T * KV * dv, 23);
  const std::vector<float> sinks = {0.5f, -1.0f, 2.5f, 8.0f};  // the last dominates its rows
  for (int64_t window : {0, 1, 3}) {
    std::vector<float> out(T * H * dv);
    const float scale = 0.37f;
    attention_causal(q.data(), H * dq, k.data(), KV * dq, v.data(), KV * dv, T, H, KV, dq, dv,
                     scale, out.data(), sinks.data(), window);
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / KV);
      for (int64_t i = 0; i < T; ++i) {
        const int64_t first = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
        double sum = std::exp(static_cast<double>(sinks[h]));
        std::vector<double> e(i + 1, 0.0);
        for (int64_t j = first; j <= i; ++j) {
          double d = 0;
          for (int64_t c = 0; c < dq; ++c)
            d += static_cast<double>(q[(i * H + h) * dq + c]) * k[(j * KV + g) * dq + c];
          sum += (e[j] = std::exp(d * scale));
        }
        for (int64_t c = 0; c < dv; ++c) {
          double o = 0;
          for (int64_t j = first; j <= i; ++j)
            o += e[j] / sum * v[(j * KV + g) * dv + c];
          EXPECT_NEAR(out[(i * H + h) * dv + c], o, 1e-5) << window << " " << h << " " << i;
        }
      }
    }
  }
}

TEST(Ops, LayerNormHandWorked) {
  // x = [1, 2, 3, 6]: mean 3, biased variance (4 + 1 + 0 + 9) / 4 = 3.5.
  const float x[4] = {1, 2, 3, 6}, w[4] = {1, 2, 1, 0.5f}, b[4] = {0, 1, -1, 0.25f};
  float y[4];
  layer_norm(x, 1, 4, w, b, 0.0f, y);
  const double sd = std::sqrt(3.5);
  EXPECT_NEAR(y[0], -2 / sd, 1e-6);
  EXPECT_NEAR(y[1], 2 * -1 / sd + 1, 1e-6);
  EXPECT_NEAR(y[2], -1, 1e-6);
  EXPECT_NEAR(y[3], 0.5 * 3 / sd + 0.25, 1e-6);
}

// Bit j of row i of a keep mask.
bool kept(const std::vector<uint32_t>& keep, int64_t words, int64_t i, int64_t j) {
  return (keep[i * words + j / 32] >> (j % 32) & 1u) != 0;
}

TEST(Ops, IndexTopKHandWorked) {
  // One head of d = 1, scale 1, weight 1: s_ij = relu(q_i k_j). q_3 = 1 and k = [3, -1, 3, 2]:
  // scores 3, 0, 3, 2; top-2 is {0, 2} (a tie, both kept), top-3 adds 3. Rows i < top_k keep
  // every key j <= i. A negative head weight turns the order round: q = -1 ranks by -relu(-k).
  const float k[4] = {3, -1, 3, 2}, q[4] = {5, 5, 5, 1}, w[4] = {1, 1, 1, 1};
  for (int64_t top : {2, 3}) {
    std::vector<uint32_t> keep(4 * 2, 0xffffffffu);
    index_topk(q, k, w, 4, 1, 1, 1.0f, 1.0f, top, keep.data(), 2);
    for (int64_t i = 0; i < 4; ++i) {
      for (int64_t j = 0; j < 64; ++j) {
        bool want = j <= i;
        if (i == 3 && top == 2) want = j == 0 || j == 2;
        if (i == 2 && top == 2) want = j == 0 || j == 2;  // scores 15, 0, 15
        if (i == 3 && top == 3) want = j == 0 || j == 2 || j == 3;
        EXPECT_EQ(kept(keep, 2, i, j), want) << top << " " << i << " " << j;
      }
    }
  }
  // Ties at the boundary go to the lower key: scores 3, 0, 3 for i = 2 with top 1 keep j = 0;
  // w = -1 and q = 1: s = -3, -0, -3, -2 for i = 3: top-2 is {1, 3}.
  const float wn[4] = {1, 1, 1, -1};
  std::vector<uint32_t> keep(4);
  index_topk(q, k, wn, 4, 1, 1, 1.0f, 1.0f, 1, keep.data(), 1);
  EXPECT_EQ(keep[2], 1u);
  index_topk(q, k, wn, 4, 1, 1, 1.0f, 1.0f, 2, keep.data(), 1);
  EXPECT_EQ(keep[3], (1u << 1) | (1u << 3));
}

TEST(Ops, IndexTopKMatchesNaiveDouble) {
  // Two heads of d = 3 with scale and weight scale; 40 tokens so that rows span two words.
  const int64_t T = 40, nH = 2, d = 3, top = 7;
  auto q = randn(T * nH * d, 41), k = randn(T * d, 42), w = randn(T * nH, 43);
  const float scale = 0.6f, ws = 0.7f;
  std::vector<uint32_t> keep(T * 2);
  index_topk(q.data(), k.data(), w.data(), T, nH, d, scale, ws, top, keep.data(), 2);
  for (int64_t i = 0; i < T; ++i) {
    std::vector<std::pair<double, int64_t>> s;
    for (int64_t j = 0; j <= i; ++j) {
      double acc = 0;
      for (int64_t h = 0; h < nH; ++h) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c)
          dot += static_cast<double>(q[(i * nH + h) * d + c]) * k[j * d + c];
        acc += static_cast<double>(w[i * nH + h]) * ws * std::max(dot * scale, 0.0);
      }
      s.push_back({-acc, j});
    }
    std::sort(s.begin(), s.end());
    std::vector<bool> want(64, false);
    for (size_t r = 0; r < s.size() && r < static_cast<size_t>(top); ++r)
      want[s[r].second] = true;
    for (int64_t j = 0; j < 64; ++j)
      EXPECT_EQ(kept(keep, 2, i, j), want[j]) << i << " " << j;
  }
}

TEST(Ops, AttentionWithKeepMaskMatchesNaiveDouble) {
  // Query i sees only the causal keys whose bit is set (bits beyond i are ignored).
  const int64_t T = 7, H = 2, KV = 1, dq = 4, dv = 3;
  auto q = randn(T * H * dq, 51), k = randn(T * KV * dq, 52), v = randn(T * KV * dv, 53);
  std::vector<uint32_t> keep(T);
  for (int64_t i = 0; i < T; ++i)
    keep[i] = (i % 2 ? 0x55u : 0x2au) | (1u << i) | 0xff00u;
  std::vector<float> out(T * H * dv);
  attention_causal(q.data(), H * dq, k.data(), KV * dq, v.data(), KV * dv, T, H, KV, dq, dv, 0.5f,
                   out.data(), nullptr, 0, keep.data(), 1);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < T; ++i) {
      std::vector<double> e(i + 1, 0.0);
      double sum = 0;
      for (int64_t j = 0; j <= i; ++j) {
        if (!(keep[i] >> j & 1u)) continue;
        double dot = 0;
        for (int64_t c = 0; c < dq; ++c)
          dot += static_cast<double>(q[(i * H + h) * dq + c]) * k[j * dq + c];
        sum += (e[j] = std::exp(dot * 0.5));
      }
      for (int64_t c = 0; c < dv; ++c) {
        double o = 0;
        for (int64_t j = 0; j <= i; ++j)
          o += e[j] / sum * v[j * dv + c];
        EXPECT_NEAR(out[(i * H + h) * dv + c], o, 1e-5) << h << " " << i;
      }
    }
  }
}

TEST(Ops, TopKStableAndOrdered) {
  const float x[6] = {0.1f, 0.9f, 0.5f, 0.9f, -1.0f, 0.5f};
  auto idx = top_k(x, 6, 4);
  ASSERT_EQ(idx.size(), 4u);
  EXPECT_EQ(idx[0], 1);
  EXPECT_EQ(idx[1], 3);
  EXPECT_EQ(idx[2], 2);
  EXPECT_EQ(idx[3], 5);
}

TEST(Ops, CausalConv1dHandWorked) {
  // T = 4, C = 2, K = 3; x rows have a third, ignored column (stride 3).
  // Channel 0: x = 1, 2, 3, 4 and w = [1, 10, 100] (100 on the current token): the digits of y
  // spell the window, with zeros before the start. Channel 1: an impulse reads w backwards.
  const float x[12] = {1, 1, 99, 2, 0, 99, 3, 0, 99, 4, 0, 99};
  const float w[6] = {1, 10, 100, 0.5f, -1, 2};
  float y[8];
  causal_conv1d(x, 3, 4, 2, w, 3, y);
  const float want[8] = {100, 2, 210, -1, 321, 0.5f, 432, 0};
  for (int i = 0; i < 8; ++i)
    EXPECT_EQ(y[i], want[i]) << i;
}

TEST(Ops, L2NormHandWorked) {
  float x[4] = {3, 4, 3, 4};
  l2_norm(x, 1, 2, 0.0f);  // |x| = 5
  EXPECT_FLOAT_EQ(x[0], 0.6f);
  EXPECT_FLOAT_EQ(x[1], 0.8f);
  l2_norm(x + 2, 1, 2, 11.0f);  // eps inside the root: sqrt(25 + 11) = 6
  EXPECT_FLOAT_EQ(x[2], 0.5f);
  EXPECT_FLOAT_EQ(x[3], 4.0f / 6.0f);
}

TEST(Ops, GatedDeltaRuleHandWorked) {
  // One head, dk = 2, dv = 1, worked by hand:
  // t0: no decay, k = [1, 0], v = 2, beta = 0.5: u = 0.5 (2 - 0) = 1, S = [1, 0];
  //     q = [1, 1]: o = 1.
  // t1: decay [0.5, 1] first: S = [0.5, 0]; k = [0.6, 0.8]: S^T k = 0.3; v = 1, beta = 1:
  //     u = 0.7, S = [0.5 + 0.42, 0.56] = [0.92, 0.56]; q = [1, -1]: o = 0.36.
  const float q[4] = {1, 1, 1, -1}, k[4] = {1, 0, 0.6f, 0.8f}, v[2] = {2, 1};
  const float g[4] = {0, 0, std::log(0.5f), 0}, beta[2] = {0.5f, 1};
  float o[2];
  gated_delta_rule(q, k, v, g, beta, 2, 1, 2, 1, o);
  EXPECT_FLOAT_EQ(o[0], 1.0f);
  EXPECT_NEAR(o[1], 0.36f, 1e-6);
  // One decay per head (Gated DeltaNet), g = [0, log 0.5] for t0, t1; keys with both channels
  // set, so that the decay reaches both: t0: u = 0.5 (2 - 0) = 1, S = [0.6, 0.8], q = [1, 1]:
  // o = 1.4. t1: S = 0.5 S = [0.3, 0.4]; S^T k = 0.5, u = 1 (1 - 0.5) = 0.5, S = [0.6, 0.8];
  // q = [1, -1]: o = -0.2. (A per-channel decay [log 0.5, 0] would give S = [0.3, 0.8] instead.)
  const float gh[2] = {0, std::log(0.5f)};
  const float k2[4] = {0.6f, 0.8f, 0.6f, 0.8f};
  gated_delta_rule(q, k2, v, gh, beta, 2, 1, 2, 1, o, /*head_decay=*/true);
  EXPECT_NEAR(o[0], 1.4f, 1e-6);
  EXPECT_NEAR(o[1], -0.2f, 1e-6);
}

TEST(Ops, GatedDeltaRuleStoresWithBetaOneAndKeepsHeadsApart) {
  // beta = 1 and no decay: after step t the state maps the unit key k_t exactly to v_t, so
  // querying with q_t = k_t returns v_t (the delta rule's defining property). Two heads run
  // with different data must each give what they give alone.
  const int64_t T = 5, nH = 2, dk = 4, dv = 3;
  auto q = randn(T * nH * dk, 7), k = randn(T * nH * dk, 8), v = randn(T * nH * dv, 9);
  l2_norm(k.data(), T * nH, dk, 0.0f);
  std::vector<float> g(T * nH * dk, 0.0f), beta(T * nH, 1.0f), out(T * nH * dv);
  gated_delta_rule(k.data(), k.data(), v.data(), g.data(), beta.data(), T, nH, dk, dv, out.data());
  for (int64_t i = 0; i < T * nH * dv; ++i)
    EXPECT_NEAR(out[i], v[i], 1e-5) << i;
  // Heads apart, with decays and betas below one.
  auto gd = randn(T * nH * dk, 10, 0.5f), bd = randn(T * nH, 11);
  for (float& x : gd)
    x = -std::fabs(x);
  for (float& x : bd)
    x = sigmoid(x);
  gated_delta_rule(q.data(), k.data(), v.data(), gd.data(), bd.data(), T, nH, dk, dv, out.data());
  for (int64_t h = 0; h < nH; ++h) {
    std::vector<float> qh, kh, vh, gh, bh, oh(T * dv);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t a = (t * nH + h) * dk, b = (t * nH + h) * dv;
      qh.insert(qh.end(), &q[a], &q[a] + dk);
      kh.insert(kh.end(), &k[a], &k[a] + dk);
      gh.insert(gh.end(), &gd[a], &gd[a] + dk);
      vh.insert(vh.end(), &v[b], &v[b] + dv);
      bh.push_back(bd[t * nH + h]);
    }
    gated_delta_rule(qh.data(), kh.data(), vh.data(), gh.data(), bh.data(), T, 1, dk, dv,
                     oh.data());
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < dv; ++j)
        EXPECT_EQ(out[(t * nH + h) * dv + j], oh[t * dv + j]);
    }
  }
}

// The vectorized recurrence against the scalar reference, bit for bit: head sizes that fill
// vector registers and odd ones, several heads and tokens, decays per channel and per head,
// betas in (0, 1), unnormalised keys, and the hand-worked case's inputs.
TEST(Ops, GatedDeltaRuleEqualsItsReference) {
  struct Dims {
    int64_t T, nH, dk, dv;
  } dims[] = {{1, 1, 1, 1},    {7, 3, 5, 3},      {33, 2, 16, 16},
              {20, 2, 64, 32}, {12, 1, 128, 128}, {9, 4, 24, 37}};
  uint64_t seed = 20;
  for (const Dims& d : dims) {
    for (bool head : {false, true}) {
      const int64_t gn = head ? d.T * d.nH : d.T * d.nH * d.dk;
      auto q = randn(d.T * d.nH * d.dk, ++seed), k = randn(d.T * d.nH * d.dk, ++seed),
           v = randn(d.T * d.nH * d.dv, ++seed), g = randn(gn, ++seed, 0.3f),
           beta = randn(d.T * d.nH, ++seed);
      for (float& x : g)
        x = -std::fabs(x);
      for (float& x : beta)
        x = sigmoid(x);
      std::vector<float> fast(static_cast<size_t>(d.T * d.nH * d.dv), -1.0f), ref = fast;
      gated_delta_rule(q.data(), k.data(), v.data(), g.data(), beta.data(), d.T, d.nH, d.dk, d.dv,
                       fast.data(), head);
      gated_delta_rule_reference(q.data(), k.data(), v.data(), g.data(), beta.data(), d.T, d.nH,
                                 d.dk, d.dv, ref.data(), head);
      for (size_t i = 0; i < fast.size(); ++i) {
        uint32_t a, b;
        std::memcpy(&a, &fast[i], 4);
        std::memcpy(&b, &ref[i], 4);
        ASSERT_EQ(a, b) << "T " << d.T << " heads " << d.nH << " dk " << d.dk << " dv " << d.dv
                        << (head ? " head decay" : "") << " at " << i;
      }
    }
  }
}

TEST(Ops, RoundBf16AndAmax) {
  float x[3] = {1.00390625f, -3.0f, 0.0f};  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even (1)
  round_bf16(x, 3);
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(amax(x, 3), 3.0f);
}

// StoredWeight::fp32_quotient, worked by hand: W = {450, 1.0703125} in bf16 (both exact), amax
// 450, so scale = fl32(450 * fl32(1/448)) = 1.00446...
//   2-D (default): divisor bf16(scale) = 1.0078125; 1.0703125 / 1.0078125 = 1.06202 rounds to
//   bf16 1.0625, an e4m3 tie between 1.0 and 1.125, to even: 1.0 (0x38).
//   fp32 quotient (ModelOpt's stacked experts): 1.0703125 / 1.00446 = 1.06556, nearer 1.125 than
//   1.0: 0x39.
// 450 / divisor is 446.5 (2-D) or 448 (fp32): e4m3 448 (0x7E) both ways.
TEST(Ops, Fp8QuotientInTheWeightsDtypeOrInFp32) {
  const std::vector<uint16_t> w = {f32_to_bf16(450.0f), f32_to_bf16(1.0703125f)};
  ASSERT_EQ(bf16_to_f32(w[0]), 450.0f);
  ASSERT_EQ(bf16_to_f32(w[1]), 1.0703125f);
  CpuBackend be(nullptr, nullptr);
  StoredWeight sw{w.data(), DType::kBF16, 1, 2};
  const QuantizedWeight two_d = be.quantize_weight(sw, QFormat::kFp8, 450.0f, "w");
  sw.fp32_quotient = true;
  const QuantizedWeight stacked = be.quantize_weight(sw, QFormat::kFp8, 450.0f, "w");
  const uint8_t* a = two_d.fp8->weight.data<uint8_t>();
  const uint8_t* b = stacked.fp8->weight.data<uint8_t>();
  EXPECT_EQ(a[0], 0x7E);
  EXPECT_EQ(b[0], 0x7E);
  EXPECT_EQ(a[1], 0x38);
  EXPECT_EQ(b[1], 0x39);
  EXPECT_EQ(two_d.fp8->scale.item_f32(0), stacked.fp8->scale.item_f32(0));
}

}  // namespace
// Hand-worked: x[3, 2] = [1 -2], [4 0.5], [-3 2].
TEST(ColumnStats, SumMaxMinPerColumn) {
  const std::vector<float> x = {1, -2, 4, 0.5f, -3, 2};
  std::vector<double> sum(2);
  std::vector<float> mx(2), mn(2);
  ops::column_stats(x.data(), 3, 2, sum.data(), mx.data(), mn.data());
  EXPECT_EQ(sum, (std::vector<double>{2.0, 0.5}));
  EXPECT_EQ(mx, (std::vector<float>{4.0f, 2.0f}));
  EXPECT_EQ(mn, (std::vector<float>{-3.0f, -2.0f}));
  ops::column_stats(x.data(), 0, 2, sum.data(), mx.data(), mn.data());  // no rows
  EXPECT_EQ(sum, (std::vector<double>{0.0, 0.0}));
  EXPECT_EQ(mx[0], -INFINITY);
  EXPECT_EQ(mn[1], INFINITY);
  const std::vector<float> nan = {NAN, 1, 5, 1};  // a NaN sticks in its column only
  ops::column_stats(nan.data(), 2, 2, sum.data(), mx.data(), mn.data());
  EXPECT_TRUE(std::isnan(mx[0]) && std::isnan(mn[0]) && std::isnan(sum[0]));
  EXPECT_EQ(mx[1], 1.0f);
}

}  // namespace strata::ops
