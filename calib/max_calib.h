// Max calibration (docs/DESIGN.md "Calibration semantics"): every observed input keeps the
// largest |x| over every calibration token that reached it, and how many rows (tokens) did.
// For local_hessian (quant/scale_search.h), the inputs of the modules named by track_hessians()
// also accumulate their per-16-block second moment (BlockHessian), in observation order.
// The result does not depend on the order of observations, the batch composition or the thread
// count: max is exact and order-free. A NaN in an activation is recorded as NaN (and refused
// when a scale is made from it).
//
// With block histograms on (a recipe's `algorithm: nvfp4_act_headroom`) every input also keeps
// ModelOpt 0.47's nvfp4_act_headroom statistic (modelopt/torch/quantization/calib/
// nvfp4_act_headroom.py, NVFP4ActHeadroomCalibrator with its defaults), a histogram that is as
// order-free as the max: counts add, across micro-batches and ranks alike.
//   block amax  b = max |x| over 16 consecutive elements of a row (a ragged tail is zero-padded,
//               which changes no block's amax), one per block of every observed row
//   histogram   512 bins over log2(b) in [-40, 40): bin = clamp(floor(fl32(fl32(log2f(b) + 40)
//               / 80) * 512), 0, 511), fp32 arithmetic as PyTorch's CPU kernels do it (true
//               division); blocks with b == 0 (and non-finite b, which ModelOpt asserts on) are
//               not counted
//   percentile  P(p, floor): counts below the bin of `floor` zeroed (floor's bin computed alike
//               from fl32(floor)); total = the sum, target = fl32(fl32(p / 100) * total); cdf the
//               running sums, each rounded to fp32 (torch.cumsum on a CPU: double accumulation);
//               the first bin i with cdf[i] >= target (searchsorted, left), at most 511; the value
//               2^(-40 + (i + 0.5) * 80 / 512) in double (the bin centre)
//   amax        upper = P(99.99), anchor = P(1, upper / 1e6); amax = fl32(16384 x anchor) when
//               that exceeds upper, else fl32(upper): the input's scale leaves headroom above the
//               calibrated range (ModelOpt warns when it cannot); no bin counted (no non-zero
//               block): no amax at all (ModelOpt's compute_amax returns None)
// The counts enter as fp32 (as ModelOpt's hist.float()): exact while a histogram holds fewer than
// 2^24 blocks; above that fp32 sums of the counts depend on summation order and strata's (double,
// rounded once) may differ from PyTorch's in the last place of `total`.
//
// Affine KV cache (a recipe's kv_cache: fp8_affine / nvfp4_affine; ModelOpt 0.47's units
// kv_{fp8,nvfp4}_affine: `bias: {-2, -4, type: static}` on the k/v_bmm_quantizers, whose input is
// transformers' key/value states [batch, heads, tokens, head_dim]; TensorQuantizer.collect and
// calib/bias.py BiasCalibrator, method "mean"). ModelOpt calibrates one sequence per forward
// (batch 1, as tests/peer runs it), and each forward does, in order:
//   m_s      = the mean of the sequence's K over its tokens, per head and channel [heads, d],
//              rounded to the model's dtype (torch.mean of a bf16 tensor)
//   b_s      = m_1 for the first sequence, else dt(fl32(fl32(b_{s-1} x (s-1)) + m_s) / s): the
//              running mean of the sequence means (every sequence weighs the same, whatever its
//              length), in fp32, rounded to the dtype dt
//   amax    = max(amax, max |dt(x - b_s)|) over the sequence's tokens: the max calibrator sees
//              the input less the bias as it stands after this sequence
// and exports b_S (the last) as the bias and the amax as for the plain modes (k_scale = amax /
// 448). So the amax depends on the order of the sequences; strata keeps, per sequence (its index
// in the calibration set, whatever micro-batch, chunk or rank computed it), the per-channel sum,
// max and min (ops::column_stats), and replays ModelOpt's loop in sequence order at the end
// (kv_affine), using max |x - b| = max(max x - b, b - min x) per channel. The statistics of a
// sequence merge (sums add, max/min), so they are independent of the batching, the thread and
// rank count. Memory: 16 bytes per channel and sequence of each attention layer's K and V, for
// one layer at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "model/forward.h"
#include "quant/scale_search.h"

namespace strata {

inline constexpr int kHeadroomBins = 512;
inline constexpr int kHeadroomBlock = 16;

class MaxCalibrator : public Observer {
 public:
  MaxCalibrator() = default;
  // block_histograms: also keep the nvfp4_act_headroom histogram of every input (header comment).
  explicit MaxCalibrator(bool block_histograms, bool sequence_stats = false)
      : block_histograms_(block_histograms), sequence_stats_(sequence_stats) {}

  void observe(std::string_view name, const float* x, int64_t rows, int64_t cols) override;
  // As observe() under each name, with the input's BlockHessian accumulated once: the tracked
  // names whose sums equal the first one's (always observed together) get a copy of its sums,
  // which are the sums they would have accumulated themselves.
  void observe_shared(std::span<const std::string> names, const float* x, int64_t rows,
                      int64_t cols) override;
  // Merges an amax already reduced elsewhere (the GPU forward's observers) over `rows` rows,
  // exactly as observe() merges its own, and with block histograms on the input's histogram
  // counted there (kHeadroomBins counts; empty: none).
  void record(std::string_view name, float amax, int64_t rows, std::span<const int64_t> hist = {});

  // One calibration sequence's K (or V) [tokens, heads * head_dim] (header comment).
  struct SequenceStat {
    int64_t tokens = 0;
    std::vector<double> sum;            // per channel (head-major), in double
    std::vector<float> max, min;        // per channel
    void merge(const SequenceStat& o);  // the same sequence seen in parts: sums add
  };
  // With sequence statistics on (the affine KV cache): keeps each sequence's statistics of x.
  void observe_sequences(std::string_view name, const float* x, std::span<const int64_t> seq_bounds,
                         std::span<const int64_t> seq_ids, const KvLayout& layout) override;
  // Merges one sequence's statistics reduced elsewhere (the GPU forward's).
  void record_sequence(std::string_view name, int64_t seq_id, const KvLayout& layout,
                       SequenceStat s);

  struct Stat {
    float amax = 0.0f;
    int64_t rows = 0;
    std::vector<int64_t> hist;  // kHeadroomBins counts with block histograms on, else empty
    KvLayout layout;            // of the sequence statistics (heads 0: none)
    std::map<int64_t, SequenceStat> sequences;  // by sequence index, with sequence stats on
  };
  // nullptr when `name` was never observed.
  const Stat* find(std::string_view name) const;
  // From now on, the inputs observed under these names also accumulate a BlockHessian (their
  // width must be a multiple of 16; 16 * width doubles each).
  void track_hessians(std::set<std::string, std::less<>> names) {
    hessian_names_ = std::move(names);
  }
  const std::set<std::string, std::less<>>& hessian_names() const { return hessian_names_; }
  // Merges a tracked input's sums accumulated elsewhere (the GPU forward's, over `rows` tokens),
  // as its own accumulate would have added them to a fresh BlockHessian.
  void record_hessian(std::string_view name, int64_t cols, std::span<const double> sums,
                      int64_t rows);
  // nullptr when `name` is not tracked or no token reached it.
  const BlockHessian* hessian(std::string_view name) const;
  const std::map<std::string, Stat, std::less<>>& stats() const { return stats_; }
  void clear() { stats_.clear(); }
  bool block_histograms() const { return block_histograms_; }
  bool sequence_stats() const { return sequence_stats_; }
  // Adds statistics observed elsewhere (another rank): amax the max (NaN sticky), rows and
  // histogram counts the sums, sequence statistics merged by sequence index.
  void merge(std::string_view name, const Stat& s);

 private:
  bool block_histograms_ = false;
  bool sequence_stats_ = false;
  std::map<std::string, Stat, std::less<>> stats_;
  std::set<std::string, std::less<>> hessian_names_;
  std::map<std::string, std::unique_ptr<BlockHessian>, std::less<>> hessians_;
  void observe_one(std::string_view name, float amax, const float* x, int64_t rows, int64_t cols,
                   bool hessian);
  BlockHessian& hessian_of(std::string_view name, int64_t cols);
};

// ---- nvfp4_act_headroom (header comment) ----------------------------------------------------
// The histogram bin of a block amax b > 0.
int headroom_bin(float block_amax);
// Where the bins begin, for a device that must bin as headroom_bin does without the host's log2:
// t[k - 1] is the least positive finite float b with headroom_bin(b) >= k, k = 1 ..
// kHeadroomBins - 1, so that headroom_bin(b) is the number of thresholds <= b (headroom_bin is
// monotone in b: tests/calib check it around every threshold and over a sweep of all floats).
std::vector<float> headroom_thresholds();
// Adds the per-16-block amaxes of x[rows, cols] to hist (kHeadroomBins counts).
void add_block_histogram(const float* x, int64_t rows, int64_t cols, std::vector<int64_t>& hist);
// P(p, floor) of a histogram (floor <= 0: none); std::nullopt when no count is left.
std::optional<double> headroom_percentile(const std::vector<int64_t>& hist, double percentile,
                                          double floor = 0.0);
// The input amax of a histogram with ModelOpt's defaults (anchor 1st percentile, upper 99.99th,
// rho 16384); std::nullopt when it holds no count.
std::optional<float> headroom_amax(const std::vector<int64_t>& hist);

// ---- Affine KV cache (header comment) --------------------------------------------------------
struct KvAffine {
  std::vector<float> bias;  // [heads * head_dim], values of `dtype`, in transformers' channel
                            // order (KvLayout::pairs_from de-interleaved)
  float amax = 0.0f;        // max |x - b| as ModelOpt's loop finds it (NaN when an input was)
};
// ModelOpt's loop over the sequences of `s` in index order, rounding as a model of `dtype` (BF16,
// F16 or F32) does; std::nullopt when no sequence had a token.
std::optional<KvAffine> kv_affine(const MaxCalibrator::Stat& s, DType dtype);

}  // namespace strata
