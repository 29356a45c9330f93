// Weight quantization of a layer through the op backend (ops/backend.h weight_amaxes,
// quantize_weight): the device placement quantizes each layer's weights where they already are
// (--gpu_quantize, on), on a CUDA backend of its own beside the forward, and hands the results to
// the exporter, which only adds the activation scales and writes (export/modelopt.h
// PrecomputedWeights). The exporter's own quantization goes through the CPU backend's same ops.
//
// Per layer the quantized modules are grouped by their weight amax: one per NVFP4 weight group
// (export/plan.h weight_group_key: its modules share weight_scale_2; the amax covers every planned
// module of the group, quantized here or not, as the exporter's), one per FP8 module (its own
// scale) except routed experts (export/plan.h fp8_shares_weight_amax: each expert's gate/up pair,
// or a fused-experts plan's projection and layer); MXFP8 needs none. All of a layer's amaxes are
// computed in one backend call, then each module is encoded.
//
// Under a weight scale search (the recipe's algorithm: mse, fp8_scale_sweep, local_hessian) the
// NVFP4 modules' block scales are searched by the backend (ops::WeightSearch; local_hessian with
// each module's input statistics, which the layer's forward must have gathered first); FP8
// modules under plain mse (a search over a whole shared-amax group) are left to the exporter.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "export/plan.h"
#include "ops/backend.h"

namespace strata {

class WeightQuantizer {
 public:
  // The modules of layers [first_layer, plan.num_layers) that `take` accepts (with ranks, those
  // this rank writes); with compressed false, none of a fused group with a compressed source (the
  // exporter then decompresses and quantizes those itself).
  WeightQuantizer(const QuantPlan& plan, int64_t first_layer,
                  const std::function<bool(const PlannedModule&)>& take, bool compressed = true);
  // The most amax groups of one layer, and the largest module's encoded bytes: what the backend
  // must hold (its amax slots and its scratch).
  int64_t max_groups() const { return static_cast<int64_t>(max_groups_); }
  uint64_t encoded_bytes() const { return encoded_bytes_; }
  // local_hessian: the searches need the layer's input statistics (quantize's `hessian`), and
  // the widest searched module's take hessian_bytes (16 doubles per input feature); else 0.
  bool needs_hessians() const { return hessian_bytes_ > 0; }
  uint64_t hessian_bytes() const { return hessian_bytes_; }
  // Layer l's modules quantized on `backend`; `weight(module)` is the module's stored weight in
  // the backend's memory; under local_hessian `hessian(module)` its BlockHessian::normalized()
  // (empty when no token reached it: the plain search, as the exporter's).
  PrecomputedWeights quantize(
      int64_t l, ops::Backend& backend,
      const std::function<ops::StoredWeight(const std::string&)>& weight,
      const std::function<std::vector<double>(const std::string&)>& hessian = nullptr);

 private:
  struct Job {
    const PlannedModule* module;
    int group;                   // its amax group; -1 for MXFP8 (no amax)
    bool fp32_quotient = false;  // ops::StoredWeight::fp32_quotient (gpt-oss's fused experts)
  };
  struct Layer {
    std::vector<Job> jobs;                                   // plan order
    std::vector<std::vector<const PlannedModule*> > groups;  // group -> the modules of its amax
  };
  std::vector<Layer> layers_;
  std::optional<ops::WeightSearch> search_;  // the recipe's NVFP4 scale search, if any
  uint64_t encoded_bytes_ = 0, hessian_bytes_ = 0;
  size_t max_groups_ = 0;
};

}  // namespace strata
