// A decoder layer written once for every backend (docs/DESIGN.md "One backend"):
//
//   auto layer = family.make_layer(config, index, "model.layers.N.");
//   layer->bind(binder);               // names its weights (spelled only in the family's file)
//   layer->forward(backend, tokens, x); // x [T, H] in the backend's memory, updated in place
//
// The binder decides where weights come from: the CPU's (model/forward.cpp) reads them from the
// checkpoint into fp32, the CUDA one (model/cuda/gpu_forward.cpp) points into the layer's
// device blob. The backend (ops/backend.h) decides where the ops run.
//
// A family is one file, model/<family>.cpp, and one entry of the table in model/families.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "model/arch.h"
#include "ops/backend.h"

namespace strata::model {

class Binder {
 public:
  virtual ~Binder() = default;
  // A weight multiplied by activations in the backend's GEMM precision (projections).
  virtual ops::Weight matrix(const std::string& name, const Shape& shape) = 0;
  // A weight held in fp32: norms, biases, convolutions, routers and gates (multiplied in fp32).
  virtual ops::Weight vector(const std::string& name, const Shape& shape) = 0;
  virtual bool has(const std::string& name) const = 0;
  virtual Shape shape_of(const std::string& name) const = 0;
  // Whether routed expert e of `experts` is held (and computed) here (expert parallelism).
  virtual bool holds_expert(int64_t /*e*/, int64_t /*experts*/) const { return true; }
  // How a server stores the KV cache observed under `cache` ("<layers.N>.self_attn.k_cache" or
  // "...v_cache", model/forward.h): none unless the binder simulates a served export (strata
  // compare, model/forward.cpp).
  virtual ActQuant kv_quant(const std::string& /*cache*/) const { return {}; }
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual void bind(Binder& b) = 0;
  virtual void forward(ops::Backend& be, const ops::Tokens& t, float* x) = 0;
};

// One architecture family: the check of config.json fields that change the math (a
// strata::Error naming the field) and the layer builder.
struct Family {
  ArchFamily family;
  void (*check_config)(const ModelConfig& config);
  std::unique_ptr<Layer> (*make_layer)(const ModelConfig& config, int64_t index,
                                       const std::string& prefix);
  // The final norm multiplies by norm_offset + model.norm.weight (1 where the norm weights are
  // stored zero-centred: Qwen3-Next, Qwen3.5; the layers set their own norms' ops::Weight::offset).
  float norm_offset = 0.0f;
  // Its attention takes a keep mask of ceil(longest sequence / 32) int32 words per token
  // (DeepSeek-V3.2's lightning indexer): scratch that grows with the longest sequence.
  bool keep_mask = false;
};
// The family of `config`; a strata::Error when its forward is not implemented.
const Family& family_of(const ModelConfig& config);

}  // namespace strata::model
