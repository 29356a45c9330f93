// A weight quantized in its module's format: the encoders' results (quant/nvfp4.h, fp8.h,
// mxfp8.h), as host tensors. The backend's quantize_weight (ops/backend.h) makes them on the
// host or the device; the exporter names and writes them (with the activation scales it makes
// from the calibration).
#pragma once

#include <map>
#include <optional>
#include <string>

#include "quant/fp8.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"

namespace strata {

struct QuantizedWeight {
  std::optional<Nvfp4Weight> nvfp4;  // kNvfp4, kW4A16Nvfp4
  std::optional<Fp8Weight> fp8;      // kFp8
  std::optional<Mxfp8Weight> mxfp8;  // kMxfp8
};
using PrecomputedWeights = std::map<std::string, QuantizedWeight>;  // per module name

}  // namespace strata
