#include "calib/max_calib.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "ops/ops.h"
#include "quant/encode.h"

namespace strata {

namespace {

// ModelOpt 0.47 nvfp4_act_headroom defaults (NVFP4ActHeadroomCalibConfig, the recipe's values).
constexpr double kLog2Min = -40.0, kLog2Max = 40.0;
constexpr double kAnchorPercentile = 1.0, kUpperPercentile = 99.99, kRho = 16384.0;
constexpr double kAnchorFloorRatio = 1e6;

}  // namespace

BlockHessian& MaxCalibrator::hessian_of(std::string_view name, int64_t cols) {
  auto it = hessians_.find(name);
  if (it == hessians_.end())
    it = hessians_.emplace(std::string(name), std::make_unique<BlockHessian>(cols)).first;
  return *it->second;
}

void MaxCalibrator::observe_one(std::string_view name, float amax, const float* x, int64_t rows,
                                int64_t cols, bool hessian) {
  record(name, amax, rows);
  if (hessian) hessian_of(name, cols).accumulate(x, rows);
  if (!block_histograms_) return;
  Stat& s = stats_.find(name)->second;
  if (s.hist.empty()) s.hist.assign(kHeadroomBins, 0);
  add_block_histogram(x, rows, cols, s.hist);
}

void MaxCalibrator::observe(std::string_view name, const float* x, int64_t rows, int64_t cols) {
  observe_one(name, ops::amax(x, rows * cols), x, rows, cols,
              rows > 0 && hessian_names_.count(name));
}

void MaxCalibrator::observe_shared(std::span<const std::string> names, const float* x, int64_t rows,
                                   int64_t cols) {
  const float amax = ops::amax(x, rows * cols);
  auto tracked = [&](const std::string& n) { return rows > 0 && hessian_names_.count(n) > 0; };
  // The first tracked name accumulates; a later one whose sums equal its sums before this
  // observation (both new, or in step so far) takes a copy of them after it: the same rows added
  // to the same sums give the same bits.
  const std::string* lead = nullptr;
  std::vector<bool> copy(names.size(), false);
  for (size_t i = 0; i < names.size(); ++i) {
    if (!tracked(names[i])) continue;
    if (lead == nullptr) {
      lead = &names[i];
      continue;
    }
    const BlockHessian *a = hessian(names[i]), *b = hessian(*lead);
    copy[i] = a == nullptr ? b == nullptr
                           : b != nullptr && a->tokens() == b->tokens() &&
                                 a->sums().size() == b->sums().size() &&
                                 std::memcmp(a->sums().data(), b->sums().data(),
                                             a->sums().size() * sizeof(double)) == 0;
  }
  for (size_t i = 0; i < names.size(); ++i) {
    observe_one(names[i], amax, x, rows, cols, tracked(names[i]) && !copy[i]);
    if (copy[i]) hessian_of(names[i], cols) = hessian_of(*lead, cols);
  }
}

void MaxCalibrator::record_hessian(std::string_view name, int64_t cols,
                                   std::span<const double> sums, int64_t rows) {
  STRATA_ASSERT(hessian_names_.count(name), "local_hessian statistics of ", name,
                ", which is not tracked");
  if (rows > 0) hessian_of(name, cols).add(sums, rows);
}

const BlockHessian* MaxCalibrator::hessian(std::string_view name) const {
  auto it = hessians_.find(name);
  return it == hessians_.end() ? nullptr : it->second.get();
}

void MaxCalibrator::record(std::string_view name, float m, int64_t rows,
                           std::span<const int64_t> hist) {
  auto it = stats_.find(name);
  if (it == stats_.end()) it = stats_.emplace(std::string(name), Stat{}).first;
  Stat& s = it->second;
  s.rows += rows;
  if (block_histograms_ && !hist.empty()) {
    STRATA_ASSERT(hist.size() == static_cast<size_t>(kHeadroomBins), "a histogram of ", hist.size(),
                  " bins for ", name);
    if (s.hist.empty()) s.hist.assign(kHeadroomBins, 0);
    for (size_t i = 0; i < hist.size(); ++i)
      s.hist[i] += hist[i];
  }
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
  if (!s.sequences.empty()) {
    STRATA_ASSERT(t.layout.heads == 0 || t.layout.heads == s.layout.heads, name,
                  ": sequence statistics of ", s.layout.heads, " and ", t.layout.heads, " heads");
    t.layout = s.layout;
    for (const auto& [id, q] : s.sequences)
      t.sequences[id].merge(q);
  }
}

void MaxCalibrator::SequenceStat::merge(const SequenceStat& o) {
  if (sum.empty()) {
    *this = o;
    return;
  }
  STRATA_ASSERT(o.sum.size() == sum.size(), "sequence statistics of ", o.sum.size(), " and ",
                sum.size(), " channels");
  tokens += o.tokens;
  for (size_t c = 0; c < sum.size(); ++c) {
    sum[c] += o.sum[c];
    if (std::isnan(o.max[c]) || o.max[c] > max[c]) max[c] = std::isnan(max[c]) ? max[c] : o.max[c];
    if (std::isnan(o.min[c]) || o.min[c] < min[c]) min[c] = std::isnan(min[c]) ? min[c] : o.min[c];
  }
}

void MaxCalibrator::observe_sequences(std::string_view name, const float* x,
                                      std::span<const int64_t> seq_bounds,
                                      std::span<const int64_t> seq_ids, const KvLayout& layout) {
  if (!sequence_stats_) return;
  STRATA_ASSERT(seq_bounds.size() == seq_ids.size() + 1, "sequence bounds and ids");
  const int64_t cols = layout.channels();
  for (size_t s = 0; s < seq_ids.size(); ++s) {
    SequenceStat q;
    q.tokens = seq_bounds[s + 1] - seq_bounds[s];
    q.sum.resize(static_cast<size_t>(cols));
    q.max.resize(static_cast<size_t>(cols));
    q.min.resize(static_cast<size_t>(cols));
    ops::column_stats(x + seq_bounds[s] * cols, q.tokens, cols, q.sum.data(), q.max.data(),
                      q.min.data());
    record_sequence(name, seq_ids[s], layout, std::move(q));
  }
}

void MaxCalibrator::record_sequence(std::string_view name, int64_t seq_id, const KvLayout& layout,
                                    SequenceStat q) {
  if (q.tokens == 0) return;
  auto it = stats_.find(name);
  if (it == stats_.end()) it = stats_.emplace(std::string(name), Stat{}).first;
  Stat& s = it->second;
  STRATA_ASSERT(s.layout.heads == 0 ||
                    (s.layout.heads == layout.heads && s.layout.head_dim == layout.head_dim &&
                     s.layout.pairs_from == layout.pairs_from),
                name, ": sequence statistics of two layouts");
  s.layout = layout;
  s.sequences[seq_id].merge(q);
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

std::vector<float> headroom_thresholds() {
  std::vector<float> t;
  for (int k = 1; k < kHeadroomBins; ++k) {
    // The least positive finite bit pattern whose bin is at least k (positive floats order as
    // their bit patterns).
    uint32_t lo = 1, hi = 0x7F7FFFFFu;
    while (lo < hi) {
      const uint32_t mid = lo + (hi - lo) / 2;
      float b;
      std::memcpy(&b, &mid, 4);
      if (headroom_bin(b) >= k) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    float b;
    std::memcpy(&b, &lo, 4);
    t.push_back(b);
  }
  return t;
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

std::optional<KvAffine> kv_affine(const MaxCalibrator::Stat& s, DType dtype) {
  KvAffine r;
  float count = 0.0f;  // ModelOpt's _cnt, promoted to fp32 in the running mean
  for (const auto& [id, q] : s.sequences) {
    if (q.tokens == 0) continue;
    const size_t C = q.sum.size();
    if (r.bias.empty()) r.bias.assign(C, 0.0f);
    STRATA_ASSERT(r.bias.size() == C, "sequence statistics of ", C, " and ", r.bias.size(),
                  " channels");
    for (size_t c = 0; c < C; ++c) {
      const float m = quant_detail::round_to(
          dtype, static_cast<float>(q.sum[c] / static_cast<double>(q.tokens)));
      r.bias[c] = count == 0.0f
                      ? m
                      : quant_detail::round_to(dtype, (r.bias[c] * count + m) / (count + 1.0f));
    }
    count += 1.0f;
    for (size_t c = 0; c < C; ++c) {
      const float hi = quant_detail::round_to(dtype, q.max[c] - r.bias[c]);
      const float lo = quant_detail::round_to(dtype, r.bias[c] - q.min[c]);
      if (std::isnan(hi) || std::isnan(lo) || std::isnan(r.amax)) {
        r.amax = NAN;
      } else {
        r.amax = std::max({r.amax, std::fabs(hi), std::fabs(lo)});
      }
    }
  }
  if (r.bias.empty()) return std::nullopt;
  // Interleaved RoPE pairs as transformers holds them: per head, the pairs' first elements, then
  // their second ones (the amax is a max over channels: the order does not change it).
  const KvLayout& l = s.layout;
  if (l.pairs_from >= 0) {
    STRATA_ASSERT(
        l.channels() == static_cast<int64_t>(r.bias.size()) && (l.head_dim - l.pairs_from) % 2 == 0,
        "interleaved channels of a KV layout");
    const int64_t half = (l.head_dim - l.pairs_from) / 2;
    for (int64_t h = 0; h < l.heads; ++h) {
      float* b = r.bias.data() + h * l.head_dim + l.pairs_from;
      const std::vector<float> pairs(b, b + 2 * half);
      for (int64_t j = 0; j < half; ++j) {
        b[j] = pairs[static_cast<size_t>(2 * j)];
        b[half + j] = pairs[static_cast<size_t>(2 * j + 1)];
      }
    }
  }
  return r;
}

}  // namespace strata
