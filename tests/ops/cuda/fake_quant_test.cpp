// strata compare's serving simulation on the device (ops/cuda/fake_quant.h, CudaBackend's
// fake_quantize, input_quant in linears and moe) against the CPU's scalar references
// (quant/quantized.h fake_quantize, CpuBackend), bit for bit.
#include <cmath>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/cpu_backend.h"
#include "ops/cuda/cuda_backend.h"
#include "quant/quantized.h"
#include "tests/ops/cuda/cuda_test_util.h"

namespace strata::ops::cuda {
namespace {

using Kind = ActQuant::Kind;

// The fixture, with the helpers the free functions below use made public to them.
class FakeQuant : public CudaOps {
 public:
  using CudaOps::normal;
  using CudaOps::rng;
  using CudaOps::up;

 protected:
  void SetUp() override {
    CudaOps::SetUp();
    if (IsSkipped()) return;
    be_ = std::make_unique<CudaBackend>(budget(), s(), CudaBackendOptions{}, 4, 0);
    be_->reserve_scratch(16ull << 20);
  }
  std::unique_ptr<CudaBackend> be_;
};

// Rows of 64 values (two MXFP8 blocks, four NVFP4 blocks) whose blocks span many binades, with
// the cases each quantizer treats apart: an all-zero block, signed zeros, a NaN, infinities of
// both signs, a block far below the E4M3 scales (NVFP4's underflow rule), values near FP8's
// saturation, and values on the E2M1 / E4M3 rounding midpoints of a block scale of 1.
std::vector<float> cases(FakeQuant& t, int64_t rows) {
  std::vector<float> x = t.normal(static_cast<size_t>(rows * 64));
  for (int64_t b = 0; b < rows * 4; ++b) {  // each 16-block its own binade, 2^-40 .. 2^20
    const int e = static_cast<int>(t.rng()() % 61) - 40;
    for (int i = 0; i < 16; ++i)
      x[b * 16 + i] = std::ldexp(x[b * 16 + i], e);
  }
  auto row = [&](int64_t r) { return &x[static_cast<size_t>(r * 64)]; };
  std::fill(row(0), row(0) + 32, 0.0f);  // zero blocks (MXFP8 and NVFP4)
  row(0)[3] = -0.0f;
  row(1)[5] = NAN;
  row(2)[7] = INFINITY;
  row(3)[40] = -INFINITY;
  for (int i = 0; i < 16; ++i)
    row(4)[i] = std::ldexp(1.0f + i / 16.0f, -140);  // NVFP4: the scale underflows
  for (int i = 0; i < 16; ++i)
    row(5)[i] = (i % 2 ? -1.0f : 1.0f) * (440.0f + 4.0f * i);  // FP8 saturation, E4M3 ties
  // Block amax 6 under a global scale of 1: descale 1, so these sit on E2M1's midpoints.
  const float mids[16] = {6.0f,   0.25f,  0.75f,  1.25f,  1.75f, 2.5f,  3.5f,  5.0f,
                          -0.25f, -0.75f, -1.25f, -1.75f, -2.5f, -3.5f, -5.0f, 5.5f};
  std::copy(mids, mids + 16, row(6));
  return x;
}

TEST_F(FakeQuant, EveryFormatMatchesTheCpuReferenceBitForBit) {
  const int64_t rows = 40, cols = 64;
  const std::vector<float> x = cases(*this, rows);
  for (const ActQuant q :
       {ActQuant{Kind::kNvfp4, 1.0f}, ActQuant{Kind::kNvfp4, 0.0123f},
        ActQuant{Kind::kNvfp4, 3e-7f}, ActQuant{Kind::kFp8, 1.0f}, ActQuant{Kind::kFp8, 0.037f},
        ActQuant{Kind::kFp8, 1e-30f}, ActQuant{Kind::kMxfp8, 0.0f}, ActQuant{}}) {
    SCOPED_TRACE("kind " + std::to_string(static_cast<int>(q.kind)) + " scale " +
                 std::to_string(q.scale));
    std::vector<float> want = x;
    fake_quantize(q, want.data(), rows, cols, "x");
    gpu::DeviceBuffer d = up(x);
    be_->fake_quantize(d.as<float>(), rows, cols, q, "x");
    const std::vector<float> got = down<float>(d, x.size());
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(bits_of(got[i]), bits_of(want[i]))
          << "element " << i << " of " << x[i] << ": " << got[i] << " vs " << want[i];
  }
}

// The CPU's one-line errors, before anything runs.
TEST_F(FakeQuant, RefusesWhatTheCpuRefuses) {
  gpu::DeviceBuffer d = buffer(48 * 4);
  EXPECT_THROW(be_->fake_quantize(d.as<float>(), 2, 24, {Kind::kNvfp4, 1.0f}, "k_cache"), Error);
  EXPECT_THROW(be_->fake_quantize(d.as<float>(), 1, 16, {Kind::kNvfp4, 0.0f}, "q_proj"), Error);
  EXPECT_THROW(be_->fake_quantize(d.as<float>(), 1, 16, {Kind::kFp8, NAN}, "v_cache"), Error);
  EXPECT_THROW(be_->fake_quantize(d.as<float>(), 1, 48, {Kind::kMxfp8, 0.0f}, "x"), Error);
}

// A weight W[out, in] as each backend holds it: fp32 on the host, the GEMM dtype on the device.
struct Mat {
  std::vector<float> host;
  gpu::DeviceBuffer dev;
  Weight cpu, gpu;
};
Mat mat(FakeQuant& t, std::vector<float> w, int64_t out, int64_t in, bool bf16, bool f32 = false) {
  Mat m;
  m.host = std::move(w);
  if (bf16 && !f32) {
    std::vector<uint16_t> b(m.host.size());
    for (size_t i = 0; i < b.size(); ++i)
      b[i] = f32_to_bf16(m.host[i]);
    m.dev = t.up(b);
  } else {
    m.dev = t.up(m.host);
  }
  m.cpu = Weight{m.host.data(), {out, in}, f32};
  m.gpu = Weight{m.dev.data(), {out, in}, f32};
  return m;
}

// linears() with input_quant gives the bits of linears() without it on the CPU reference's
// quantized input (the GEMMs are the same; only the input differs): two projections with
// different quantizations of one input and an fp32 gate beside them, bf16 and fp32 GEMMs.
TEST_F(FakeQuant, LinearsQuantizeEachWeightsInputAsTheReference) {
  const int64_t m = 37, k = 64, n = 48;
  std::vector<float> xs = normal(m * k);
  for (int64_t b = 0; b < m * k / 16; ++b) {  // blocks of several binades
    for (int64_t i = 0; i < 16; ++i)
      xs[b * 16 + i] = std::ldexp(xs[b * 16 + i], static_cast<int>(b % 9) - 4);
  }
  for (bool bf16 : {true, false}) {
    SCOPED_TRACE(bf16 ? "bf16 GEMMs" : "fp32 GEMMs");
    CudaBackendOptions o;
    o.gemm_bf16 = bf16;
    CudaBackend be(budget(), s(), o, 4, 0);
    be.reserve_scratch(16ull << 20);
    const ActQuant qa{Kind::kNvfp4, 0.05f}, qb{Kind::kFp8, 0.02f};
    Mat a = mat(*this, normal(n * k, 0.1f), n, k, bf16),
        b = mat(*this, normal(n * k, 0.1f), n, k, bf16),
        g = mat(*this, normal(4 * k, 0.1f), 4, k, bf16, true);
    a.gpu.input_quant = qa;
    b.gpu.input_quant = qb;
    gpu::DeviceBuffer dx = up(xs), ya = buffer(m * n * 4), yb = buffer(m * n * 4),
                      yg = buffer(m * 4 * 4);
    be.linears(dx.as<float>(), m,
               {{&a.gpu, ya.as<float>()}, {&g.gpu, yg.as<float>()}, {&b.gpu, yb.as<float>()}});
    const std::vector<float> got_a = down<float>(ya, m * n), got_b = down<float>(yb, m * n),
                             got_g = down<float>(yg, m * 4);
    // The reference: the input quantized on the host, then the plain GEMMs.
    auto plain = [&](const ActQuant& q, Weight w, int64_t rows_out) {
      std::vector<float> in = xs;
      fake_quantize(q, in.data(), m, k, "x");
      w.input_quant = {};
      gpu::DeviceBuffer din = up(in), dy = buffer(m * rows_out * 4);
      be.linear(din.as<float>(), m, w, dy.as<float>());
      return down<float>(dy, m * rows_out);
    };
    const std::vector<float> want_a = plain(qa, a.gpu, n), want_b = plain(qb, b.gpu, n),
                             want_g = plain({}, g.gpu, 4);
    for (int64_t i = 0; i < m * n; ++i) {
      ASSERT_EQ(bits_of(got_a[i]), bits_of(want_a[i])) << "NVFP4 input, element " << i;
      ASSERT_EQ(bits_of(got_b[i]), bits_of(want_b[i])) << "FP8 input, element " << i;
    }
    for (int64_t i = 0; i < m * 4; ++i)
      ASSERT_EQ(bits_of(got_g[i]), bits_of(want_g[i])) << "fp32 gate, element " << i;
  }
}

// moe() with the experts' input quantizations against CpuBackend::moe, bit for bit. The values are
// chosen so that both backends compute exactly, whatever their summation orders: integer inputs
// and weights, power-of-two global scales (every quantized value then has a few significant bits,
// exact in bf16 too), gate outputs of at least 60 (silu(g) = g exactly), one expert per token
// (weight 1). So any difference is the simulation's.
TEST_F(FakeQuant, MoeQuantizesTheExpertsInputsAsTheCpu) {
  constexpr int64_t T = 53, H = 64, I = 96, E = 5, K = 1;
  auto ints = [&](size_t n, int lo, int hi) {
    std::vector<float> v(n);
    for (float& x : v)
      x = static_cast<float>(lo + static_cast<int>(rng()() % (hi - lo + 1)));
    return v;
  };
  const std::vector<float> n = ints(T * H, 1, 4);
  std::vector<float> logits(T * E);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e)
      logits[t * E + e] = static_cast<float>((t * 7 + e * 3) % E) * 4.0f;  // one clear winner
  struct Case {
    ActQuant gate_up, down;
  };
  for (const Case c : {Case{{Kind::kNvfp4, 0x1p-6f}, {Kind::kFp8, 512.0f}},
                       Case{{Kind::kFp8, 0x1p-4f}, {Kind::kNvfp4, 0x1p4f}},
                       Case{{Kind::kMxfp8, 0.0f}, {Kind::kMxfp8, 0.0f}}}) {
    for (bool bf16 : {true, false}) {
      SCOPED_TRACE(std::string(bf16 ? "bf16" : "fp32") + " GEMMs, gate/up kind " +
                   std::to_string(static_cast<int>(c.gate_up.kind)));
      std::vector<Mat> mats;
      mats.reserve(3 * E);
      std::vector<Mlp> cpu(E), gpu(E);
      for (int64_t e = 0; e < E; ++e) {
        mats.push_back(mat(*this, ints(I * H, 1, 2), I, H, bf16));
        mats.push_back(mat(*this, ints(I * H, -1, 1), I, H, bf16));
        mats.push_back(mat(*this, ints(H * I, -1, 1), H, I, bf16));
        Mat* w = &mats[mats.size() - 3];
        for (std::vector<Mlp>* side : {&cpu, &gpu}) {
          Mlp& m = (*side)[e];
          const bool on_gpu = side == &gpu;
          m.hidden = H;
          m.inter = I;
          m.gate = on_gpu ? w[0].gpu : w[0].cpu;
          m.up = on_gpu ? w[1].gpu : w[1].cpu;
          m.down = on_gpu ? w[2].gpu : w[2].cpu;
          m.gate.input_quant = m.up.input_quant = c.gate_up;
          m.down.input_quant = c.down;
          const std::string p = "experts." + std::to_string(e) + ".";
          m.gate_up_names = {p + "gate_proj", p + "up_proj"};
          m.down_names = {p + "down_proj"};
        }
      }
      // CPU.
      CpuBackend cb(nullptr, nullptr);
      std::vector<float> cl = logits, cw(T * K), want(T * H);
      std::vector<int32_t> cc(T * K);
      cb.route_softmax(cl.data(), T, E, K, {true, false}, cc.data(), cw.data());
      cb.moe(n.data(), T, H, K, cc.data(), cw.data(), cpu, want.data());
      // GPU.
      CudaBackendOptions o;
      o.gemm_bf16 = bf16;
      CudaBackend be(budget(), s(), o, 3 * E, E);
      be.reserve_scratch(64ull << 20);
      gpu::DeviceBuffer dl = up(logits), dc = buffer(T * K * 4), dw = buffer(T * K * 4), dn = up(n),
                        dy = buffer(T * H * 4);
      be.route_softmax(dl.as<float>(), T, E, K, {true, false}, dc.as<int32_t>(), dw.as<float>());
      be.moe(dn.as<float>(), T, H, K, dc.as<int32_t>(), dw.as<float>(), gpu, dy.as<float>());
      const std::vector<float> got = down<float>(dy, T * H);
      ASSERT_EQ(down<int32_t>(dc, T * K), cc);
      for (int64_t i = 0; i < T * H; ++i)
        ASSERT_EQ(bits_of(got[i]), bits_of(want[i])) << "element " << i;
      // Experts with different input scales are refused (the GPU takes one per layer).
      gpu[2].down.input_quant.scale *= 2.0f;
      if (c.down.kind != Kind::kMxfp8) {
        EXPECT_THROW(
            be.moe(dn.as<float>(), T, H, K, dc.as<int32_t>(), dw.as<float>(), gpu, dy.as<float>()),
            Error);
      }
    }
  }
}

}  // namespace
}  // namespace strata::ops::cuda
