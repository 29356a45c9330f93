// The decoder-layer forward on the GPU (docs/CUDA.md "The engine on the GPU"): each layer is its
// family's layer (model/<family>.cpp, the same code the CPU runs) bound to the layer's weights in
// device memory and run by the CUDA backend (ops/cuda/cuda_backend.h) on a ragged batch of tokens
// resident on the device. The observers' amaxes are reduced on the device under the same hub
// names as on the CPU (model/forward.h), so that the calibrator and the exporter see the same
// statistics.
//
//   GpuForward f(config, ckpt, budget, stream, options);
//   f.reserve(max_tokens, longest, cap);                    // scratch for one chunk
//   f.set_layer(l, blob, device_blob);                      // weights already on the device
//   f.forward(chunk, x);                                    // x [T, H] fp32 on the device
//   for (auto& s : f.take_stats()) calib.record(s.name, s.amax, s.rows);
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/gpu_memory.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "io/layer_reader.h"
#include "ops/cuda/cuda_backend.h"

namespace strata::gpu {

// engine/options.h GpuOptions' part that the forward uses.
using GpuForwardOptions = ops::CudaBackendOptions;
// Tokens of one chunk: whole sequences, concatenated (positions and sequence starts on the device).
using GpuChunk = ops::Tokens;
using AmaxStat = ops::AmaxStat;
using SequenceStats = ops::SequenceStats;
using HessianStats = ops::HessianStats;

// strata compare's simulation of a served export (model/forward.h ForwardOptions, docs/COMPARE.md
// "What is simulated"): each quantized linear's input quantized with the export's input scale
// (model/common.h served_input_quant), and the KV cache through `kv_cache` with its k/v scales
// (served_kv_quant). An export's weights (NVFP4, FP8, MXFP8, MXFP4) are read whatever this says.
struct Serving {
  bool activations = false;
  ActQuant::Kind kv_cache = ActQuant::Kind::kNone;
};

class GpuForward {
 public:
  // "" when the GPU forward supports the model, run with `serving`'s simulation; else why not
  // (the run then stays on the CPU).
  static std::string unsupported(const ModelConfig& config, const Checkpoint& ckpt,
                                 Serving serving = {});

  GpuForward(const ModelConfig& config, const Checkpoint& ckpt, DeviceBudget& budget,
             const Stream& stream, GpuForwardOptions options, Serving serving = {});
  ~GpuForward();

  // The inputs layer l's forward observes on the GPU, each slot's hub names (a fused input has
  // several): the sizing backend's registration, which needs no device.
  static std::vector<std::vector<std::string>> observed_inputs(const ModelConfig& config,
                                                               const Checkpoint& ckpt, int64_t l,
                                                               GpuForwardOptions options = {});
  // Checkpoint tensors decoder layer l reads, sorted; the static form for layers [first, last)
  // (element l - first), without a device. Each costs O(log n + its names).
  std::vector<std::string> layer_tensors(int64_t l) const;
  static std::vector<std::vector<std::string>> layer_tensors(const ModelConfig& config,
                                                             const Checkpoint& ckpt, int64_t first,
                                                             int64_t last);
  // Device bytes of scratch per token of a chunk whose longest sequence has `longest` tokens (the
  // largest of the layers' working sets, found by running each layer on the sizing backend, plus
  // the keep mask of a family with one), and of converted weights for layer l.
  // With defer_experts, the converted bytes when the routed experts' compressed weights are
  // deferred (set_expert_slice), and the largest deferred weight's bf16 bytes.
  uint64_t bytes_per_token(int64_t longest) const;
  uint64_t converted_bytes(int64_t l, const LayerBlob& blob, bool defer_experts = false,
                           uint64_t* largest_deferred = nullptr) const;
  // Routed experts in slices (docs/CUDA.md "Memory"): the device bytes one expert takes in the
  // slice buffer (ops::CudaBackend::expert_slot_bytes of the largest, 0 without routed experts),
  // and the slice: with 0 < experts < num_experts, set_layer defers the routed experts'
  // compressed weights (INT4 pack, MXFP4, FP8 blocks) and the MoE decompresses `experts` of them
  // at a time into a buffer of experts x expert_slot_bytes() (reserved here); 0 or num_experts:
  // everything decompressed at set_layer. Not with expert parallelism (never sliced). Before the
  // first set_layer.
  uint64_t expert_slot_bytes() const;
  void set_expert_slice(int64_t experts);
  // Device bytes of the attention score buffer for sequences of up to `longest` tokens
  // (S = QK^T per sequence and head, fp32, through batched GEMMs); 0 when even one sequence's
  // scores would take more than `cap` bytes, and attention then runs in the warp-per-query
  // kernel (also with GpuForwardOptions::warp_attention).
  uint64_t attention_bytes(int64_t longest, uint64_t cap) const;
  // Scratch for chunks of up to `tokens` tokens, and the attention buffer above.
  void reserve(int64_t tokens, int64_t longest, uint64_t attention_cap);
  // Layer l's weights: blob describes the device buffer `weights` (same layout as the host
  // blob), which must stay alive until the next set_layer. Converts what the GEMMs need.
  void set_layer(int64_t l, const LayerBlob& blob, const void* weights);
  // Where the current layer's compressed weight `name` ("<M>.weight": FP8 blocks, INT4, MXFP4)
  // was decompressed to (the converted weights, valid until the next set_layer), or for a
  // deferred routed expert's the compressed bytes (StoredWeight::compressed: the quantizer's
  // backend decompresses it); null when it is not a compressed weight.
  const ops::StoredWeight* decompressed_weight(const std::string& name) const;
  // x [T, H] fp32 on the device, updated in place (rounded to bf16 at the end when round_bf16).
  void forward(const GpuChunk& chunk, float* x, bool round_bf16);
  // Expert parallelism (GpuForwardOptions::expert_rank/expert_ranks): the exchange of the MoE
  // layers' rows with the other ranks (ops::CudaBackend::set_expert_exchange); null: none.
  void set_expert_exchange(DeviceExpertExchange* exchange);
  // The statistics of every forward since the last take (synchronizes the stream).
  std::vector<AmaxStat> take_stats();
  // MoE routing of the forwards to come reported to `routing` (ops::CudaBackend::
  // set_routing_observer); null: not reported.
  void set_routing_observer(Observer* routing);
  // The K/V sequence statistics since the last take (GpuForwardOptions::sequence_stats).
  std::vector<SequenceStats> take_sequence_stats();
  // local_hessian's statistics of these inputs from the next layer on (GpuForwardOptions::
  // hessian_bytes; ops::CudaBackend::track_hessians), and their sums as the last take_stats read
  // them back.
  void track_hessians(std::set<std::string, std::less<>> names);
  std::vector<HessianStats> take_hessians();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::gpu
