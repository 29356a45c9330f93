// Weight scale search (quant/scale_search.h): hand-worked blocks, and the choices NVIDIA ModelOpt
// 0.47 itself made on the CPU for the same weights (tests/quant/make_scale_search_fixtures.py,
// which says which ModelOpt path ran).
#include "quant/scale_search.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "tests/quant/test_util.h"

namespace strata {
namespace {

using quant_test::make_weight;

constexpr WeightCalib kSweep{WeightCalib::Method::kMse, true};
constexpr WeightCalib kMseBlocks{WeightCalib::Method::kMse, false};
constexpr WeightCalib kHessian{WeightCalib::Method::kLocalHessian, true};

std::vector<float> floats(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i)
    v[static_cast<size_t>(i)] = t.item_f32(i);
  return v;
}

// The squared (or Hessian-weighted) error of block b of row r encoded with byte s, in double:
// computed here from the dequantized export, independently of the search's own loop.
double block_error(const Tensor& w, float global_amax, int64_t r, int64_t b, uint8_t s,
                   const std::vector<double>& h) {
  const int64_t cols = w.dim(-1);
  std::vector<uint8_t> one(static_cast<size_t>(w.numel() / 16), s);
  const Tensor deq = nvfp4_dequantize(nvfp4_quantize_with_scales(w, global_amax, one, "w"));
  double dw[16];
  for (int64_t i = 0; i < 16; ++i) {
    const int64_t at = r * cols + 16 * b + i;
    dw[i] = static_cast<double>(w.item_f32(at)) - static_cast<double>(deq.item_f32(at));
  }
  double e = 0;
  for (int64_t i = 0; i < 16; ++i) {
    if (h.empty()) {
      e += dw[i] * dw[i];
      continue;
    }
    for (int64_t j = 0; j < 16; ++j)
      e += dw[i] * h[static_cast<size_t>((b * 16 + i) * 16 + j)] * dw[j];
  }
  return e;
}

// ---- hand-worked blocks ----------------------------------------------------------------------

// weight_scale_2 = A * fl32(1/2688) for A = 1; every weight is a power of two times it (exact).
TEST(ScaleSearch, SweepPicksTheSmallestExactScale) {
  const float A = 1.0f;
  const float g = nvfp4_global_scale(A);
  // Block 0: sixteen values 4g. Scales below 1 cannot hit 4 (4/s would need to be an e2m1 value
  // in (4, 6], i.e. s = 2/3, which e4m3 lacks); s = 1 (0x38) gives 4 exactly: zero error, the
  // first candidate that does. Max calibration would give s = e4m3(4/6) = 0.6875, and 4.125g.
  // Block 1: fifteen zeros and one 2^-6 g: exact at s = 2^-8 (code 4), the first such candidate
  // (2^-9 would need code 8).
  // Block 2: all zero: every candidate is exact; the first, 2^-9 (0x01), wins (ModelOpt's argmin
  // does the same, where max calibration writes 1.0).
  std::vector<float> v(48, 0.0f);
  for (int i = 0; i < 16; ++i)
    v[static_cast<size_t>(i)] = 4.0f * g;
  v[16 + 7] = 0x1p-6f * g;
  const Tensor w = make_weight(DType::kF32, {1, 48}, v);
  const std::vector<uint8_t> s = nvfp4_search_block_scales(w, A, kSweep, {}, "w");
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0], 0x38);  // 1.0
  EXPECT_EQ(s[1], 0x02);  // 2^-8
  EXPECT_EQ(s[2], 0x01);  // 2^-9
  const Tensor deq = nvfp4_dequantize(nvfp4_quantize_with_scales(w, A, s, "w"));
  for (int i = 0; i < 48; ++i)
    EXPECT_EQ(deq.item_f32(i), v[static_cast<size_t>(i)]) << i;
  // Max calibration's byte for block 0 is 0.6875 and misses 4g.
  EXPECT_EQ(nvfp4_quantize(w, A, "w").block_scale.data<uint8_t>()[0], f32_to_e4m3(0.6875f));
}

TEST(ScaleSearch, HessianWeightsTheError) {
  const float A = 1.0f;
  const float g = nvfp4_global_scale(A);
  // Fifteen values 4g and one 2^-6 g at index 7. The squared error is smallest at s = 1 (the 4g
  // exact, 2^-6 g lost); a Hessian that sees only feature 7 wants 2^-6 g exact: s = 2^-8.
  std::vector<float> v(16, 4.0f * g);
  v[7] = 0x1p-6f * g;
  const Tensor w = make_weight(DType::kF32, {1, 16}, v);
  EXPECT_EQ(nvfp4_search_block_scales(w, A, kSweep, {}, "w")[0], 0x38);
  BlockHessian h(16);
  std::vector<float> x(16, 0.0f);
  x[7] = 3.0f;
  h.accumulate(x.data(), 1);
  EXPECT_EQ(h.tokens(), 1);
  EXPECT_EQ(h.normalized()[7 * 16 + 7], 9.0);
  EXPECT_EQ(nvfp4_search_block_scales(w, A, kHessian, h.normalized(), "w")[0], 0x02);
}

// The searches' fast candidate error equals the scalar reference bit for bit: every positive
// finite scale byte, on blocks with zeros, negative zeros, ties at the E2M1 midpoints, values
// clipped above 6 x the descale, subnormal products, with and without a (non-symmetric, signed)
// Hessian.
TEST(ScaleSearch, FastBlockErrorIsTheReference) {
  std::mt19937 rng(20261205);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float global = 0x1.3p-7f;
  std::vector<std::vector<float>> blocks;
  for (int k = 0; k < 40; ++k) {
    std::vector<float> b(16);
    const float sd = std::ldexp(1.0f, k % 20 - 14);
    for (float& v : b)
      v = normal(rng) * sd;
    blocks.push_back(b);
  }
  std::vector<float> edge(16);  // exact midpoints and sign cases under descale 1 x global
  const float mids[] = {0.0f, -0.0f,  0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f,
                        5.0f, -0.25f, -2.5f, -3.5f, 5.5f,  -6.0f, 7.0f, -100.0f};
  for (int i = 0; i < 16; ++i)
    edge[static_cast<size_t>(i)] = mids[i] * global;
  blocks.push_back(edge);
  std::vector<double> h(256), ht(256);
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) {
      h[static_cast<size_t>(i * 16 + j)] = static_cast<double>(normal(rng)) + (i == j ? 4.0 : 0.0);
    }
  }
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j)
      ht[static_cast<size_t>(j * 16 + i)] = h[static_cast<size_t>(i * 16 + j)];
  int64_t compared = 0;
  for (const std::vector<float>& b : blocks) {
    for (int s = 0x01; s <= 0x7E; ++s) {
      const uint8_t byte = static_cast<uint8_t>(s);
      const float descale = e4m3_to_f32(byte) * global;
      const double ref = quant_detail::nvfp4_block_error(b.data(), byte, global, nullptr);
      const double fast = quant_detail::nvfp4_block_error_fast(b.data(), descale, nullptr);
      const double ref_h = quant_detail::nvfp4_block_error(b.data(), byte, global, h.data());
      const double fast_h = quant_detail::nvfp4_block_error_fast(b.data(), descale, ht.data());
      ASSERT_EQ(std::memcmp(&ref, &fast, 8), 0) << s << ": " << ref << " vs " << fast;
      ASSERT_EQ(std::memcmp(&ref_h, &fast_h, 8), 0) << s << ": " << ref_h << " vs " << fast_h;
      compared += 2;
    }
  }
  EXPECT_EQ(compared, 41 * 126 * 2);
}

// The search (whichever of its compiled versions this machine runs) picks, for every block, the
// first candidate with the least reference error (nvfp4_block_error): sweep, multipliers and
// local_hessian on a heavy-tailed weight.
TEST(ScaleSearch, SearchIsTheArgminOfTheReferenceError) {
  std::mt19937 rng(7);
  std::student_t_distribution<float> heavy(3.0f);
  const int64_t R = 6, C = 64;
  std::vector<float> v(static_cast<size_t>(R * C));
  for (float& x : v)
    x = heavy(rng) * 0.01f;
  const Tensor w = make_weight(DType::kF32, {R, C}, v);
  float amax = 0.0f;
  for (float x : v)
    amax = std::max(amax, std::fabs(x));
  std::vector<double> h(static_cast<size_t>(C / 16 * 256));
  std::normal_distribution<double> normal(0.0, 1.0);
  for (size_t n = 0; n < h.size(); n += 256) {
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j <= i; ++j) {
        const double x = normal(rng) * 0.3 + (i == j ? 2.0 : 0.0);
        h[n + static_cast<size_t>(i * 16 + j)] = h[n + static_cast<size_t>(j * 16 + i)] = x;
      }
  }
  const float global = nvfp4_global_scale(amax);
  const std::vector<float> mult = mse_multipliers(kMseBlocks);
  for (const auto& [calib, hess] :
       {std::pair{kSweep, std::vector<double>{}}, std::pair{kMseBlocks, std::vector<double>{}},
        std::pair{kHessian, h}}) {
    const std::vector<uint8_t> got = nvfp4_search_block_scales(w, amax, calib, hess, "w");
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t b = 0; b < C / 16; ++b) {
        const float* blk = v.data() + r * C + b * 16;
        std::vector<uint8_t> cands;
        if (calib.fp8_scale_sweep) {
          cands = nvfp4_sweep_scales(amax);
        } else {
          float ba = 0.0f;
          for (int i = 0; i < 16; ++i)
            ba = std::max(ba, std::fabs(blk[i]));
          for (float m : mult)
            cands.push_back(nvfp4_static_block_scale(ba * m, amax));
        }
        const double* hb = hess.empty() ? nullptr : hess.data() + b * 256;
        uint8_t best = cands[0];
        double best_e = INFINITY;
        for (uint8_t c : cands) {
          const double e = quant_detail::nvfp4_block_error(blk, c, global, hb);
          if (e < best_e) {
            best_e = e;
            best = c;
          }
        }
        EXPECT_EQ(got[static_cast<size_t>(r * (C / 16) + b)], best)
            << weight_calib_description(calib) << " row " << r << " block " << b;
      }
    }
  }
}

TEST(ScaleSearch, BlockHessianIsTheSecondMomentPerBlock) {
  // Two tokens, 32 features: H[n][i][j] = mean over tokens of x[16n+i] x[16n+j].
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i)
    x[static_cast<size_t>(i)] = static_cast<float>((i * 7) % 11) - 5.0f;
  BlockHessian h(32);
  h.accumulate(x.data(), 1);
  BlockHessian h2(32);
  h2.accumulate(x.data() + 32, 1);
  h.merge(h2);
  const std::vector<double> n = h.normalized();
  ASSERT_EQ(n.size(), 2u * 16 * 16);
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 16; ++j) {
        const double want = (double(x[b * 16 + i]) * x[b * 16 + j] +
                             double(x[32 + b * 16 + i]) * x[32 + b * 16 + j]) /
                            2.0;
        EXPECT_EQ(n[static_cast<size_t>((b * 16 + i) * 16 + j)], want);
      }
  EXPECT_THROW(BlockHessian{24}, Error);
}

TEST(ScaleSearch, MultipliersAreTorchLinspace) {
  // ceil(3.75 / 0.1) + 1 = 39 points from 0.25 to 4.0: the step is 3.75/38, not 0.1, and 1.0 is
  // not among them.
  const std::vector<float> m = mse_multipliers(kMseBlocks);
  ASSERT_EQ(m.size(), 39u);
  EXPECT_EQ(m.front(), 0.25f);
  EXPECT_EQ(m.back(), 4.0f);
  for (float x : m)
    EXPECT_NE(x, 1.0f);
  WeightCalib bad = kMseBlocks;
  bad.step_size = 0;
  EXPECT_THROW(mse_multipliers(bad), Error);
}

TEST(ScaleSearch, StaticBlockScaleOfACandidateIsTheCandidate) {
  for (float A : {1.0f, 0.0173f, 3.5e-5f, 812.0f, 2688.0f})
    for (int b = 1; b <= 0x7E; ++b) {
      const float cand = e4m3_to_f32(static_cast<uint8_t>(b)) / 448.0f;
      EXPECT_EQ(nvfp4_static_block_scale(A * cand, A), b) << A << " " << b;
    }
  // An amax of 0 exports 1.0 rescaled: 448 / (A/6) clamped to 448 for a small A.
  EXPECT_EQ(nvfp4_static_block_scale(0.0f, 1.0f), 0x7E);
}

TEST(ScaleSearch, GivenScalesEncodeAsTheMaxEncoder) {
  std::vector<float> v(4 * 64);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = std::sin(0.37f * static_cast<float>(i)) * (i % 13 == 0 ? 3.0f : 0.2f);
  const Tensor w = make_weight(DType::kBF16, {4, 64}, v);
  const Nvfp4Weight q = nvfp4_quantize(w, 3.0f, "w");
  const std::vector<uint8_t> bytes = quant_test::bytes_of(q.block_scale);
  const Nvfp4Weight q2 = nvfp4_quantize_with_scales(w, 3.0f, bytes, "w");
  EXPECT_EQ(quant_test::bytes_of(q2.packed), quant_test::bytes_of(q.packed));
  EXPECT_EQ(quant_test::bytes_of(q2.block_scale), bytes);
  EXPECT_THROW(nvfp4_quantize_with_scales(w, 3.0f, std::vector<uint8_t>(3, 0x38), "w"), Error);
  EXPECT_THROW(nvfp4_quantize_with_scales(w, 3.0f, std::vector<uint8_t>(16, 0x7F), "w"), Error);
}

// ---- ModelOpt's own choices --------------------------------------------------------------------

const SafetensorsFile& fixture() {
  static const SafetensorsFile f = SafetensorsFile::open(
      std::string(STRATA_SOURCE_DIR) + "/tests/quant/fixtures/scale_search.safetensors");
  return f;
}

struct Agreement {
  int64_t blocks = 0, same = 0;
  double worst_rel = 0;  // largest (err(ModelOpt's) - err(strata's)) / err(strata's) where differ
};

// strata's bytes against ModelOpt's per-block amax (as ModelOpt's export turns it into a byte).
Agreement compare_nvfp4(const std::string& c, const WeightCalib& calib, bool with_input) {
  const SafetensorsFile& f = fixture();
  const Tensor w = f.tensor(c + "/weight");
  const float A = f.tensor(c + "/global_amax").item_f32();
  const std::vector<float> amax = floats(f.tensor(c + "/amax"));
  const Tensor exported = f.tensor(c + "/export_scale");
  std::vector<double> h;
  if (with_input) {
    const Tensor x = f.tensor(c + "/input");
    BlockHessian acc(x.dim(1));
    acc.accumulate(floats(x).data(), x.dim(0));
    h = acc.normalized();
  }
  // ModelOpt's global amax is max|W| (max calibration), which the search keeps.
  float max_w = 0;
  for (float v : floats(w))
    max_w = std::max(max_w, std::fabs(v));
  EXPECT_EQ(A, max_w) << c;
  const std::vector<uint8_t> mine = nvfp4_search_block_scales(w, A, calib, h, c);
  Agreement a;
  const int64_t blocks_per_row = w.dim(1) / 16;
  for (size_t b = 0; b < mine.size(); ++b) {
    const uint8_t theirs = nvfp4_static_block_scale(amax[b], A);
    // The GPU-rule byte equals what ModelOpt's own (CPU) export wrote for that amax.
    EXPECT_EQ(theirs, exported.data<uint8_t>()[b]) << c << " block " << b;
    ++a.blocks;
    if (theirs == mine[b]) {
      ++a.same;
      continue;
    }
    const int64_t r = static_cast<int64_t>(b) / blocks_per_row, col = b % blocks_per_row;
    const double e_mine = block_error(w, A, r, col, mine[b], h);
    const double e_theirs = block_error(w, A, r, col, theirs, h);
    EXPECT_LE(e_mine, e_theirs) << c << " block " << b;
    a.worst_rel = std::max(a.worst_rel, (e_theirs - e_mine) / std::max(e_mine, 1e-300));
  }
  return a;
}

TEST(ScaleSearchModelOpt, MultipliersEqual) {
  EXPECT_EQ(floats(fixture().tensor("mse_multipliers")), mse_multipliers(kMseBlocks));
}

// ModelOpt's fp32 fake-quant losses and strata's double losses of the exported encoding order
// candidates alike except at near-ties: every block agrees, or the two choices' errors are within
// 1e-5 relative (tie-breaking by rounding), in at most 2% of the blocks.
void expect_agreement(const Agreement& a, const char* c) {
  SCOPED_TRACE(c);
  EXPECT_GT(a.blocks, 0);
  EXPECT_LE(a.blocks - a.same, a.blocks / 50) << a.same << " of " << a.blocks << " agree";
  EXPECT_LE(a.worst_rel, 1e-5);
  std::printf("[ %s ] %lld of %lld blocks choose ModelOpt's scale; worst relative error gap %g\n",
              c, static_cast<long long>(a.same), static_cast<long long>(a.blocks), a.worst_rel);
}

TEST(ScaleSearchModelOpt, Fp8ScaleSweep) {
  expect_agreement(compare_nvfp4("sweep_normal", kSweep, false), "sweep_normal");
  expect_agreement(compare_nvfp4("sweep_heavy", kSweep, false), "sweep_heavy");
}

TEST(ScaleSearchModelOpt, MseMultipliersPerBlock) {
  expect_agreement(compare_nvfp4("mse_blocks", kMseBlocks, false), "mse_blocks");
}

TEST(ScaleSearchModelOpt, LocalHessian) {
  expect_agreement(compare_nvfp4("hessian", kHessian, true), "hessian");
  // The Hessian changes choices: the plain sweep of the same weight differs in some block.
  const SafetensorsFile& f = fixture();
  const Tensor w = f.tensor("hessian/weight");
  const float A = f.tensor("hessian/global_amax").item_f32();
  const std::vector<float> amax = floats(f.tensor("hessian/amax"));
  const std::vector<uint8_t> plain = nvfp4_search_block_scales(w, A, kSweep, {}, "w");
  int differ = 0;
  for (size_t b = 0; b < plain.size(); ++b)
    differ += plain[b] != nvfp4_static_block_scale(amax[b], A);
  EXPECT_GT(differ, 0);
}

TEST(ScaleSearchModelOpt, Fp8PerTensorMse) {
  const SafetensorsFile& f = fixture();
  const Tensor w = f.tensor("fp8_mse/weight");
  float max_w = 0;
  for (float v : floats(w))
    max_w = std::max(max_w, std::fabs(v));
  const float mine = fp8_search_amax(std::span<const Tensor>(&w, 1), max_w, kMseBlocks, "w");
  EXPECT_EQ(mine, f.tensor("fp8_mse/amax").item_f32());
  EXPECT_NE(mine, max_w);
}

}  // namespace
}  // namespace strata
