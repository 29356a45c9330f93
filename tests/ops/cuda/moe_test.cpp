// ops/cuda/moe.h: slots grouped by expert, rows gathered, expert outputs combined as
// y[t] = sum_j weight[t, j] * expert_j(x[t]) (spec/architectures.md §2; model/common.h
// CpuBackend::moe sums in slot order).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "ops/cuda/amax.h"
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/moe.h"
#include "tests/ops/cuda/cuda_test_util.h"

namespace strata::ops::cuda {
namespace {

TEST_F(CudaOps, MoeScatterGatherCombine) {
  const int64_t T = 37, K = 3, E = 11, H = 21, S = T * K;
  // Each token picks K distinct experts; experts 9 and 10 are never chosen (empty groups).
  std::vector<int32_t> chosen(S), counts(E, 0), offsets(E, 0);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> e(E);
    std::iota(e.begin(), e.end(), 0);
    std::shuffle(e.begin(), e.end() - 2, rng());
    std::copy_n(e.begin(), K, &chosen[t * K]);
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
  const auto row_expert = down<int32_t>(drow, S);
  // pos is a permutation of the slots that puts expert e's slots in [offsets[e], + counts[e]).
  std::vector<int> hit(S, 0);
  for (int64_t s = 0; s < S; ++s) {
    const int32_t e = chosen[s];
    ASSERT_GE(pos[s], offsets[e]) << "slot " << s;
    ASSERT_LT(pos[s], offsets[e] + counts[e]) << "slot " << s;
    ++hit[pos[s]];
    ASSERT_EQ(row_expert[pos[s]], e) << "slot " << s;
  }
  for (int64_t r = 0; r < S; ++r)
    ASSERT_EQ(hit[r], 1) << "row " << r;

  // Gather: row pos[s] is token s / K's row, exactly, in fp32 and in bf16 bits.
  const auto x = normal(T * H);
  std::vector<uint16_t> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    xb[i] = f32_to_bf16(x[i]);
  gpu::DeviceBuffer dx = up(x), dxb = up(xb), dg = buffer(S * H * 4), dgb = buffer(S * H * 2);
  moe_gather(dx.as<float>(), T, H, K, dpos.as<int32_t>(), dg.as<float>(), st());
  moe_gather(dxb.as<uint16_t>(), T, H, K, dpos.as<int32_t>(), dgb.as<uint16_t>(), st());
  const auto g = down<float>(dg, S * H);
  const auto gb = down<uint16_t>(dgb, S * H);
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t c = 0; c < H; ++c) {
      ASSERT_EQ(bits_of(g[pos[s] * H + c]), bits_of(x[(s / K) * H + c])) << s << "," << c;
      ASSERT_EQ(gb[pos[s] * H + c], xb[(s / K) * H + c]) << s << "," << c;
    }
  }

  // Combine: the expert outputs of row r are its gathered row scaled by (r + 1). Reference in
  // fp64; the device sums K fp32 terms in slot order, each step one rounding (or a fused
  // multiply-add): within K u sum_j |w_j o_j|, with u = 2^-24.
  std::vector<float> eo(S * H);
  for (int64_t r = 0; r < S; ++r)
    for (int64_t c = 0; c < H; ++c)
      eo[r * H + c] = g[r * H + c] * static_cast<float>(r + 1);
  const auto weight = normal(S);
  gpu::DeviceBuffer deo = up(eo), dw = up(weight), dy = buffer(T * H * 4);
  moe_combine(deo.as<float>(), dpos.as<int32_t>(), dw.as<float>(), T, K, H, dy.as<float>(), st());
  const auto y = down<float>(dy, T * H);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < H; ++c) {
      double want = 0.0, mag = 0.0;
      for (int64_t j = 0; j < K; ++j) {
        // Expert chosen[t*K + j] applied to token t: its output sits in row pos[t*K + j].
        const double term = static_cast<double>(weight[t * K + j]) * eo[pos[t * K + j] * H + c];
        want += term;
        mag += std::fabs(term);
      }
      ASSERT_NEAR(y[t * H + c], want, 2.0 * K * 0x1p-24 * mag + 1e-30) << t << "," << c;
    }
  }
}

// Expert parallelism's meta (CudaBackend::moe_exchanged): each slot's row carries its expert and
// its token's max |x| (bits, as amax_rows takes over n), and the owner's side unpacks the experts
// and takes each row's amax into its expert's slot: the slots then equal amax_rows over n with
// per_row = K, bit for bit (a NaN token included).
TEST_F(CudaOps, MoeDispatchMetaCarriesExpertAndTokenAmax) {
  const int64_t T = 29, K = 2, E = 7, H = 45, S = T * K;
  std::vector<int32_t> chosen(S), counts(E, 0), offsets(E, 0);
  for (int64_t t = 0; t < T; ++t) {
    chosen[t * K] = static_cast<int32_t>(t % E);
    chosen[t * K + 1] =
        static_cast<int32_t>((t * 3 + 1) % E == t % E ? (t + 1) % E : (t * 3 + 1) % E);
  }
  for (int32_t e : chosen)
    ++counts[e];
  for (int64_t e = 1; e < E; ++e)
    offsets[e] = offsets[e - 1] + counts[e - 1];
  std::vector<float> n = normal(T * H);
  n[5 * H + 7] = std::nanf("");
  gpu::DeviceBuffer dc = up(chosen), doff = up(offsets), dcur = up(std::vector<int32_t>(E, 0));
  gpu::DeviceBuffer dpos = buffer(S * 4), drow = buffer(S * 4), dn = up(n);
  moe_scatter(dc.as<int32_t>(), S, doff.as<int32_t>(), dcur.as<int32_t>(), dpos.as<int32_t>(),
              drow.as<int32_t>(), st());
  gpu::DeviceBuffer dmeta = buffer(S * 8);
  moe_dispatch_meta(dn.as<float>(), T, H, K, dc.as<int32_t>(), dpos.as<int32_t>(),
                    dmeta.as<int32_t>(), st());
  const auto pos = down<int32_t>(dpos, S);
  const auto meta = down<int32_t>(dmeta, 2 * S);
  for (int64_t s = 0; s < S; ++s) {
    uint32_t m = 0;
    for (int64_t c = 0; c < H; ++c)
      m = std::max(m, bits_of(n[(s / K) * H + c]) & 0x7fffffffu);
    ASSERT_EQ(meta[2 * pos[s]], chosen[s]) << "slot " << s;
    ASSERT_EQ(static_cast<uint32_t>(meta[2 * pos[s] + 1]), m) << "slot " << s;
  }
  // The owner's side against amax_rows over n.
  gpu::DeviceBuffer dslots = up(std::vector<uint32_t>(E, 0)),
                    dref = up(std::vector<uint32_t>(E, 0));
  gpu::DeviceBuffer dre = buffer(S * 4);
  moe_receive_meta(dmeta.as<int32_t>(), S, dre.as<int32_t>(), dslots.as<uint32_t>(), st());
  amax_rows(dn.as<float>(), T, H, dc.as<int32_t>(), dref.as<uint32_t>(), st(), K);
  EXPECT_EQ(down<uint32_t>(dslots, E), down<uint32_t>(dref, E));
  EXPECT_EQ(down<int32_t>(dre, S), down<int32_t>(drow, S));
}

// moe_add_bias: each row gets its own expert's bias (one fp32 addition, so exact against the
// same addition on the host); an expert without a bias leaves its rows as they are.
TEST_F(CudaOps, MoeAddBiasPerRowExpert) {
  const int64_t S = 41, W = 19, E = 5;
  std::vector<int32_t> row_expert(S);
  for (int64_t r = 0; r < S; ++r)
    row_expert[r] = static_cast<int32_t>((r * 7) % E);
  const auto y0 = normal(S * W);
  std::vector<std::vector<float>> bias(E);
  std::vector<gpu::DeviceBuffer> db;
  std::vector<const float*> table(E, nullptr);
  for (int64_t e = 0; e < E; ++e) {
    if (e == 2) continue;  // no bias
    bias[e] = normal(W);
    db.push_back(up(bias[e]));
    table[e] = db.back().as<float>();
  }
  gpu::DeviceBuffer dy = up(y0), dre = up(row_expert), dt = up(table);
  moe_add_bias(dy.as<float>(), S, W, dre.as<int32_t>(), dt.as<const float*>(), st());
  const auto y = down<float>(dy, S * W);
  for (int64_t r = 0; r < S; ++r) {
    const int32_t e = row_expert[r];
    for (int64_t c = 0; c < W; ++c) {
      const float want = e == 2 ? y0[r * W + c] : y0[r * W + c] + bias[e][c];
      ASSERT_EQ(bits_of(y[r * W + c]), bits_of(want)) << r << "," << c;
    }
  }
}

// Routed experts decompressed in slices (CudaBackend::reserve_expert_slice, docs/CUDA.md
// "Memory"): CudaBackend::moe with deferred INT4 pack-quantized (SwiGLU) and MXFP4 (gpt-oss's
// interleaved gate_up with biases) experts, in slices of 1, 3 and all 7 experts, gives the bits
// of the same experts decompressed up front (one launch per projection): outputs and the
// observers' amaxes and rows, for bf16 and fp32 GEMMs. Then the device quantizer's deferred
// weights: the amax and the FP8 encoding of the bf16 decompression.
class ExpertSlices : public CudaOps {
 protected:
  static constexpr int64_t T = 45, H = 64, I = 96, E = 7, K = 2, kGroup = 32;

  // One compressed weight [out, in] in device memory.
  struct Stored {
    gpu::DeviceBuffer values, scales;
    Compressed c;
  };
  Stored int4(int64_t out, int64_t in) {
    std::vector<uint8_t> v(static_cast<size_t>(out * in / 2));
    for (uint8_t& b : v)
      b = static_cast<uint8_t>(rng()() & 0xff);
    std::vector<uint16_t> sc(static_cast<size_t>(out * in / kGroup));
    for (uint16_t& x : sc)
      x = f32_to_bf16(uniform(1, 0.01f, 0.05f)[0]);
    Stored st{up(v), up(sc), {}};
    st.c.kind = Compressed::Kind::kInt4Pack;
    st.c.values = st.values.data();
    st.c.scales = st.scales.data();
    st.c.scale_dtype = DType::kBF16;
    st.c.group = kGroup;
    return st;
  }
  Stored mxfp4(int64_t out, int64_t in) {
    const int64_t groups = in / 32;
    std::vector<uint8_t> v(static_cast<size_t>(out * groups * 16)), sc(out * groups);
    for (uint8_t& b : v)
      b = static_cast<uint8_t>(rng()() & 0xff);
    for (uint8_t& x : sc)
      x = static_cast<uint8_t>(120 + rng()() % 8);
    Stored st{up(v), up(sc), {}};
    st.c.kind = Compressed::Kind::kMxfp4;
    st.c.values = st.values.data();
    st.c.scales = st.scales.data();
    st.c.stored_cols = groups;
    return st;
  }

  // The experts, and for each weight its compressed form (deferred) or its decompression in the
  // GEMM dtype (up front).
  struct Experts {
    std::vector<Stored> stored;
    std::vector<gpu::DeviceBuffer> decompressed, biases;
    std::vector<Mlp> eager, deferred;
  };
  Experts make(bool interleaved, bool bf16) {
    Experts x;
    x.stored.reserve(3 * E);
    for (int64_t e = 0; e < E; ++e) {
      Mlp m;
      m.hidden = H;
      m.inter = I;
      m.interleaved = interleaved;
      const std::string p = "experts." + std::to_string(e) + ".";
      auto weight = [&](int64_t out, int64_t in) {
        x.stored.push_back(interleaved ? mxfp4(out, in) : int4(out, in));
        const Stored& st = x.stored.back();
        x.decompressed.push_back(buffer(static_cast<uint64_t>(out * in) * (bf16 ? 2 : 4)));
        decompress_weight(st.c, out, in, x.decompressed.back().data(), bf16, this->st());
        return std::pair<Weight, Weight>{Weight{x.decompressed.back().data(), {out, in}, false},
                                         Weight{nullptr, {out, in}, false}};
      };
      Mlp d = m;
      if (interleaved) {
        m.alpha = d.alpha = 1.702f;
        m.limit = d.limit = 7.0f;
        m.gate_up_names = d.gate_up_names = {p + "gate_up_proj"};
        auto [gu, gud] = weight(2 * I, H);
        gud.compressed = x.stored.back().c;
        m.gate_up = gu;
        d.gate_up = gud;
        x.biases.push_back(up(normal(2 * I, 0.1f)));
        m.gate_up_bias = d.gate_up_bias = Weight{x.biases.back().data(), {2 * I}, true};
        x.biases.push_back(up(normal(H, 0.1f)));
        m.down_bias = d.down_bias = Weight{x.biases.back().data(), {H}, true};
      } else {
        m.gate_up_names = d.gate_up_names = {p + "gate_proj", p + "up_proj"};
        auto [g, gd] = weight(I, H);
        gd.compressed = x.stored.back().c;
        auto [u, ud] = weight(I, H);
        ud.compressed = x.stored.back().c;
        m.gate = g;
        m.up = u;
        d.gate = gd;
        d.up = ud;
      }
      m.down_names = d.down_names = {p + "down_proj"};
      auto [dn, dnd] = weight(H, I);
      dnd.compressed = x.stored.back().c;
      m.down = dn;
      d.down = dnd;
      x.eager.push_back(m);
      x.deferred.push_back(d);
    }
    return x;
  }

  struct Run {
    std::vector<float> y;
    std::vector<AmaxStat> stats;
  };
  Run run(CudaBackend& be, const std::vector<Mlp>& experts, const std::vector<float>& logits,
          const gpu::DeviceBuffer& n) {
    gpu::DeviceBuffer dl = up(logits), dc = buffer(T * K * 4), dw = buffer(T * K * 4),
                      dy = buffer(T * H * 4);
    be.clear_slots();
    be.route_softmax(dl.as<float>(), T, E, K, {}, dc.as<int32_t>(), dw.as<float>());
    be.moe(n.as<float>(), T, H, K, dc.as<int32_t>(), dw.as<float>(), experts, dy.as<float>());
    Run r;
    r.y = down<float>(dy, T * H);
    r.stats = be.take_stats();
    return r;
  }
};

TEST_F(ExpertSlices, DeferredExpertsInSlicesGiveTheBitsOfUpFront) {
  for (bool interleaved : {false, true}) {
    for (bool bf16 : {true, false}) {
      SCOPED_TRACE(std::string(interleaved ? "MXFP4 gate_up" : "INT4 gate/up") +
                   (bf16 ? ", bf16 GEMMs" : ", fp32 GEMMs"));
      Experts x = make(interleaved, bf16);
      CudaBackendOptions o;
      o.gemm_bf16 = bf16;
      CudaBackend be(budget(), s(), o, 2 * E, E);
      be.reserve_scratch(64ull << 20);
      const std::vector<float> logits = normal(T * E);
      const gpu::DeviceBuffer n = up(normal(T * H));
      const Run want = run(be, x.eager, logits, n);
      for (int64_t slice : {int64_t{1}, int64_t{3}, E}) {
        SCOPED_TRACE("slice of " + std::to_string(slice));
        be.reserve_expert_slice(slice, CudaBackend::expert_slot_bytes(x.deferred[0], bf16));
        const Run got = run(be, x.deferred, logits, n);
        ASSERT_EQ(got.y.size(), want.y.size());
        for (size_t i = 0; i < want.y.size(); ++i)
          ASSERT_EQ(bits_of(got.y[i]), bits_of(want.y[i])) << i;
        ASSERT_EQ(got.stats.size(), want.stats.size());
        for (size_t i = 0; i < want.stats.size(); ++i) {
          EXPECT_EQ(got.stats[i].name, want.stats[i].name);
          EXPECT_EQ(bits_of(got.stats[i].amax), bits_of(want.stats[i].amax)) << got.stats[i].name;
          EXPECT_EQ(got.stats[i].rows, want.stats[i].rows) << got.stats[i].name;
        }
      }
    }
  }
}

TEST_F(ExpertSlices, QuantizerDecompressesADeferredWeightToBf16) {
  Experts x = make(false, true);  // INT4; `decompressed` holds the bf16 decompressions
  s().synchronize();              // the quantizer runs on a stream of its own
  CudaBackend be(budget(), s(), CudaBackendOptions{}, 4, 0);
  be.reserve_scratch(static_cast<uint64_t>(I * H * 2));
  be.reserve_decompression(static_cast<uint64_t>(I * H * 2));
  be.use_for_quantization(0);
  const StoredWeight deferred{nullptr, DType::kBF16, I, H, x.stored[0].c};
  const StoredWeight bf16{x.decompressed[0].data(), DType::kBF16, I, H};
  const StoredWeight deferred_up{nullptr, DType::kBF16, I, H, x.stored[1].c};
  const StoredWeight bf16_up{x.decompressed[1].data(), DType::kBF16, I, H};
  float got[2], want[2];
  be.weight_amaxes({{deferred, deferred_up}, {deferred_up}}, got);
  be.weight_amaxes({{bf16, bf16_up}, {bf16_up}}, want);
  for (int g = 0; g < 2; ++g)
    EXPECT_EQ(bits_of(got[g]), bits_of(want[g])) << g;
  const QuantizedWeight a = be.quantize_weight(deferred, QFormat::kFp8, want[0], "w");
  const QuantizedWeight b = be.quantize_weight(bf16, QFormat::kFp8, want[0], "w");
  ASSERT_EQ(a.fp8->weight.nbytes(), b.fp8->weight.nbytes());
  EXPECT_EQ(std::memcmp(a.fp8->weight.bytes(), b.fp8->weight.bytes(), a.fp8->weight.nbytes()), 0);
  EXPECT_EQ(a.fp8->scale.item_f32(0), b.fp8->scale.item_f32(0));
}

}  // namespace
}  // namespace strata::ops::cuda
