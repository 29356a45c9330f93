// ops/cuda/moe.h: slots grouped by expert, rows gathered, expert outputs combined as
// y[t] = sum_j weight[t, j] * expert_j(x[t]) (spec/architectures.md §2; model/common.h
// CpuBackend::moe sums in slot order).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/dtype.h"
#include "ops/cuda/amax.h"
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

}  // namespace
}  // namespace strata::ops::cuda
