// Max calibration (docs/DESIGN.md "Calibration semantics"): every observed input keeps the
// largest |x| over every calibration token that reached it, and how many rows (tokens) did.
// For local_hessian (quant/scale_search.h), the inputs of the modules named by track_hessians()
// also accumulate their per-16-block second moment (BlockHessian), in observation order.
// The result does not depend on the order of observations, the batch composition or the thread
// count: max is exact and order-free. A NaN in an activation is recorded as NaN (and refused
// when a scale is made from it).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>

#include "model/forward.h"
#include "quant/scale_search.h"

namespace strata {

class MaxCalibrator : public Observer {
 public:
  void observe(std::string_view name, const float* x, int64_t rows, int64_t cols) override;
  // Merges an amax already reduced elsewhere (the GPU forward's observers) over `rows` rows,
  // exactly as observe() merges its own.
  void record(std::string_view name, float amax, int64_t rows);

  struct Stat {
    float amax = 0.0f;
    int64_t rows = 0;
  };
  // nullptr when `name` was never observed.
  const Stat* find(std::string_view name) const;
  // From now on, the inputs observed under these names also accumulate a BlockHessian (their
  // width must be a multiple of 16; 16 * width doubles each).
  void track_hessians(std::set<std::string, std::less<>> names) {
    hessian_names_ = std::move(names);
  }
  // nullptr when `name` is not tracked or no token reached it.
  const BlockHessian* hessian(std::string_view name) const;
  const std::map<std::string, Stat, std::less<>>& stats() const { return stats_; }
  void clear() { stats_.clear(); }
  // Adds statistics observed elsewhere (another rank): amax the max (NaN sticky), rows the sum.
  void merge(std::string_view name, const Stat& s);

 private:
  std::map<std::string, Stat, std::less<>> stats_;
  std::set<std::string, std::less<>> hessian_names_;
  std::map<std::string, std::unique_ptr<BlockHessian>, std::less<>> hessians_;
};

}  // namespace strata
