// The affine KV cache's calibration (calib/max_calib.h "Affine KV cache") against hand-worked
// vectors of ModelOpt 0.47's loop (TensorQuantizer.collect with a static "mean" BiasCalibrator:
// per forward the running mean of the sequence means, then the max of |x - that bias|).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "calib/max_calib.h"

namespace strata {
namespace {

// Observes sequences (rows of x[.., cols]) with the given indices, one call.
void observe(MaxCalibrator& c, const std::vector<std::vector<float>>& seqs,
             const std::vector<int64_t>& ids, int64_t heads, int64_t d) {
  std::vector<float> x;
  std::vector<int64_t> bounds{0};
  for (const auto& s : seqs) {
    x.insert(x.end(), s.begin(), s.end());
    bounds.push_back(bounds.back() + static_cast<int64_t>(s.size()) / (heads * d));
  }
  c.observe_sequences("k", x.data(), bounds, ids, {heads, d});
}

TEST(KvAffine, RunningMeanOfSequenceMeans) {
  // One head of 2 channels; rows are tokens.
  //  seq 0: [1 4], [3 -2]          mean [2 1]   b = [2 1]        |x-b| max: 1, 3 -> amax 3
  //  seq 1: [6 1]                  mean [6 1]   b = [(2+6)/2, 1] = [4 1]: 2, 0 -> amax 3
  //  seq 2: [-5 0], [1 0], [1 3]   mean [-1 1]  b = [(4*2-1)/3, 1] = [7/3 1]:
  //         ch0 7/3 - (-5) = 22/3, ch1 3 - 1 = 2 -> amax 22/3
  // The bias weighs each sequence alike: the token-weighted mean of channel 0 would be 7/6.
  MaxCalibrator c(false, true);
  observe(c, {{1, 4, 3, -2}, {6, 1}, {-5, 0, 1, 0, 1, 3}}, {0, 1, 2}, 1, 2);
  const std::optional<KvAffine> a = kv_affine(*c.find("k"), DType::kF32);
  ASSERT_TRUE(a.has_value());
  ASSERT_EQ(a->bias.size(), 2u);
  EXPECT_EQ(a->bias[0], (4.0f * 2.0f + -1.0f) / 3.0f);  // ModelOpt's fp32 (b x 2 + m) / 3
  EXPECT_EQ(a->bias[1], 1.0f);
  EXPECT_EQ(a->amax, a->bias[0] + 5.0f);
  EXPECT_EQ(c.find("k")->layout.heads, 1);
}

TEST(KvAffine, AmaxSeesTheBiasAsItStandsAfterEachSequence) {
  // One channel. seq 0: [0], [10] (mean 5); seq 1: [-7].
  //  after seq 0: b = 5, max |x - 5| = 5; after seq 1: b = (5 - 7) / 2 = -1, |-7 + 1| = 6
  //  -> amax 6 (the final bias on every token would give |10 + 1| = 11).
  // In the other order: b = -7 (0); then b = -1 and |10 + 1| = 11 -> amax 11.
  MaxCalibrator c(false, true);
  observe(c, {{-7}}, {1}, 1, 1);  // observed first, yet the second of the calibration set
  observe(c, {{0, 10}}, {0}, 1, 1);
  std::optional<KvAffine> a = kv_affine(*c.find("k"), DType::kF32);
  EXPECT_EQ(a->bias, std::vector<float>{-1.0f});
  EXPECT_EQ(a->amax, 6.0f);
  MaxCalibrator swapped(false, true);
  observe(swapped, {{-7}, {0, 10}}, {0, 1}, 1, 1);
  a = kv_affine(*swapped.find("k"), DType::kF32);
  EXPECT_EQ(a->bias, std::vector<float>{-1.0f});
  EXPECT_EQ(a->amax, 11.0f);
}

TEST(KvAffine, RoundsAsABf16Model) {
  // x = 1 + 2^-8: its bf16 mean rounds (to even) to 1, so the bias is 1 and the amax
  // bf16(2^-8) = 2^-8; an fp32 model keeps the bias 1 + 2^-8 and an amax of 0.
  MaxCalibrator c(false, true);
  observe(c, {{1.00390625f}}, {0}, 1, 1);
  EXPECT_EQ(kv_affine(*c.find("k"), DType::kBF16)->bias, std::vector<float>{1.0f});
  EXPECT_EQ(kv_affine(*c.find("k"), DType::kBF16)->amax, 0.00390625f);
  EXPECT_EQ(kv_affine(*c.find("k"), DType::kF32)->bias, std::vector<float>{1.00390625f});
  EXPECT_EQ(kv_affine(*c.find("k"), DType::kF32)->amax, 0.0f);
  // The running mean rounds at every step: seq 1 [2^-8] after b = 1: bf16((1 + 2^-8) / 2) =
  // bf16(0.501953125) = 0.5 (even), 0.501953125 in fp32.
  observe(c, {{0.00390625f}}, {1}, 1, 1);
  EXPECT_EQ(kv_affine(*c.find("k"), DType::kBF16)->bias, std::vector<float>{0.5f});
}

TEST(KvAffine, SequencesMergeAcrossBatchesRanksAndParts) {
  // Two heads of one channel: [T, 2]. Three sequences observed on one calibrator, or split over
  // two "ranks" and merged, or sequence 1 seen in two parts: the same statistics.
  const std::vector<std::vector<float>> seqs = {{1, -1, 2, 5}, {0, 3}, {4, 4, -4, 2, 8, 0}};
  MaxCalibrator one(false, true);
  observe(one, seqs, {0, 1, 2}, 2, 1);
  MaxCalibrator r0(false, true), r1(false, true), merged(false, true);
  observe(r0, {seqs[0], seqs[2]}, {0, 2}, 2, 1);
  observe(r1, {seqs[1]}, {1}, 2, 1);
  merged.merge("k", *r0.find("k"));
  merged.merge("k", *r1.find("k"));
  const KvAffine want = *kv_affine(*one.find("k"), DType::kF32);
  const KvAffine got = *kv_affine(*merged.find("k"), DType::kF32);
  EXPECT_EQ(got.bias, want.bias);
  EXPECT_EQ(got.amax, want.amax);
  // Hand-worked: head means s0 [1.5 2], s1 [0 3], s2 ([4 4], [-4 2], [8 0]) [8/3 2]; the running
  // form b_1 = m_0... : b = (b x 1 + m_1) / 2, then (b x 2 + m_2) / 3, in fp32.
  const float b0 = ((1.5f * 1.0f + 0.0f) / 2.0f * 2.0f + 8.0f / 3.0f) / 3.0f;
  EXPECT_EQ(want.bias[0], b0);
  EXPECT_EQ(want.bias[1], ((2.0f * 1.0f + 3.0f) / 2.0f * 2.0f + 2.0f) / 3.0f);
  // A sequence in two parts (a chunk boundary): sums add, max/min combine.
  MaxCalibrator split(false, true);
  observe(split, {seqs[0], {4, 4, -4, 2}}, {0, 2}, 2, 1);
  observe(split, {{0, 3}, {8, 0}}, {1, 2}, 2, 1);
  EXPECT_EQ(kv_affine(*split.find("k"), DType::kF32)->bias, want.bias);
  EXPECT_EQ(kv_affine(*split.find("k"), DType::kF32)->amax, want.amax);
}

TEST(KvAffine, InterleavedRopePairsInTransformersOrder) {
  // MLA's K with the checkpoint's interleaved RoPE pairs after channel 2 of each head (KvLayout
  // pairs_from 2): [n0 n1 x0 y0 x1 y1] is held by transformers as [n0 n1 x0 x1 y0 y1], so the
  // bias is exported in that order; the amax does not depend on it.
  MaxCalibrator c(false, true);
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 10, 20, 30, 40, 50, 60};  // one token, 2 heads
  const std::vector<int64_t> bounds = {0, 1}, ids = {0};
  c.observe_sequences("k", x.data(), bounds, ids, {2, 6, 2});
  const KvAffine a = *kv_affine(*c.find("k"), DType::kF32);
  EXPECT_EQ(a.bias, (std::vector<float>{1, 2, 3, 5, 4, 6, 10, 20, 30, 50, 40, 60}));
  EXPECT_EQ(a.amax, 0.0f);
}

TEST(KvAffine, NothingKeptWhenOff) {
  MaxCalibrator c;
  observe(c, {{1, 2}}, {0}, 1, 1);
  EXPECT_EQ(c.find("k"), nullptr);
  MaxCalibrator empty(false, true);
  observe(empty, {{}}, {0}, 1, 1);  // a sequence without tokens counts for nothing
  EXPECT_EQ(empty.find("k"), nullptr);
}

TEST(KvAffine, NanSticks) {
  MaxCalibrator c(false, true);
  observe(c, {{1, NAN}}, {0}, 1, 1);
  EXPECT_TRUE(std::isnan(kv_affine(*c.find("k"), DType::kF32)->amax));
}

}  // namespace
}  // namespace strata
