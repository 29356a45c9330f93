// A weight quantized in its module's format: the encoders' results (quant/nvfp4.h, fp8.h,
// mxfp8.h), as host tensors. The backend's quantize_weight (ops/backend.h) makes them on the
// host or the device; the exporter names and writes them (with the activation scales it makes
// from the calibration).
//
// ActQuant: how a server quantizes a tensor it computes on (a quantized linear's input, the KV
// cache), for strata compare's simulation of a served export (ops::Weight::input_quant,
// ops::Backend::fake_quantize; docs/COMPARE.md).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "quant/fp8.h"
#include "quant/mxfp4.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"

namespace strata {

struct QuantizedWeight {
  std::optional<Nvfp4Weight> nvfp4;  // kNvfp4, kW4A16Nvfp4, kW4A16Nvfp4Bs32
  std::optional<Fp8Weight> fp8;      // kFp8, kFp8PbWo (block scales)
  std::optional<Mxfp8Weight> mxfp8;  // kMxfp8
  std::optional<Mxfp4Weight> mxfp4;  // kMxfp4
};
using PrecomputedWeights = std::map<std::string, QuantizedWeight>;  // per module name

struct ActQuant {
  // kNvfp4: 16-blocks, dynamic E4M3 scales under the static global `scale`; kFp8: per tensor,
  // static `scale`; kMxfp8: 32-blocks, dynamic E8M0 scales (`scale` unused).
  enum class Kind : uint8_t { kNone, kNvfp4, kFp8, kMxfp8 };
  Kind kind = Kind::kNone;
  float scale = 0.0f;
  bool on() const { return kind != Kind::kNone; }
  bool operator==(const ActQuant&) const = default;
};

// x[rows, cols] fake-quantized in place as `q` says (the blocks run along each row); `name`
// names the tensor in errors.
inline void fake_quantize(const ActQuant& q, float* x, int64_t rows, int64_t cols,
                          std::string_view name) {
  switch (q.kind) {
    case ActQuant::Kind::kNone:
      return;
    case ActQuant::Kind::kNvfp4:
      nvfp4_fake_quantize(x, rows, cols, q.scale, name);
      return;
    case ActQuant::Kind::kFp8:
      fp8_fake_quantize(x, rows * cols, q.scale, name);
      return;
    case ActQuant::Kind::kMxfp8:
      mxfp8_fake_quantize(x, rows, cols, name);
      return;
  }
}

}  // namespace strata
