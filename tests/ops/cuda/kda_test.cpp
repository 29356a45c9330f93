// ops/cuda/kda.h (Kimi Delta Attention) against the CPU ops the CPU forward uses
// (model/kimi_linear.cpp: ops::causal_conv1d, ops::silu, ops::gated_delta_rule) on ragged
// sequences.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/cuda/kda.h"
#include "ops/ops.h"
#include "tests/ops/cuda/cuda_test_util.h"

namespace strata::ops::cuda {
namespace {

// Sequences of these lengths: one empty, one of a single token, some shorter than the convolution.
const std::vector<int64_t> kLengths = {5, 1, 17, 0, 3, 40, 2};

// Conv + SiLU against ops::causal_conv1d run per sequence, then ops::silu. Error: at most K
// products summed (a fused multiply-add on the device rounds once where the host may round
// twice) and expf within 2 ulp: a few ulp of the largest |w x| (inputs O(1)): 1e-5 absolute and
// relative is ~100 ulp of margin, and any tap read across a sequence start shows as O(0.1).
TEST_F(CudaOps, KdaConvSiluRestartsAtEachSequence) {
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const Ragged r(kLengths);
  for (auto [C, K] : {std::pair<int64_t, int64_t>{40, 4}, {64, 3}, {7, 1}}) {
    std::vector<float> x(static_cast<size_t>(r.T * C)), w(static_cast<size_t>(C * K));
    for (float& v : x)
      v = u(rng);
    for (float& v : w)
      v = u(rng);
    std::vector<float> want(x.size());
    for (int64_t q = 0; q < r.seqs(); ++q) {
      const int64_t b = r.bounds[q], len = r.bounds[q + 1] - b;
      ops::causal_conv1d(x.data() + b * C, C, len, C, w.data(), K, want.data() + b * C);
    }
    for (float& v : want)
      v = ops::silu(v);
    gpu::DeviceBuffer dx = up(x), dw = up(w), ds = up(r.start);
    gpu::DeviceBuffer dy = buffer(x.size() * 4);
    kda_conv_silu(dx.as<float>(), r.T, C, dw.as<float>(), K, ds.as<int64_t>(), dy.as<float>(),
                  st());
    const auto y = down<float>(dy, x.size());
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_NEAR(y[i], want[i], 1e-5f + 1e-5f * std::fabs(want[i]))
          << "C " << C << " K " << K << " token " << i / C << " channel " << i % C;
  }
}

// The forget gate's formula (spec/architectures.md §4) in fp32 as the CPU forward writes it.
// expf/logf are within 2 ulp: 1e-5 relative, plus for softplus of very negative z, log(1 + e^z)
// in fp32 carries the rounding of 1 + e^z (6e-8 absolute, whichever exp rounds it): 1e-6
// absolute before the rate.
TEST_F(CudaOps, KdaForgetGateFollowsTheFormula) {
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);
  const int64_t T = 13, nH = 3, d = 24;
  std::vector<float> f(static_cast<size_t>(T * nH * d)), dt(static_cast<size_t>(nH * d)),
      a_log(static_cast<size_t>(nH));
  for (float& v : f)
    v = u(rng);
  f[1] = 25.0f;  // softplus's linear branch (z + dt_bias > 20)
  for (float& v : dt)
    v = u(rng) / 4.0f;
  dt[1] = 0.0f;
  for (float& v : a_log)
    v = u(rng) / 4.0f;
  gpu::DeviceBuffer dg = up(f), ddt = up(dt), da = up(a_log);
  kda_forget_gate(dg.as<float>(), T, nH, d, da.as<float>(), ddt.as<float>(), st());
  const auto g = down<float>(dg, f.size());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < nH; ++h) {
      const float rate = std::exp(a_log[h]);
      for (int64_t i = 0; i < d; ++i) {
        const int64_t at = (t * nH + h) * d + i;
        const float z = f[at] + dt[h * d + i];
        const float softplus = z > 20.0f ? z : std::log(1.0f + std::exp(z));
        const float want = -rate * softplus;
        ASSERT_NEAR(g[at], want, 1e-5f * std::fabs(want) + 1e-6f * rate)
            << "t " << t << " h " << h << " i " << i;
      }
    }
  }
}

// The gated delta rule against ops::gated_delta_rule run per sequence from a zero state, with
// inputs shaped as KDA feeds it: q, k L2-normalised (q scaled by dk^-1/2), v in [-1, 1], log
// decays in [-0.5, 0] (slow decay: the state carries many tokens), beta in (0, 1). dk != dv
// catches a transposed state; dk of 48 and 200 take the kernel's partial register tiles.
// Error: per token each state element is rounded a few times and each dot product over dk
// terms differs by its fused multiply-adds (<= dk ulp of |S|, |S| <= ~sqrt(T) here); with
// beta <= 1 and |k| = 1 the update I - beta k k^T does not amplify earlier errors, so they add
// up over at most 40 tokens: ~40 * (dk + 8) * 6e-8 * |S|, i.e. 2e-4 for dk = 48, more for 200.
// Tolerance 1e-3 * (1 + |want|): a state restart missed at a sequence start or a wrong head or
// column changes outputs by O(0.1).
TEST_F(CudaOps, GatedDeltaRuleMatchesOpsPerSequence) {
  std::mt19937 rng(24);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), g01(0.0f, 1.0f);
  const Ragged r(kLengths);
  for (auto [nH, dk, dv] : {std::tuple<int64_t, int64_t, int64_t>{2, 32, 32},
                            {3, 48, 40},
                            {2, 128, 128},
                            {1, 200, 72}}) {
    const int64_t T = r.T;
    std::vector<float> q(static_cast<size_t>(T * nH * dk)), k(q.size()), g(q.size()),
        v(static_cast<size_t>(T * nH * dv)), beta(static_cast<size_t>(T * nH));
    for (float& e : q)
      e = u(rng);
    for (float& e : k)
      e = u(rng);
    for (float& e : v)
      e = u(rng);
    for (float& e : g)
      e = -0.5f * g01(rng);
    for (float& e : beta)
      e = g01(rng);
    ops::l2_norm(q.data(), T * nH, dk, 1e-6f);
    ops::l2_norm(k.data(), T * nH, dk, 1e-6f);
    for (float& e : q)
      e /= std::sqrt(static_cast<float>(dk));
    std::vector<float> want(v.size());
    for (int64_t i = 0; i < r.seqs(); ++i) {
      const int64_t b = r.bounds[i], len = r.bounds[i + 1] - b;
      ops::gated_delta_rule(q.data() + b * nH * dk, k.data() + b * nH * dk, v.data() + b * nH * dv,
                            g.data() + b * nH * dk, beta.data() + b * nH, len, nH, dk, dv,
                            want.data() + b * nH * dv);
    }
    gpu::DeviceBuffer dq = up(q), dk_ = up(k), dv_ = up(v), dg = up(g), db = up(beta);
    gpu::DeviceBuffer dbounds = up(r.bounds), dout = buffer(v.size() * 4);
    // Gated DeltaNet's one decay per head ([T, nH], head_decay): the first channel's values.
    std::vector<float> gh(static_cast<size_t>(T * nH)), want_h(v.size());
    for (int64_t i = 0; i < T * nH; ++i)
      gh[static_cast<size_t>(i)] = g[static_cast<size_t>(i * dk)];
    for (int64_t i = 0; i < r.seqs(); ++i) {
      const int64_t b = r.bounds[i], len = r.bounds[i + 1] - b;
      ops::gated_delta_rule(q.data() + b * nH * dk, k.data() + b * nH * dk, v.data() + b * nH * dv,
                            gh.data() + b * nH, beta.data() + b * nH, len, nH, dk, dv,
                            want_h.data() + b * nH * dv, /*head_decay=*/true);
    }
    gpu::DeviceBuffer dgh = up(gh);
    for (bool head_decay : {false, true}) {
      gated_delta_rule(dq.as<float>(), dk_.as<float>(), dv_.as<float>(),
                       head_decay ? dgh.as<float>() : dg.as<float>(), db.as<float>(),
                       dbounds.as<int64_t>(), r.seqs(), nH, dk, dv, dout.as<float>(), st(),
                       head_decay);
      const auto o = down<float>(dout, v.size());
      const std::vector<float>& w = head_decay ? want_h : want;
      double worst = 0.0;
      for (size_t i = 0; i < o.size(); ++i) {
        ASSERT_NEAR(o[i], w[i], 1e-3f * (1.0f + std::fabs(w[i])))
            << "nH " << nH << " dk " << dk << " dv " << dv << " head_decay " << head_decay
            << " token " << i / (nH * dv) << " head " << i / dv % nH << " column " << i % dv;
        worst = std::max(worst, static_cast<double>(std::fabs(o[i] - w[i])));
      }
      std::printf("gated_delta_rule nH %lld dk %lld dv %lld head_decay %d: max |gpu - cpu| %.3g\n",
                  static_cast<long long>(nH), static_cast<long long>(dk),
                  static_cast<long long>(dv), head_decay ? 1 : 0, worst);
    }
  }
}

}  // namespace
}  // namespace strata::ops::cuda
