// nvfp4_act_headroom (calib/max_calib.h) against hand-worked histograms. Each expected value was
// also what ModelOpt 0.47's NVFP4ActHeadroomCalibrator gives for the same histogram (its _bin_index
// and compute_amax, run on a CPU, 2026-12-04).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "calib/max_calib.h"

namespace strata {
namespace {

uint32_t bits(float x) {
  return std::bit_cast<uint32_t>(x);
}

std::vector<int64_t> hist_of(std::initializer_list<std::pair<int, int64_t>> bins) {
  std::vector<int64_t> h(kHeadroomBins, 0);
  for (auto [b, n] : bins)
    h[static_cast<size_t>(b)] = n;
  return h;
}

TEST(Headroom, BinEdges) {
  // bin = floor((log2 b + 40) / 80 * 512): width 80/512 = 5/32 in log2.
  EXPECT_EQ(headroom_bin(1.0f), 256);     // 40/80 * 512
  EXPECT_EQ(headroom_bin(3.0f), 266);     // 41.58496 / 80 * 512 = 266.14
  EXPECT_EQ(headroom_bin(0.75f), 253);    // 39.58496 / 80 * 512 = 253.34
  EXPECT_EQ(headroom_bin(0x1p-40f), 0);   // the low edge
  EXPECT_EQ(headroom_bin(0x1p-41f), 0);   // below the range: clamped
  EXPECT_EQ(headroom_bin(0x1p40f), 511);  // 512 clamped
  EXPECT_EQ(headroom_bin(std::exp2(39.99f)), 511);
}

// The device's bin thresholds: each is the first float of its bin (the float before it bins
// lower), they rise, the first lies at 2^(-40 + 80/512) (bin 1's lower edge in log2, within the
// rounding of fl32 log2), and headroom_bin is monotone over a sweep of every 97th positive finite
// float, so counting the thresholds below b gives headroom_bin(b).
TEST(Headroom, ThresholdsAreWhereTheBinsBegin) {
  const std::vector<float> t = headroom_thresholds();
  ASSERT_EQ(t.size(), static_cast<size_t>(kHeadroomBins - 1));
  for (size_t k = 0; k < t.size(); ++k) {
    const int bin = static_cast<int>(k) + 1;
    EXPECT_GE(headroom_bin(t[k]), bin) << k;
    EXPECT_LT(headroom_bin(std::nextafter(t[k], 0.0f)), bin) << k;
    if (k > 0) EXPECT_GT(t[k], t[k - 1]) << k;
  }
  EXPECT_NEAR(std::log2(t[0]), -40.0 + 80.0 / 512, 1e-5);
  EXPECT_NEAR(std::log2(t[255]), 0.0, 1e-5);  // bin 256 begins at 1
  int last = 0;
  auto counted = [&](float b) {
    return static_cast<int>(std::upper_bound(t.begin(), t.end(), b) - t.begin());
  };
  for (uint32_t u = 1; u < 0x7F800000u; u += 97) {
    const float b = std::bit_cast<float>(u);
    const int bin = headroom_bin(b);
    ASSERT_GE(bin, last) << "headroom_bin is not monotone at " << b;
    last = bin;
    if (u % (97 * 1024) == 1) ASSERT_EQ(counted(b), bin) << b;
  }
}

TEST(Headroom, BlocksOf16ZeroPaddedZerosNotCounted) {
  // x[2, 20]: per row one block of 16 and a ragged block of 4.
  //  row 0: block 0 amax 1 (bin 256), block 1 all zero (not counted)
  //  row 1: block 0 amax |-3| (bin 266), block 1 amax 0.75 (bin 253)
  std::vector<float> x(40, 0.0f);
  x[3] = 1.0f;
  x[20 + 5] = -3.0f;
  x[20 + 17] = 0.75f;
  MaxCalibrator c(true);
  c.observe("m", x.data(), 2, 20);
  const MaxCalibrator::Stat* s = c.find("m");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->amax, 3.0f);
  EXPECT_EQ(s->hist, hist_of({{253, 1}, {256, 1}, {266, 1}}));
  // Without block histograms nothing but the max is kept.
  MaxCalibrator plain;
  plain.observe("m", x.data(), 2, 20);
  EXPECT_TRUE(plain.find("m")->hist.empty());
}

TEST(Headroom, UpperWinsWhenTheRangeLeavesNoHeadroom) {
  // Counts 1 @100, 98 @200, 1 @300 (total 100).
  //  upper  = P(99.99): target fl32(fl32(0.9999) * 100) = 99.99; cdf reaches 100 at bin 300:
  //           2^(-40 + 300.5 * 5/32) = 2^6.953125 = 123.907955
  //  floor  = upper / 1e6: log2 -12.978 -> bin 172: the count at bin 100 is dropped
  //  anchor = P(1) of the 99 left: target fl32(0.01) * 99 = 0.99 -> bin 200: 2^-8.671875
  //  16384 x anchor = 2^5.328125 = 40.17 <= upper: amax = fl32(upper) = 0x42F7D0DF
  const std::vector<int64_t> h = hist_of({{100, 1}, {200, 98}, {300, 1}});
  EXPECT_EQ(*headroom_percentile(h, 99.99), std::pow(2.0, 6.953125));
  EXPECT_EQ(*headroom_percentile(h, 1.0), std::pow(2.0, -40 + 100.5 * 5 / 32));  // no floor
  EXPECT_EQ(*headroom_percentile(h, 1.0, std::pow(2.0, 6.953125) / 1e6), std::pow(2.0, -8.671875));
  EXPECT_EQ(bits(*headroom_amax(h)), 0x42F7D0DFu);
}

TEST(Headroom, AnchorTimesRhoWhenAboveUpper) {
  // Counts 99 @200, 1 @210: upper = P(99.99) = bin 210 = 2^-7.109375; anchor = bin 200 =
  // 2^-8.671875; 16384 x anchor = 2^5.328125 = 40.172184 > upper: amax = 0x4220B051.
  const std::vector<int64_t> h = hist_of({{200, 99}, {210, 1}});
  EXPECT_EQ(bits(*headroom_amax(h)), 0x4220B051u);
}

TEST(Headroom, EmptyHistogramHasNoAmax) {
  EXPECT_FALSE(headroom_amax(std::vector<int64_t>(kHeadroomBins, 0)).has_value());
  EXPECT_FALSE(headroom_amax({}).has_value());
  std::vector<float> zeros(32, 0.0f);
  MaxCalibrator c(true);
  c.observe("m", zeros.data(), 2, 16);
  EXPECT_FALSE(headroom_amax(c.find("m")->hist).has_value());
}

TEST(Headroom, HistogramsAddAcrossBatchesAndRanks) {
  // Two micro-batches on one calibrator, or one each on two merged: the same counts.
  std::vector<float> a(16, 0.0f), b(16, 0.0f);
  a[0] = 1.0f;
  b[7] = 3.0f;
  MaxCalibrator one(true);
  one.observe("m", a.data(), 1, 16);
  one.observe("m", b.data(), 1, 16);
  MaxCalibrator r0(true), r1(true), merged(true);
  r0.observe("m", a.data(), 1, 16);
  r1.observe("m", b.data(), 1, 16);
  merged.merge("m", *r0.find("m"));
  merged.merge("m", *r1.find("m"));
  EXPECT_EQ(merged.find("m")->hist, one.find("m")->hist);
  EXPECT_EQ(merged.find("m")->hist, hist_of({{256, 1}, {266, 1}}));
  EXPECT_EQ(merged.find("m")->rows, 2);
  EXPECT_EQ(merged.find("m")->amax, 3.0f);
}

}  // namespace
}  // namespace strata
