#include "calib/max_calib.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/ops.h"

namespace strata {

namespace {

// ModelOpt 0.47 nvfp4_act_headroom defaults (NVFP4ActHeadroomCalibConfig, the recipe's values).
constexpr double kLog2Min = -40.0, kLog2Max = 40.0;
constexpr double kAnchorPercentile = 1.0, kUpperPercentile = 99.99, kRho = 16384.0;
constexpr double kAnchorFloorRatio = 1e6;

}  // namespace

void MaxCalibrator::observe(std::string_view name, const float* x, int64_t rows, int64_t cols) {
  record(name, ops::amax(x, rows * cols), rows);
  if (rows > 0 && hessian_names_.count(name)) {
    auto it = hessians_.find(name);
    if (it == hessians_.end())
      it = hessians_.emplace(std::string(name), std::make_unique<BlockHessian>(cols)).first;
    it->second->accumulate(x, rows);
  }
  if (!block_histograms_) return;
  Stat& s = stats_.find(name)->second;
  if (s.hist.empty()) s.hist.assign(kHeadroomBins, 0);
  add_block_histogram(x, rows, cols, s.hist);
}

const BlockHessian* MaxCalibrator::hessian(std::string_view name) const {
  auto it = hessians_.find(name);
  return it == hessians_.end() ? nullptr : it->second.get();
}

void MaxCalibrator::record(std::string_view name, float m, int64_t rows) {
  auto it = stats_.find(name);
  if (it == stats_.end()) it = stats_.emplace(std::string(name), Stat{}).first;
  Stat& s = it->second;
  s.rows += rows;
  if (std::isnan(m) || std::isnan(s.amax)) {
    s.amax = NAN;
  } else if (m > s.amax) {
    s.amax = m;
  }
}

void MaxCalibrator::merge(std::string_view name, const Stat& s) {
  auto it = stats_.find(name);
  if (it == stats_.end()) it = stats_.emplace(std::string(name), Stat{}).first;
  Stat& t = it->second;
  t.rows += s.rows;
  if (std::isnan(s.amax) || std::isnan(t.amax)) {
    t.amax = NAN;
  } else if (s.amax > t.amax) {
    t.amax = s.amax;
  }
  if (!s.hist.empty()) {
    STRATA_ASSERT(s.hist.size() == static_cast<size_t>(kHeadroomBins), "histogram size");
    if (t.hist.empty()) t.hist.assign(kHeadroomBins, 0);
    for (int i = 0; i < kHeadroomBins; ++i)
      t.hist[static_cast<size_t>(i)] += s.hist[static_cast<size_t>(i)];
  }
}

const MaxCalibrator::Stat* MaxCalibrator::find(std::string_view name) const {
  auto it = stats_.find(name);
  return it == stats_.end() ? nullptr : &it->second;
}

int headroom_bin(float block_amax) {
  // (log2_vals - log2_min) / (log2_max - log2_min) * num_bins, floor, clamp: fp32 tensor ops.
  const float frac = (std::log2(block_amax) - static_cast<float>(kLog2Min)) /
                     static_cast<float>(kLog2Max - kLog2Min);
  const float idx = std::floor(frac * static_cast<float>(kHeadroomBins));
  return static_cast<int>(std::clamp(idx, 0.0f, static_cast<float>(kHeadroomBins - 1)));
}

void add_block_histogram(const float* x, int64_t rows, int64_t cols, std::vector<int64_t>& hist) {
  STRATA_ASSERT(hist.size() == static_cast<size_t>(kHeadroomBins), "histogram size");
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    for (int64_t c0 = 0; c0 < cols; c0 += kHeadroomBlock) {
      float b = 0.0f;
      const int64_t c1 = std::min(cols, c0 + kHeadroomBlock);
      for (int64_t c = c0; c < c1; ++c)
        b = std::max(b, std::fabs(row[c]));  // a NaN element is skipped here; the max keeps it
      if (b > 0.0f && std::isfinite(b)) ++hist[static_cast<size_t>(headroom_bin(b))];
    }
  }
}

std::optional<double> headroom_percentile(const std::vector<int64_t>& hist, double percentile,
                                          double floor) {
  if (hist.empty()) return std::nullopt;
  std::vector<float> counts(hist.begin(), hist.end());  // hist.float()
  if (floor > 0.0) {
    const int floor_bin = headroom_bin(static_cast<float>(floor));  // torch.tensor(floor): fp32
    std::fill(counts.begin(), counts.begin() + floor_bin, 0.0f);
  }
  double sum = 0.0;
  for (float c : counts)
    sum += c;
  const float total = static_cast<float>(sum);
  if (total <= 0.0f) return std::nullopt;
  const float target = static_cast<float>(percentile / 100.0) * total;
  double run = 0.0;
  int bin = kHeadroomBins - 1;
  for (int i = 0; i < kHeadroomBins; ++i) {
    run += counts[static_cast<size_t>(i)];
    if (static_cast<float>(run) >= target) {
      bin = i;
      break;
    }
  }
  const double log2_val = kLog2Min + (bin + 0.5) / kHeadroomBins * (kLog2Max - kLog2Min);
  return std::pow(2.0, log2_val);
}

std::optional<float> headroom_amax(const std::vector<int64_t>& hist) {
  const std::optional<double> upper = headroom_percentile(hist, kUpperPercentile);
  if (!upper) return std::nullopt;  // no count: ModelOpt's _hist is None
  const std::optional<double> anchor =
      headroom_percentile(hist, kAnchorPercentile, *upper / kAnchorFloorRatio);
  STRATA_ASSERT(anchor.has_value() && *anchor > 0.0, "headroom anchor of a non-empty histogram");
  const double headroom = kRho * *anchor;
  return static_cast<float>(headroom <= *upper ? *upper : headroom);
}

}  // namespace strata
