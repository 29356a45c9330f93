#include "calib/max_calib.h"

#include <cmath>

#include "ops/ops.h"

namespace strata {

void MaxCalibrator::observe(std::string_view name, const float* x, int64_t rows, int64_t cols) {
  record(name, ops::amax(x, rows * cols), rows);
  if (rows > 0 && hessian_names_.count(name)) {
    auto it = hessians_.find(name);
    if (it == hessians_.end())
      it = hessians_.emplace(std::string(name), std::make_unique<BlockHessian>(cols)).first;
    it->second->accumulate(x, rows);
  }
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
}

const MaxCalibrator::Stat* MaxCalibrator::find(std::string_view name) const {
  auto it = stats_.find(name);
  return it == stats_.end() ? nullptr : &it->second;
}

}  // namespace strata
