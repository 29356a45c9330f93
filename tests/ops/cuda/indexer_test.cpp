// ops/cuda/indexer.h against ops::index_topk, and the keep mask in ops/cuda/attention.h's two
// paths against ops::attention_causal.
#include <cmath>
#include <vector>

#include "ops/cuda/attention.h"
#include "ops/cuda/indexer.h"
#include "ops/ops.h"
#include "tests/ops/cuda/cuda_test_util.h"

namespace strata::ops::cuda {
namespace {

// A ragged batch with sequences shorter and longer than top_k, rows over several words, the real
// model's 64 heads of 128 and the fixture's 8 of 32. Scores differ from the CPU's only by fused
// multiply-adds; random inputs leave no near-tie at the boundary, so the masks are equal. Ties
// (every score 0 when all heads' weights are 0) go to the lower key on both.
TEST_F(CudaOps, IndexTopKMatchesCpuPerSequence) {
  struct Case {
    int64_t nH, d, top;
  };
  const Ragged r({1, 9, 70, 8, 300});
  const int64_t T = r.T, words = (300 + 31) / 32;
  gpu::DeviceBuffer dstart = up(r.start);
  for (const Case c : {Case{8, 32, 8}, Case{64, 128, 40}, Case{3, 4, 1}}) {
    for (bool zero_w : {false, true}) {
      const auto q = normal(T * c.nH * c.d), k = normal(T * c.d);
      std::vector<float> w = normal(T * c.nH);
      if (zero_w) std::fill(w.begin(), w.end(), 0.0f);
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.d)), ws = 0.125f;
      gpu::DeviceBuffer dq = up(q), dk = up(k), dw = up(w), dkeep = buffer(T * words * 4);
      index_topk(dq.as<float>(), dk.as<float>(), dw.as<float>(), T, c.nH, c.d, scale, ws, c.top,
                 dstart.as<int64_t>(), dkeep.as<uint32_t>(), words, st());
      const auto keep = down<uint32_t>(dkeep, T * words);
      for (size_t sq = 0; sq + 1 < r.bounds.size(); ++sq) {
        const int64_t t0 = r.bounds[sq], L = r.bounds[sq + 1] - t0;
        std::vector<uint32_t> want(L * words);
        ops::index_topk(q.data() + t0 * c.nH * c.d, k.data() + t0 * c.d, w.data() + t0 * c.nH, L,
                        c.nH, c.d, scale, ws, c.top, want.data(), words);
        for (int64_t i = 0; i < L * words; ++i)
          ASSERT_EQ(keep[t0 * words + i], want[i])
              << c.nH << "x" << c.d << " top " << c.top << (zero_w ? " zero w" : "") << " seq "
              << sq << " row " << i / words << " word " << i % words;
      }
    }
  }
}

// The keep mask in the warp kernel (ragged) and in the softmax between the batched GEMMs (one
// matrix per head, its rows' masks by pointer) against the CPU: fp32 rounding only.
TEST_F(CudaOps, AttentionKeepMaskMatchesCpu) {
  const Ragged r({3, 40, 17});
  const int64_t T = r.T, nH = 2, dq = 24, dv = 16, words = 2;
  std::vector<uint32_t> keep(T * words);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = t - r.start[t];
    keep[t * words] = 0x9249249u ^ static_cast<uint32_t>(t * 2654435761u);
    keep[t * words + 1] = static_cast<uint32_t>(t * 40503u);
    keep[t * words + p / 32] |= 1u << (p % 32);  // at least the query's own key
  }
  const auto q = normal(T * nH * dq), k = normal(T * nH * dq), v = normal(T * nH * dv);
  const float scale = 0.2f;
  gpu::DeviceBuffer q_dev = up(q), k_dev = up(k), v_dev = up(v), dstart = up(r.start),
                    dkeep = up(keep), dout = buffer(T * nH * dv * 4);
  attention(q_dev.as<float>(), nH * dq, k_dev.as<float>(), nH * dq, v_dev.as<float>(), nH * dv, T,
            nH, nH, dq, dv, scale, dstart.as<int64_t>(), dout.as<float>(), st(), 0, nullptr,
            dkeep.as<uint32_t>(), words);
  const auto out = down<float>(dout, T * nH * dv);
  for (size_t sq = 0; sq + 1 < r.bounds.size(); ++sq) {
    const int64_t t0 = r.bounds[sq], L = r.bounds[sq + 1] - t0;
    std::vector<float> want(L * nH * dv);
    ops::attention_causal(q.data() + t0 * nH * dq, nH * dq, k.data() + t0 * nH * dq, nH * dq,
                          v.data() + t0 * nH * dv, nH * dv, L, nH, nH, dq, dv, scale, want.data(),
                          nullptr, 0, keep.data() + t0 * words, words);
    for (int64_t i = 0; i < L * nH * dv; ++i)
      ASSERT_NEAR(out[t0 * nH * dv + i], want[i], 1e-5f + 1e-5f * std::fabs(want[i]))
          << "warp kernel, seq " << sq << " element " << i;
  }
  // The softmax path on the 40-token sequence: S = q k^T per head, masked softmax, then P v.
  const int64_t t0 = r.bounds[1], L = 40;
  std::vector<float> S(nH * L * L);
  for (int64_t h = 0; h < nH; ++h)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < L; ++j) {
        float s = 0.0f;
        for (int64_t c = 0; c < dq; ++c)
          s += q[((t0 + i) * nH + h) * dq + c] * k[((t0 + j) * nH + h) * dq + c];
        S[(h * L + i) * L + j] = s;
      }
  gpu::DeviceBuffer dS = up(S);
  std::vector<const uint32_t*> rows(nH, dkeep.as<uint32_t>() + t0 * words);
  gpu::DeviceBuffer drows = up(rows);
  causal_softmax(dS.as<float>(), nH, L, scale, st(), 0, nullptr, nH, drows.as<const uint32_t*>(),
                 words);
  const auto P = down<float>(dS, S.size());
  std::vector<float> want(L * nH * dv);
  ops::attention_causal(q.data() + t0 * nH * dq, nH * dq, k.data() + t0 * nH * dq, nH * dq,
                        v.data() + t0 * nH * dv, nH * dv, L, nH, nH, dq, dv, scale, want.data(),
                        nullptr, 0, keep.data() + t0 * words, words);
  for (int64_t h = 0; h < nH; ++h)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t c = 0; c < dv; ++c) {
        double o = 0;
        for (int64_t j = 0; j < L; ++j)
          o += P[(h * L + i) * L + j] * v[((t0 + j) * nH + h) * dv + c];
        ASSERT_NEAR(o, want[(i * nH + h) * dv + c], 1e-5)
            << "softmax path, head " << h << " row " << i;
      }
}

}  // namespace
}  // namespace strata::ops::cuda
