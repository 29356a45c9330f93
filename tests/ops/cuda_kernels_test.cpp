// The GPU forward's kernels (ops/cuda/*.h) against CPU references on fresh random inputs:
// FP8-block decompression against io/source_weights.h (bit-identical bf16), noaux_tc routing
// against the formula of spec/architectures.md §3 written out here, the assembly of MLA's
// per-head K and V, RMSNorm against its formula, per-row amaxes routed to several slots, and
// Kimi Delta Attention's kernels (ops/cuda/kda.h) against the CPU ops the CPU forward
// uses (ops/ops.h) on ragged sequences.
// Label gpu; skipped without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "core/device.h"
#include "core/gpu_memory.h"
#include "io/source_weights.h"
#include "ops/cuda/amax.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/convert.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/kda.h"
#include "ops/cuda/norm.h"
#include "ops/cuda/routing.h"
#include "ops/ops.h"

namespace strata::ops::cuda {
namespace {

using gpu::DeviceBudget;
using gpu::DeviceBuffer;
using gpu::Stream;

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

template <typename T>
DeviceBuffer upload(DeviceBudget& budget, const Stream& s, const std::vector<T>& v) {
  DeviceBuffer b(budget, std::max<uint64_t>(v.size() * sizeof(T), 4), "test input");
  if (!v.empty()) s.copy_to_device(b.data(), v.data(), v.size() * sizeof(T));
  return b;
}
template <typename T>
std::vector<T> download(const Stream& s, const DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  if (n > 0) s.copy_to_host(v.data(), b.data(), n * sizeof(T));
  s.synchronize();
  return v;
}

TEST_F(CudaKernels, Fp8BlocksDecompressLikeTheCpu) {
  std::mt19937 rng(3);
  DeviceBudget budget(1ull << 30);
  Stream s;
  // Odd sizes (partial blocks), every e4m3 code but NaN, scales over several binades.
  for (auto [out, in] : {std::pair<int64_t, int64_t>{130, 260}, {7, 128}, {256, 100}}) {
    const int64_t br = (out + 127) / 128, bc = (in + 127) / 128;
    Tensor w8 = Tensor::zeros(DType::kF8E4M3, {out, in});
    uint8_t* w = w8.mutable_data<uint8_t>();
    for (int64_t i = 0; i < out * in; ++i) {
      uint8_t b = static_cast<uint8_t>(rng() & 0xFF);
      if ((b & 0x7F) == 0x7F) b ^= 1;  // not NaN
      w[i] = b;
    }
    Tensor sc = Tensor::zeros(DType::kF32, {br, bc});
    std::uniform_real_distribution<float> e(-12.0f, 4.0f);
    for (int64_t i = 0; i < br * bc; ++i)
      sc.mutable_data<float>()[i] = std::exp2(e(rng)) * (1.0f + static_cast<float>(i % 7) / 9.0f);
    const Tensor ref = decompress_fp8_block(w8, sc, 128, "test");
    std::vector<uint8_t> hw(w, w + out * in);
    std::vector<float> hs(sc.data<float>(), sc.data<float>() + br * bc);
    DeviceBuffer dw = upload(budget, s, hw), ds = upload(budget, s, hs);
    DeviceBuffer d16(budget, static_cast<uint64_t>(out * in) * 2, "bf16");
    DeviceBuffer d32(budget, static_cast<uint64_t>(out * in) * 4, "f32");
    dequant_fp8_block(dw.as<uint8_t>(), out, in, 128, ds.data(), DType::kF32, d16.data(), true,
                      s.handle());
    dequant_fp8_block(dw.as<uint8_t>(), out, in, 128, ds.data(), DType::kF32, d32.data(), false,
                      s.handle());
    const auto g16 = download<uint16_t>(s, d16, static_cast<size_t>(out * in));
    const auto g32 = download<float>(s, d32, static_cast<size_t>(out * in));
    const uint16_t* r = ref.data<uint16_t>();
    for (int64_t i = 0; i < out * in; ++i) {
      ASSERT_EQ(g16[i], r[i]) << "element " << i << " of [" << out << ", " << in << "]";
      uint32_t bits = static_cast<uint32_t>(r[i]) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      ASSERT_EQ(std::memcmp(&g32[i], &f, 4), 0) << "element " << i;
    }
  }
}

// spec/architectures.md §3, noaux_tc, one token: s = sigmoid(logit) in fp32; choice = s + bias;
// a group's score is the sum of its two largest choices; keep the topk_group best groups; top-k
// of choice among their experts (ties to the lower index); weight = s (normalised) · scaling.
void route_reference(const float* x, int64_t E, int64_t K, const float* bias, int64_t groups,
                     int64_t keep_groups, bool norm, float scaling, int32_t* chosen,
                     float* weight) {
  std::vector<float> sg(E), ch(E);
  for (int64_t e = 0; e < E; ++e) {
    sg[e] = 1.0f / (1.0f + std::exp(-x[e]));
    ch[e] = sg[e] + bias[e];
  }
  const int64_t per = E / groups;
  std::vector<std::pair<float, int64_t>> gs;
  for (int64_t g = 0; g < groups; ++g) {
    std::vector<float> v(ch.begin() + g * per, ch.begin() + (g + 1) * per);
    std::sort(v.begin(), v.end(), std::greater<>());
    gs.push_back({v[0] + (per > 1 ? v[1] : 0.0f), g});
  }
  std::stable_sort(gs.begin(), gs.end(), [](auto a, auto b) { return a.first > b.first; });
  std::vector<std::pair<float, int64_t>> cand;
  for (int64_t j = 0; j < keep_groups; ++j)
    for (int64_t i = 0; i < per; ++i)
      cand.push_back({ch[gs[j].second * per + i], gs[j].second * per + i});
  std::stable_sort(cand.begin(), cand.end(), [](auto a, auto b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  float sum = 0.0f;
  for (int64_t j = 0; j < K; ++j)
    sum += sg[cand[j].second];
  for (int64_t j = 0; j < K; ++j) {
    chosen[j] = static_cast<int32_t>(cand[j].second);
    weight[j] = (norm ? sg[cand[j].second] / (sum + 1e-20f) : sg[cand[j].second]) * scaling;
  }
}

TEST_F(CudaKernels, SigmoidGroupedRoutingFollowsTheFormula) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  DeviceBudget budget(1ull << 30);
  Stream s;
  struct Case {
    int64_t E, K, groups, keep;
    bool norm;
  };
  for (Case c : {Case{8, 3, 4, 2, true}, Case{64, 6, 8, 3, true}, Case{16, 2, 1, 1, false},
                 Case{256, 8, 8, 4, true}}) {
    const int64_t T = 97;
    std::vector<float> x(static_cast<size_t>(T * c.E)), bias(static_cast<size_t>(c.E));
    for (float& v : x)
      v = nd(rng);
    for (float& v : bias)
      v = 0.1f * nd(rng);
    DeviceBuffer dx = upload(budget, s, x), db = upload(budget, s, bias);
    DeviceBuffer dc(budget, static_cast<uint64_t>(T * c.K) * 4, "chosen");
    DeviceBuffer dw(budget, static_cast<uint64_t>(T * c.K) * 4, "weight");
    DeviceBuffer dn = upload(budget, s, std::vector<int32_t>(static_cast<size_t>(c.E), 0));
    route_sigmoid_grouped(dx.as<float>(), T, c.E, c.K, db.as<float>(), c.groups, c.keep, c.norm,
                          2.5f, dc.as<int32_t>(), dw.as<float>(), dn.as<int32_t>(), s.handle());
    const auto chosen = download<int32_t>(s, dc, static_cast<size_t>(T * c.K));
    const auto weight = download<float>(s, dw, static_cast<size_t>(T * c.K));
    const auto counts = download<int32_t>(s, dn, static_cast<size_t>(c.E));
    std::vector<int32_t> want_counts(static_cast<size_t>(c.E), 0);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> rc(static_cast<size_t>(c.K));
      std::vector<float> rw(static_cast<size_t>(c.K));
      route_reference(&x[t * c.E], c.E, c.K, bias.data(), c.groups, c.keep, c.norm, 2.5f, rc.data(),
                      rw.data());
      for (int64_t j = 0; j < c.K; ++j) {
        ASSERT_EQ(chosen[t * c.K + j], rc[j]) << "E=" << c.E << " token " << t << " slot " << j;
        EXPECT_NEAR(weight[t * c.K + j], rw[j], 1e-6f * std::fabs(rw[j]) + 1e-12f);
        ++want_counts[static_cast<size_t>(rc[j])];
      }
    }
    EXPECT_EQ(counts, want_counts);
  }
}

TEST_F(CudaKernels, MlaKeysAndValuesPerHead) {
  const int64_t T = 5, nH = 3, dn = 4, dr = 2, dv = 3;
  std::vector<float> kv(static_cast<size_t>(T * nH * (dn + dv))), kr(static_cast<size_t>(T * dr));
  for (size_t i = 0; i < kv.size(); ++i)
    kv[i] = static_cast<float>(i);
  for (size_t i = 0; i < kr.size(); ++i)
    kr[i] = -1.0f - static_cast<float>(i);
  DeviceBudget budget(1ull << 20);
  Stream s;
  DeviceBuffer dkv = upload(budget, s, kv), dkr = upload(budget, s, kr);
  DeviceBuffer dk(budget, static_cast<uint64_t>(T * nH * (dn + dr)) * 4, "k");
  DeviceBuffer dvv(budget, static_cast<uint64_t>(T * nH * dv) * 4, "v");
  mla_kv(dkv.as<float>(), dkr.as<float>(), T, nH, dn, dr, dv, dk.as<float>(), dvv.as<float>(),
         s.handle());
  const auto k = download<float>(s, dk, static_cast<size_t>(T * nH * (dn + dr)));
  const auto v = download<float>(s, dvv, static_cast<size_t>(T * nH * dv));
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

// y = x / sqrt(mean(x^2) + eps) * w, the mean in fp64 (as ops::rms_norm): rows of a head's width
// and of a hidden state's (one warp per row), and wider than 8192 (one block per row).
TEST_F(CudaKernels, RmsNormFollowsTheFormula) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  DeviceBudget budget(1ull << 30);
  Stream s;
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{37, 128}, {5, 2048}, {3, 7}, {2, 9000}}) {
    std::vector<float> x(static_cast<size_t>(rows * dim)), w(static_cast<size_t>(dim));
    for (float& v : x)
      v = nd(rng);
    for (float& v : w)
      v = 1.0f + nd(rng) / 10.0f;
    DeviceBuffer dx = upload(budget, s, x), dw = upload(budget, s, w);
    DeviceBuffer dy(budget, x.size() * 4, "y");
    const float eps = 1e-6f;
    rms_norm(dx.as<float>(), rows, dim, dw.as<float>(), eps, dy.as<float>(), s.handle());
    const auto y = download<float>(s, dy, x.size());
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0.0;
      for (int64_t i = 0; i < dim; ++i)
        ss += static_cast<double>(x[r * dim + i]) * x[r * dim + i];
      const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(dim)) + eps);
      for (int64_t i = 0; i < dim; ++i) {
        const float want = x[r * dim + i] * inv * w[i];
        ASSERT_NEAR(y[r * dim + i], want, std::fabs(want) * 1e-6f + 1e-30f)
            << rows << "x" << dim << " row " << r << " col " << i;
      }
    }
  }
}

// Row r's max |x| goes to slots[row_slot[r * per_row + j]] for every j: a token's input to each
// of its experts' slots (per_row = K), and one slot per row (per_row = 1).
TEST_F(CudaKernels, RowAmaxesReachEverySlotTheyName) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> ud(-4.0f, 4.0f);
  DeviceBudget budget(1ull << 28);
  Stream s;
  const int64_t rows = 300, cols = 2049, slots = 17;
  for (int64_t per_row : {1, 3}) {
    std::vector<float> x(static_cast<size_t>(rows * cols));
    for (float& v : x)
      v = ud(rng);
    x[7 * cols + 2048] = -123.0f;  // the last column, negative
    std::vector<int32_t> slot_of(static_cast<size_t>(rows * per_row));
    for (int32_t& v : slot_of)
      v = static_cast<int32_t>(rng() % (slots - 1));  // the last slot stays untouched
    std::vector<float> want(static_cast<size_t>(slots), 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      float m = 0.0f;
      for (int64_t c = 0; c < cols; ++c)
        m = std::max(m, std::fabs(x[r * cols + c]));
      for (int64_t j = 0; j < per_row; ++j)
        want[slot_of[r * per_row + j]] = std::max(want[slot_of[r * per_row + j]], m);
    }
    DeviceBuffer dx = upload(budget, s, x), ds = upload(budget, s, slot_of);
    DeviceBuffer out(budget, slots * 4, "slots");
    s.zero(out.data(), slots * 4);
    amax_rows(dx.as<float>(), rows, cols, ds.as<int32_t>(), out.as<uint32_t>(), s.handle(),
              per_row);
    const auto bits = download<uint32_t>(s, out, static_cast<size_t>(slots));
    for (int64_t i = 0; i < slots; ++i) {
      float got;
      std::memcpy(&got, &bits[i], 4);
      EXPECT_EQ(got, want[i]) << "slot " << i << ", per_row " << per_row;
    }
  }
}

// ---- Kimi Delta Attention (ops/cuda/kda.h) against the CPU ops of
// model/kimi_linear.cpp.

// A ragged batch: sequences of these lengths (one empty, one of a single token, some shorter
// than the convolution), concatenated; bounds [n + 1] and each token's sequence start.
struct Ragged {
  std::vector<int64_t> bounds, start;
  int64_t T = 0;
  explicit Ragged(const std::vector<int64_t>& lengths) {
    bounds.push_back(0);
    for (int64_t len : lengths) {
      for (int64_t i = 0; i < len; ++i)
        start.push_back(bounds.back());
      bounds.push_back(bounds.back() + len);
    }
    T = bounds.back();
  }
  int64_t seqs() const { return static_cast<int64_t>(bounds.size()) - 1; }
};
const std::vector<int64_t> kLengths = {5, 1, 17, 0, 3, 40, 2};

// Conv + SiLU against ops::causal_conv1d run per sequence, then ops::silu. Error: at most K
// products summed (a fused multiply-add on the device rounds once where the host may round
// twice) and expf within 2 ulp: a few ulp of the largest |w x| (inputs O(1)): 1e-5 absolute and
// relative is ~100 ulp of margin, and any tap read across a sequence start shows as O(0.1).
TEST_F(CudaKernels, KdaConvSiluRestartsAtEachSequence) {
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  DeviceBudget budget(1ull << 30);
  Stream s;
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
    DeviceBuffer dx = upload(budget, s, x), dw = upload(budget, s, w);
    DeviceBuffer ds = upload(budget, s, r.start);
    DeviceBuffer dy(budget, x.size() * 4, "y");
    kda_conv_silu(dx.as<float>(), r.T, C, dw.as<float>(), K, ds.as<int64_t>(), dy.as<float>(),
                  s.handle());
    const auto y = download<float>(s, dy, x.size());
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_NEAR(y[i], want[i], 1e-5f + 1e-5f * std::fabs(want[i]))
          << "C " << C << " K " << K << " token " << i / C << " channel " << i % C;
  }
}

// L2 norm per head (then the CPU's separate scale) against ops::l2_norm: the same fp64 sum up to
// order, the same float sqrt and division, so a few ulp at most (1e-6 relative ~ 8 ulp).
TEST_F(CudaKernels, L2NormScaleMatchesOps) {
  std::mt19937 rng(22);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  DeviceBudget budget(1ull << 30);
  Stream s;
  for (auto [rows, dim, scale] : {std::tuple<int64_t, int64_t, float>{66, 32, 1.0f},
                                  {9, 128, 1.0f / std::sqrt(128.0f)},
                                  {5, 7, 0.5f}}) {
    std::vector<float> x(static_cast<size_t>(rows * dim));
    for (float& v : x)
      v = nd(rng);
    x[0] = 0.0f;  // a row with a zero still normalises
    std::vector<float> want = x;
    ops::l2_norm(want.data(), rows, dim, 1e-6f);
    for (float& v : want)
      v *= scale;
    DeviceBuffer dx = upload(budget, s, x);
    l2_norm_scale(dx.as<float>(), rows, dim, 1e-6f, scale, s.handle());
    const auto y = download<float>(s, dx, x.size());
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_NEAR(y[i], want[i], 1e-6f * std::fabs(want[i]) + 1e-30f)
          << rows << "x" << dim << " element " << i;
  }
}

// The forget gate's formula (spec/architectures.md §4) in fp32 as the CPU forward writes it,
// sigmoid and the sigmoid gate against ops::sigmoid. expf/logf are within 2 ulp: 1e-5 relative,
// plus for softplus of very negative z, log(1 + e^z) in fp32 carries the rounding of 1 + e^z
// (6e-8 absolute, whichever exp rounds it): 1e-6 absolute before the rate. The sigmoids: 1e-6
// relative (a 2-ulp expf and two roundings).
TEST_F(CudaKernels, KdaGatesFollowTheFormula) {
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);
  DeviceBudget budget(1ull << 30);
  Stream s;
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
  DeviceBuffer dg = upload(budget, s, f), ddt = upload(budget, s, dt),
               da = upload(budget, s, a_log);
  kda_forget_gate(dg.as<float>(), T, nH, d, da.as<float>(), ddt.as<float>(), s.handle());
  const auto g = download<float>(s, dg, f.size());
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
  std::vector<float> x(200), gate(200);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = u(rng);
    gate[i] = u(rng) * 3.0f;
  }
  DeviceBuffer dx = upload(budget, s, x), dgate = upload(budget, s, gate);
  DeviceBuffer dsig = upload(budget, s, gate);
  sigmoid_inplace(dsig.as<float>(), static_cast<int64_t>(gate.size()), s.handle());
  mul_sigmoid(dx.as<float>(), dgate.as<float>(), static_cast<int64_t>(x.size()), s.handle());
  const auto sig = download<float>(s, dsig, gate.size());
  const auto y = download<float>(s, dx, x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float sg = ops::sigmoid(gate[i]);
    ASSERT_NEAR(sig[i], sg, 1e-6f * sg + 1e-30f) << i;
    ASSERT_NEAR(y[i], x[i] * sg, 1e-6f * std::fabs(x[i] * sg) + 1e-30f) << i;
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
TEST_F(CudaKernels, GatedDeltaRuleMatchesOpsPerSequence) {
  std::mt19937 rng(24);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), g01(0.0f, 1.0f);
  DeviceBudget budget(1ull << 30);
  Stream s;
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
    DeviceBuffer dq = upload(budget, s, q), dk_ = upload(budget, s, k), dv_ = upload(budget, s, v);
    DeviceBuffer dg = upload(budget, s, g), db = upload(budget, s, beta);
    DeviceBuffer dbounds = upload(budget, s, r.bounds);
    DeviceBuffer dout(budget, v.size() * 4, "out");
    gated_delta_rule(dq.as<float>(), dk_.as<float>(), dv_.as<float>(), dg.as<float>(),
                     db.as<float>(), dbounds.as<int64_t>(), r.seqs(), nH, dk, dv, dout.as<float>(),
                     s.handle());
    const auto o = download<float>(s, dout, v.size());
    double worst = 0.0;
    for (size_t i = 0; i < o.size(); ++i) {
      ASSERT_NEAR(o[i], want[i], 1e-3f * (1.0f + std::fabs(want[i])))
          << "nH " << nH << " dk " << dk << " dv " << dv << " token " << i / (nH * dv) << " head "
          << i / dv % nH << " column " << i % dv;
      worst = std::max(worst, static_cast<double>(std::fabs(o[i] - want[i])));
    }
    std::printf("gated_delta_rule nH %lld dk %lld dv %lld: max |gpu - cpu| %.3g\n",
                static_cast<long long>(nH), static_cast<long long>(dk), static_cast<long long>(dv),
                worst);
  }
}

}  // namespace
}  // namespace strata::ops::cuda
