// Max calibration (docs/DESIGN.md "Calibration semantics"): every observed input keeps the
// largest |x| over every calibration token that reached it, and how many rows (tokens) did.
// The result does not depend on the order of observations, the batch composition or the thread
// count: max is exact and order-free. A NaN in an activation is recorded as NaN (and refused
// when a scale is made from it).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "model/forward.h"

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
  const std::map<std::string, Stat, std::less<>>& stats() const { return stats_; }
  void clear() { stats_.clear(); }
  // Adds statistics observed elsewhere (another rank): amax the max (NaN sticky), rows the sum.
  void merge(std::string_view name, const Stat& s);

 private:
  std::map<std::string, Stat, std::less<>> stats_;
};

}  // namespace strata
