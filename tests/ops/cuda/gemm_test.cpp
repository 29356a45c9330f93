// ops/cuda/gemm.h and ops/cuda/parallel_gemm.h against ops::linear and ops::attention_causal.
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/parallel_gemm.h"
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

// ParallelGemms issues every job as the same gemm call from its threads: the bytes are those of
// one stream whatever the thread count (ops/cuda/parallel_gemm.h), and match ops::linear.
TEST_F(CudaOps, ParallelGemmsGiveTheBytesOfOneStream) {
  void* blas = gemm_handle_create(st());
  const int64_t k = 96, n = 40;
  const std::vector<int64_t> rows = {5, 0, 1, 17, 64, 3, 29};
  std::vector<std::vector<float>> xs, ws;
  std::vector<gpu::DeviceBuffer> dx, dw, dy1, dy3;
  std::vector<GemmJob> one, three;
  for (int64_t m : rows) {
    xs.push_back(f32_of(bf16_of(normal(m * k))));
    ws.push_back(f32_of(bf16_of(normal(n * k, 0.1f))));
    dx.push_back(up(bf16_of(xs.back())));
    dw.push_back(up(bf16_of(ws.back())));
    dy1.push_back(buffer(m * n * 4));
    dy3.push_back(buffer(m * n * 4));
    one.push_back({dx.back().data(), dw.back().data(), dy1.back().as<float>(), m, n, k});
    three.push_back({dx.back().data(), dw.back().data(), dy3.back().as<float>(), m, n, k});
  }
  {
    ParallelGemms serial(1, true), threads(3, true);
    EXPECT_EQ(threads.threads(), 3);
    serial.run(s(), blas, one);
    threads.run(s(), blas, three);
    s().synchronize();
  }
  for (size_t g = 0; g < rows.size(); ++g) {
    const int64_t m = rows[g];
    const auto y1 = down<float>(dy1[g], m * n);
    const auto y3 = down<float>(dy3[g], m * n);
    for (int64_t i = 0; i < m * n; ++i)
      ASSERT_EQ(bits_of(y3[i]), bits_of(y1[i])) << "job " << g << " element " << i;
    std::vector<float> want(m * n);
    ops::linear(xs[g].data(), m, k, ws[g].data(), n, want.data());
    expect_gemm_close(y1, want, xs[g], ws[g], m, k, n, "ParallelGemms");
  }
  gemm_handle_destroy(blas);
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
