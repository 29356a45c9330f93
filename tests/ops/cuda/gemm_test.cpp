// ops/cuda/gemm.h and ops/cuda/expert_gemm.h against ops::linear and ops::attention_causal.
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/expert_gemm.h"
#include "ops/cuda/gemm.h"
#include "ops/ops.h"
#include "tests/ops/cuda/cuda_test_util.h"

namespace strata::ops::cuda {
namespace {

std::vector<uint16_t> bf16_of(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    b[i] = f32_to_bf16(v[i]);
  return b;
}
std::vector<float> f32_of(const std::vector<uint16_t>& b) {
  std::vector<float> v(b.size());
  for (size_t i = 0; i < b.size(); ++i)
    v[i] = strata::bf16_to_f32(b[i]);
  return v;
}

// Both sides sum the same k products in fp32 in different orders. bf16 inputs: the products are
// exact; fp32 inputs (pedantic): each product rounds once. Each result lies within
// (k + 1) u sum|x_i w_i| of the exact sum (u = 2^-24; accumulation that truncates: 2u), so the
// two differ by at most 2 (k + 1) 2u sum|x_i w_i|.
void expect_gemm_close(const std::vector<float>& got, const std::vector<float>& want,
                       const std::vector<float>& x, const std::vector<float>& w, int64_t m,
                       int64_t k, int64_t n, const char* what) {
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c) {
      double mag = 0.0;
      for (int64_t d = 0; d < k; ++d)
        mag += std::fabs(static_cast<double>(x[r * k + d]) * w[c * k + d]);
      const double tol = 4.0 * static_cast<double>(k + 1) * 0x1p-24 * mag + 1e-30;
      ASSERT_NEAR(got[r * n + c], want[r * n + c], tol)
          << what << " m=" << m << " k=" << k << " n=" << n << " at " << r << "," << c;
    }
  }
}

// gemm: y = x . w^T as ops::linear, with bf16 inputs (x and w rounded to bf16 on both sides) and
// with fp32 inputs; odd shapes and a single row included.
TEST_F(CudaOps, GemmMatchesLinearWithinTheAccumulationBound) {
  void* blas = gemm_handle_create(st());
  const int64_t shapes[][3] = {{64, 256, 384}, {1, 16, 8}, {7, 37, 13}, {33, 128, 65}, {3, 1, 5}};
  for (bool bf16 : {true, false}) {
    for (const auto& sh : shapes) {
      const int64_t m = sh[0], k = sh[1], n = sh[2];
      std::vector<float> x = normal(m * k), w = normal(n * k, 0.05f);
      gpu::DeviceBuffer dx, dw;
      if (bf16) {
        const std::vector<uint16_t> xb = bf16_of(x), wb = bf16_of(w);
        x = f32_of(xb);
        w = f32_of(wb);
        dx = up(xb);
        dw = up(wb);
      } else {
        dx = up(x);
        dw = up(w);
      }
      gpu::DeviceBuffer dy = buffer(m * n * 4);
      gemm(blas, dx.data(), dw.data(), dy.as<float>(), m, n, k, bf16);
      const auto y = down<float>(dy, m * n);
      std::vector<float> want(m * n);
      ops::linear(x.data(), m, k, w.data(), n, want.data());
      expect_gemm_close(y, want, x, w, m, k, n, bf16 ? "bf16" : "fp32");
    }
  }
  gemm_handle_destroy(blas);
}

// expert_plan + expert_gemm: every expert's rows against its own weights, as ops::linear per
// expert. Ragged counts: empty experts, one row, exactly one tile, several tiles with a partial
// last one; K with and without the vector loads (K % 8) and with a partial k step; N with a
// partial column block; one and two outputs; bf16 and fp32.
TEST_F(CudaOps, ExpertGemmIsLinearPerExpert) {
  const std::vector<int32_t> counts = {5, 0, 1, 300, 64, 0, 3, 129, 128};
  const int64_t E = static_cast<int64_t>(counts.size());
  int64_t S = 0;
  for (int32_t c : counts)
    S += c;
  // The smallest of 16, 32, 64 rows at least the experts' mean, else 128; fp32: 64.
  EXPECT_EQ(expert_row_tile(S, E, false), 64);
  EXPECT_EQ(expert_row_tile(16 * E, E, true), 16);
  EXPECT_EQ(expert_row_tile(16 * E + 1, E, true), 32);
  EXPECT_EQ(expert_row_tile(64 * E, E, true), 64);
  EXPECT_EQ(expert_row_tile(64 * E + 1, E, true), 128);
  const int64_t shapes[][3] = {{96, 40, 2}, {100, 200, 1}, {40, 128, 2}, {8, 3, 1}};  // K, N, outs
  for (int64_t tile : {16, 32, 64, 128}) {
    // The plan: offsets, the first tile of each expert and the row counters, by hand.
    std::vector<int32_t> offsets(E + 1, 0), tile_first(E + 1, 0);
    for (int64_t e = 0; e < E; ++e) {
      offsets[e + 1] = offsets[e] + counts[e];
      tile_first[e + 1] = tile_first[e] + static_cast<int32_t>((counts[e] + tile - 1) / tile);
    }
    gpu::DeviceBuffer dcounts = up(counts), doff = buffer((E + 1) * 4);
    gpu::DeviceBuffer dtiles = buffer((E + 1) * 4), drows = up(std::vector<uint64_t>(2 * E, 7));
    expert_plan(dcounts.as<int32_t>(), E, tile, doff.as<int32_t>(), dtiles.as<int32_t>(),
                drows.as<uint64_t>(), drows.as<uint64_t>() + E, st());
    EXPECT_EQ(down<int32_t>(doff, E + 1), offsets);
    EXPECT_EQ(down<int32_t>(dtiles, E + 1), tile_first);
    const auto rows = down<uint64_t>(drows, 2 * E);
    for (int64_t e = 0; e < 2 * E; ++e)
      EXPECT_EQ(rows[e], 7u + static_cast<uint64_t>(counts[e % E])) << e;
    EXPECT_GE(expert_gemm_max_tiles(S, E, tile), tile_first[E]);
    for (bool bf16 : {true, false}) {
      if (!bf16 && tile != 64) continue;  // fp32 takes 64-row tiles only
      for (const auto& sh : shapes) {
        const int64_t K = sh[0], N = sh[1];
        const int n_out = static_cast<int>(sh[2]);
        std::vector<float> x = normal(S * K);
        if (bf16) x = f32_of(bf16_of(x));
        gpu::DeviceBuffer dx = bf16 ? up(bf16_of(x)) : up(x);
        std::vector<std::vector<float>> w(n_out * E);
        std::vector<gpu::DeviceBuffer> dw;
        std::vector<const void*> table(n_out * E);
        for (size_t i = 0; i < w.size(); ++i) {
          w[i] = normal(N * K, 0.1f);
          if (bf16) w[i] = f32_of(bf16_of(w[i]));
          dw.push_back(bf16 ? up(bf16_of(w[i])) : up(w[i]));
          table[i] = dw.back().data();
        }
        gpu::DeviceBuffer dtable = up(table);
        ExpertGemmOutputs out;
        out.n_out = n_out;
        std::vector<gpu::DeviceBuffer> dy;
        for (int j = 0; j < n_out; ++j) {
          dy.push_back(up(std::vector<float>(S * N, std::nanf(""))));  // unwritten: NaN
          out.w[j] = dtable.as<const void*>() + j * E;
          out.y[j] = dy.back().as<float>();
        }
        expert_gemm(dx.data(), S, K, doff.as<int32_t>(), dtiles.as<int32_t>(), E, tile, out, N,
                    bf16, true, st());
        for (int j = 0; j < n_out; ++j) {
          const auto y = down<float>(dy[j], S * N);
          for (int64_t e = 0; e < E; ++e) {
            const int64_t m = counts[e];
            if (m == 0) continue;
            const std::vector<float> xe(x.begin() + offsets[e] * K, x.begin() + offsets[e + 1] * K);
            const std::vector<float> ye(y.begin() + offsets[e] * N, y.begin() + offsets[e + 1] * N);
            std::vector<float> want(m * N);
            const std::vector<float>& we = w[j * E + e];
            ops::linear(xe.data(), m, K, we.data(), N, want.data());
            expect_gemm_close(ye, want, xe, we, m, K, N,
                              bf16 ? "expert_gemm bf16" : "expert_gemm fp32");
          }
        }
      }
    }
  }
}

// Expert parallelism's premise (docs/SCALEOUT.md "Expert parallel on GPU ranks"): an expert's
// row gives the same bits whichever tile size runs it (expert_row_tile follows the rows and groups
// of the call, which differ between one process and a rank) and whatever rows share its call: the
// same rows, run as one process's experts and as a rank's groups (the rows of each expert split
// between two source ranks, in another order), give identical outputs, for every row tile.
TEST_F(CudaOps, ExpertGemmRowBitsDoNotDependOnTileOrNeighbours) {
  const std::vector<int32_t> counts = {37, 0, 5, 200, 1, 64};
  const int64_t E = static_cast<int64_t>(counts.size()), K = 136, N = 72;
  int64_t S = 0;
  for (int32_t c : counts)
    S += c;
  for (bool bf16 : {true, false}) {
    std::vector<float> x = normal(S * K);
    if (bf16) x = f32_of(bf16_of(x));
    std::vector<gpu::DeviceBuffer> dw;
    std::vector<const void*> table(E);
    for (int64_t e = 0; e < E; ++e) {
      std::vector<float> w = normal(N * K, 0.1f);
      dw.push_back(bf16 ? up(bf16_of(w)) : up(w));
      table[e] = dw.back().data();
    }
    // Runs `rows` (indices into x) grouped as `group_counts`, group g using expert expert_of[g];
    // returns each row's output in the order of `rows`.
    auto run = [&](const std::vector<int64_t>& rows, const std::vector<int32_t>& group_counts,
                   const std::vector<int64_t>& expert_of, int64_t tile) {
      const int64_t G = static_cast<int64_t>(group_counts.size()),
                    R = static_cast<int64_t>(rows.size());
      std::vector<float> xr(R * K);
      for (int64_t r = 0; r < R; ++r)
        std::copy_n(&x[rows[r] * K], K, &xr[r * K]);
      std::vector<const void*> tg(G);
      for (int64_t g = 0; g < G; ++g)
        tg[g] = table[expert_of[g]];
      gpu::DeviceBuffer dx = bf16 ? up(bf16_of(xr)) : up(xr), dt = up(tg), dc = up(group_counts);
      gpu::DeviceBuffer doff = buffer((G + 1) * 4), dtiles = buffer((G + 1) * 4);
      gpu::DeviceBuffer dy = up(std::vector<float>(R * N, std::nanf("")));
      expert_plan(dc.as<int32_t>(), G, tile, doff.as<int32_t>(), dtiles.as<int32_t>(), nullptr,
                  nullptr, st());
      ExpertGemmOutputs out;
      out.w[0] = dt.as<const void*>();
      out.y[0] = dy.as<float>();
      expert_gemm(dx.data(), R, K, doff.as<int32_t>(), dtiles.as<int32_t>(), G, tile, out, N, bf16,
                  true, st());
      return down<float>(dy, R * N);
    };
    // One process: every expert's rows in order.
    std::vector<int64_t> rows(S), experts(E);
    for (int64_t r = 0; r < S; ++r)
      rows[r] = r;
    for (int64_t e = 0; e < E; ++e)
      experts[e] = e;
    const std::vector<float> ref = run(rows, counts, experts, bf16 ? 16 : 64);
    // A rank's groups: source rank q in {0, 1} sends the odd (q = 0) or even rows of each expert,
    // reversed; groups (q, e) in rank order.
    std::vector<int64_t> rank_rows, group_experts;
    std::vector<int32_t> group_counts;
    for (int q = 0; q < 2; ++q) {
      int64_t first = 0;
      for (int64_t e = 0; e < E; ++e) {
        int32_t n = 0;
        for (int64_t r = first + counts[e] - 1; r >= first; --r) {
          if ((r % 2 == 1) != (q == 0)) continue;
          rank_rows.push_back(r);
          ++n;
        }
        group_counts.push_back(n);
        group_experts.push_back(e);
        first += counts[e];
      }
    }
    for (int64_t tile : {16, 32, 64, 128}) {
      if (!bf16 && tile != 64) continue;  // fp32 takes 64-row tiles only
      const std::vector<float> one = run(rows, counts, experts, tile);
      const std::vector<float> ranked = run(rank_rows, group_counts, group_experts, tile);
      for (int64_t i = 0; i < S; ++i) {
        for (int64_t c = 0; c < N; ++c) {
          ASSERT_EQ(bits_of(one[i * N + c]), bits_of(ref[i * N + c]))
              << (bf16 ? "bf16" : "fp32") << " tile " << tile << " row " << i << " col " << c;
          const int64_t r = rank_rows[i];
          ASSERT_EQ(bits_of(ranked[i * N + c]), bits_of(ref[r * N + c]))
              << (bf16 ? "bf16" : "fp32") << " tile " << tile << " (as a rank's groups) row " << r
              << " col " << c;
        }
      }
    }
  }
}

// The forward's attention through GEMMs: per (sequence, head) S = Q K^T, causal_softmax(scale S),
// O = P V, for a batch of sequences of one length and a GQA head layout, against
// ops::attention_causal. Pedantic fp32: the steps differ from the CPU's in summation order and
// expf (~1e-6 relative). TF32 rounds Q, K, P and V to 11 significant bits (2^-11 relative each):
// ~1e-3 of |v| on the outputs; 2e-2 still catches a wrong head, row or stride (O(1)).
TEST_F(CudaOps, BatchedAttentionGemmsMatchCausalAttention) {
  void* blas = gemm_handle_create(st());
  const int64_t n_seq = 3, L = 23, nH = 4, nKV = 2, dq = 40, dv = 24;
  // Rows padded past the heads (as a fused projection's slices are), 16-byte aligned as the
  // forward's are.
  const int64_t T = n_seq * L, qs = nH * dq + 4, ks = nKV * dq, vs = nKV * dv + 4, os = nH * dv;
  const std::vector<float> q = normal(T * qs), k = normal(T * ks), v = normal(T * vs);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dq));
  gpu::DeviceBuffer dq_ = up(q), dk = up(k), dv_ = up(v);
  gpu::DeviceBuffer dS = buffer(n_seq * nH * L * L * 4), dout = buffer(T * os * 4);
  const int64_t batch = n_seq * nH;
  std::vector<const float*> pq, pk, pv;
  std::vector<float*> ps, po;
  for (int64_t sq = 0; sq < n_seq; ++sq) {
    for (int64_t h = 0; h < nH; ++h) {
      const int64_t b = sq * L, g = h / (nH / nKV), i = sq * nH + h;
      pq.push_back(dq_.as<float>() + b * qs + h * dq);
      pk.push_back(dk.as<float>() + b * ks + g * dq);
      pv.push_back(dv_.as<float>() + b * vs + g * dv);
      ps.push_back(dS.as<float>() + i * L * L);
      po.push_back(dout.as<float>() + b * os + h * dv);
    }
  }
  gpu::DeviceBuffer apq = up(pq), apk = up(pk), apv = up(pv), aps = up(ps), apo = up(po);
  std::vector<float> want(T * os);
  for (int64_t sq = 0; sq < n_seq; ++sq)
    ops::attention_causal(q.data() + sq * L * qs, qs, k.data() + sq * L * ks, ks,
                          v.data() + sq * L * vs, vs, L, nH, nKV, dq, dv, scale,
                          want.data() + sq * L * os);
  for (bool tf32 : {false, true}) {
    gemm_batched_qk(blas, apq.as<const float*>(), qs, apk.as<const float*>(), ks, aps.as<float*>(),
                    L, dq, batch, tf32);
    causal_softmax(dS.as<float>(), batch, L, scale, st());
    gemm_batched_pv(blas, aps.as<const float*>(), apv.as<const float*>(), vs, apo.as<float*>(), os,
                    L, dv, batch, tf32);
    const auto out = down<float>(dout, T * os);
    const float rel = tf32 ? 2e-2f : 2e-5f;
    for (int64_t i = 0; i < T * os; ++i)
      ASSERT_NEAR(out[i], want[i], rel * (1.0f + std::fabs(want[i])))
          << (tf32 ? "tf32" : "fp32") << " token " << i / os << " head " << i % os / dv;
  }
  gemm_handle_destroy(blas);
}

}  // namespace
}  // namespace strata::ops::cuda
