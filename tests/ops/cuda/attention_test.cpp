// ops/cuda/attention.h against ops::attention_causal and ops::softmax.
#include <cmath>
#include <utility>
#include <vector>

#include "core/error.h"
#include "ops/cuda/attention.h"
#include "ops/ops.h"
#include "tests/ops/cuda/cuda_test_util.h"

namespace strata::ops::cuda {
namespace {

// Row i of each [L, L] matrix is ops::softmax over its first i + 1 values times scale (each
// product rounded to fp32 first, as the CPU forms scores), zeros after; what lies above the
// diagonal (here values large enough to dominate any softmax) is never read. The device may fuse
// scale * s - max into one rounding and its expf is within 2 ulp: a few ulp of each p.
TEST_F(CudaOps, CausalSoftmaxIsSoftmaxOverEachRowsPrefix) {
  for (auto [batch, L] : {std::pair<int64_t, int64_t>{5, 33}, {1, 1}, {2, 130}}) {
    std::vector<float> sc = normal(batch * L * L, 4.0f);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = i + 1; j < L; ++j)
          sc[(b * L + i) * L + j] = 1e4f;
    const float scale = 0.3f;
    gpu::DeviceBuffer ds = up(sc);
    causal_softmax(ds.as<float>(), batch, L, scale, st());
    const auto p = down<float>(ds, sc.size());
    for (int64_t r = 0; r < batch * L; ++r) {
      const int64_t i = r % L;
      std::vector<float> want(static_cast<size_t>(i + 1));
      for (int64_t j = 0; j <= i; ++j)
        want[j] = sc[r * L + j] * scale;
      ops::softmax(want.data(), 1, i + 1);
      for (int64_t j = 0; j < L; ++j) {
        if (j > i) {
          ASSERT_EQ(p[r * L + j], 0.0f) << "row " << r << " col " << j;
        } else {
          ASSERT_NEAR(p[r * L + j], want[j], 2e-6f * want[j] + 1e-37f)
              << "row " << r << " col " << j;
        }
      }
    }
  }
}

// The warp kernel over a ragged batch against ops::attention_causal run per sequence: GQA, MHA
// with odd head dims and padded strides, and MLA's layout (dq = 128 + 64, dv = 128, k and v as
// slices of one fused row). Online softmax against two passes, other summation orders: fp32
// rounding only.
TEST_F(CudaOps, RaggedWarpAttentionMatchesCpuPerSequence) {
  struct Case {
    int64_t nH, nKV, dq, dv, q_stride, k_stride, v_stride;
  };
  const Case cases[] = {{8, 2, 64, 64, 8 * 64, 2 * 64, 2 * 64},
                        {3, 3, 37, 19, 3 * 37 + 5, 3 * 37, 3 * 19 + 1},
                        {4, 4, 192, 128, 4 * 192, 4 * (192 + 128), 4 * (192 + 128)},
                        {2, 1, 16, 256, 2 * 16, 16, 256}};
  const std::vector<int64_t> lens = {1, 5, 17, 64, 2};
  std::vector<int64_t> off = {0}, start;
  for (int64_t l : lens) {
    for (int64_t i = 0; i < l; ++i)
      start.push_back(off.back());
    off.push_back(off.back() + l);
  }
  const int64_t T = off.back(), n_seq = static_cast<int64_t>(lens.size());
  gpu::DeviceBuffer dstart = up(start);
  for (const Case& c : cases) {
    const auto q = normal(T * c.q_stride), k = normal(T * c.k_stride), v = normal(T * c.v_stride);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.dq));
    gpu::DeviceBuffer dq = up(q), dk = up(k), dv = up(v), dout = buffer(T * c.nH * c.dv * 4);
    attention(dq.as<float>(), c.q_stride, dk.as<float>(), c.k_stride, dv.as<float>(), c.v_stride, T,
              c.nH, c.nKV, c.dq, c.dv, scale, dstart.as<int64_t>(), dout.as<float>(), st());
    const auto out = down<float>(dout, T * c.nH * c.dv);
    for (int64_t sq = 0; sq < n_seq; ++sq) {
      const int64_t t0 = off[sq], L = lens[sq];
      std::vector<float> want(L * c.nH * c.dv);
      ops::attention_causal(q.data() + t0 * c.q_stride, c.q_stride, k.data() + t0 * c.k_stride,
                            c.k_stride, v.data() + t0 * c.v_stride, c.v_stride, L, c.nH, c.nKV,
                            c.dq, c.dv, scale, want.data());
      for (int64_t i = 0; i < L * c.nH * c.dv; ++i)
        ASSERT_NEAR(out[t0 * c.nH * c.dv + i], want[i], 2e-5f * (1.0f + std::fabs(want[i])))
            << "seq " << sq << " element " << i << " dq " << c.dq << " dv " << c.dv;
    }
  }
  // A value head wider than the kernel's registers is refused before the launch.
  gpu::DeviceBuffer big = buffer(T * 257 * 4);
  EXPECT_THROW(attention(big.as<float>(), 257, big.as<float>(), 257, big.as<float>(), 257, T, 1, 1,
                         257, 257, 1.0f, dstart.as<int64_t>(), big.as<float>(), st()),
               Error);
}

// gpt-oss's variants in both device paths against ops::attention_causal with the same window
// and sinks: the warp kernel over a ragged batch, and the causal softmax of the GEMM path
// (sinks per head, matrix b being head b % nH) followed by P·V on the host.
TEST_F(CudaOps, SinksAndSlidingWindowMatchCpu) {
  const int64_t nH = 4, nKV = 2, d = 16;
  const std::vector<int64_t> lens = {1, 5, 17, 9};
  std::vector<int64_t> off = {0}, start;
  for (int64_t l : lens) {
    for (int64_t i = 0; i < l; ++i)
      start.push_back(off.back());
    off.push_back(off.back() + l);
  }
  const int64_t T = off.back();
  const std::vector<float> sinks = {0.5f, -1.0f, 2.5f, 6.0f};
  const auto q = normal(T * nH * d), k = normal(T * nKV * d), v = normal(T * nKV * d);
  const float scale = 0.25f;
  gpu::DeviceBuffer dstart = up(start), dsinks = up(sinks);
  gpu::DeviceBuffer dq = up(q), dk = up(k), dv = up(v), dout = buffer(T * nH * d * 4);
  for (int64_t window : {0, 1, 4}) {
    for (const float* sk : {static_cast<const float*>(nullptr), sinks.data()}) {
      attention(dq.as<float>(), nH * d, dk.as<float>(), nKV * d, dv.as<float>(), nKV * d, T, nH,
                nKV, d, d, scale, dstart.as<int64_t>(), dout.as<float>(), st(), window,
                sk ? dsinks.as<float>() : nullptr);
      const auto out = down<float>(dout, T * nH * d);
      for (size_t sq = 0; sq < lens.size(); ++sq) {
        const int64_t t0 = off[sq], L = lens[sq];
        std::vector<float> want(L * nH * d);
        ops::attention_causal(q.data() + t0 * nH * d, nH * d, k.data() + t0 * nKV * d, nKV * d,
                              v.data() + t0 * nKV * d, nKV * d, L, nH, nKV, d, d, scale,
                              want.data(), sk, window);
        for (int64_t i = 0; i < L * nH * d; ++i)
          ASSERT_NEAR(out[t0 * nH * d + i], want[i], 2e-5f * (1.0f + std::fabs(want[i])))
              << "window " << window << " sinks " << (sk != nullptr) << " seq " << sq << " " << i;
      }
      // The softmax of the GEMM path on one sequence's scores [nH, L, L] (MHA view: head h's
      // scores against kv head h / 2), then P·V on the host, against the same reference.
      const int64_t L = 17, t0 = off[2];
      std::vector<float> sc(nH * L * L, 1e4f);
      for (int64_t h = 0; h < nH; ++h)
        for (int64_t i = 0; i < L; ++i)
          for (int64_t j = 0; j <= i; ++j) {
            float s = 0.0f;
            for (int64_t c = 0; c < d; ++c)
              s += q[((t0 + i) * nH + h) * d + c] * k[((t0 + j) * nKV + h / 2) * d + c];
            sc[(h * L + i) * L + j] = s;
          }
      gpu::DeviceBuffer ds = up(sc);
      causal_softmax(ds.as<float>(), nH, L, scale, st(), window, sk ? dsinks.as<float>() : nullptr,
                     nH);
      const auto p = down<float>(ds, sc.size());
      std::vector<float> want(L * nH * d);
      ops::attention_causal(q.data() + t0 * nH * d, nH * d, k.data() + t0 * nKV * d, nKV * d,
                            v.data() + t0 * nKV * d, nKV * d, L, nH, nKV, d, d, scale, want.data(),
                            sk, window);
      for (int64_t h = 0; h < nH; ++h)
        for (int64_t i = 0; i < L; ++i)
          for (int64_t c = 0; c < d; ++c) {
            double o = 0.0;
            for (int64_t j = 0; j < L; ++j)
              o +=
                  static_cast<double>(p[(h * L + i) * L + j]) * v[((t0 + j) * nKV + h / 2) * d + c];
            ASSERT_NEAR(o, want[(i * nH + h) * d + c], 2e-5 * (1.0 + std::fabs(o)))
                << "softmax window " << window << " sinks " << (sk != nullptr) << " " << h << " "
                << i;
          }
    }
  }
}

TEST_F(CudaOps, MlaKeysAndValuesPerHead) {
  const int64_t T = 5, nH = 3, dn = 4, dr = 2, dv = 3;
  std::vector<float> kv(static_cast<size_t>(T * nH * (dn + dv))), kr(static_cast<size_t>(T * dr));
  for (size_t i = 0; i < kv.size(); ++i)
    kv[i] = static_cast<float>(i);
  for (size_t i = 0; i < kr.size(); ++i)
    kr[i] = -1.0f - static_cast<float>(i);
  gpu::DeviceBuffer dkv = up(kv), dkr = up(kr);
  gpu::DeviceBuffer dk = buffer(static_cast<uint64_t>(T * nH * (dn + dr)) * 4);
  gpu::DeviceBuffer dvv = buffer(static_cast<uint64_t>(T * nH * dv) * 4);
  mla_kv(dkv.as<float>(), dkr.as<float>(), T, nH, dn, dr, dv, dk.as<float>(), dvv.as<float>(),
         st());
  const auto k = down<float>(dk, static_cast<size_t>(T * nH * (dn + dr)));
  const auto v = down<float>(dvv, static_cast<size_t>(T * nH * dv));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < nH; ++h) {
      const float* row = &kv[(t * nH + h) * (dn + dv)];
      for (int64_t c = 0; c < dn; ++c)
        EXPECT_EQ(k[(t * nH + h) * (dn + dr) + c], row[c]);
      for (int64_t c = 0; c < dr; ++c)
        EXPECT_EQ(k[(t * nH + h) * (dn + dr) + dn + c], kr[t * dr + c]);
      for (int64_t c = 0; c < dv; ++c)
        EXPECT_EQ(v[(t * nH + h) * dv + c], row[dn + c]);
    }
  }
}

}  // namespace
}  // namespace strata::ops::cuda
