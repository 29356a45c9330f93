// The decoder-layer forward on the GPU (docs/CUDA.md "The engine on the GPU"): the same math as
// the CPU families of model/ (llama.cpp, qwen_moe.cpp), on a ragged batch of tokens resident on
// the device, with the observers' amaxes reduced on the device under the CPU path's hub names
// (model/forward.h), so that the calibrator and the exporter see the same statistics.
// Host-only header: the kernels live in model/cuda/kernels.cu.
//
//   GpuForward f(config, ckpt, budget, stream, options);
//   f.reserve(max_tokens);                                  // scratch for one chunk
//   f.set_layer(l, blob, device_blob);                      // weights already on the device
//   f.forward(chunk, x);                                    // x [T, H] fp32 on the device
//   for (auto& s : f.take_stats()) calib.record(s.name, s.amax, s.rows);
//
// Attention: per group of equal-length sequences, S = QK^T and O = PV as batched cuBLAS GEMMs
// (TF32 tensor cores with bf16 GEMMs, pedantic fp32 otherwise) around a causal softmax kernel.
// GEMMs: bf16 inputs (activations rounded to bf16, weights as stored when bf16) with fp32
// accumulation and output, like the source model's bf16 inference; or pedantic fp32 (no TF32)
// when options.gemm_bf16 is false, which matches the CPU forward to summation order. The router
// always runs in fp32 so that expert choices match the CPU path's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/gpu_memory.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "io/layer_reader.h"

namespace strata::gpu {

// engine/options.h GpuOptions' part that the forward uses.
struct GpuForwardOptions {
  bool gemm_bf16 = true;        // GEMM inputs in bf16 (fp32 accumulation); false: fp32
  int gemm_threads = 4;         // host threads issuing the routed experts' GEMMs
  bool profile = false;         // log the device time of each part of the forward at the end
  bool warp_attention = false;  // attention always in the warp-per-query kernel
};

// Tokens of one chunk: whole sequences, concatenated. Device arrays of T entries.
struct GpuChunk {
  int64_t tokens = 0;
  const int64_t* positions = nullptr;  // position of each token within its sequence
  const int64_t* seq_start = nullptr;  // chunk-relative index of each token's sequence start
  std::vector<int64_t> seq_bounds;     // host: sequence s spans [seq_bounds[s], seq_bounds[s+1])
  const int64_t* seq_bounds_dev = nullptr;  // the same n_seqs + 1 entries on the device
};

struct AmaxStat {
  std::string name;
  float amax = 0.0f;
  int64_t rows = 0;
};

class GpuForward {
 public:
  // "" when the GPU forward supports the model; else why not (the run then stays on the CPU).
  static std::string unsupported(const ModelConfig& config, const Checkpoint& ckpt);

  GpuForward(const ModelConfig& config, const Checkpoint& ckpt, DeviceBudget& budget,
             const Stream& stream, GpuForwardOptions options);
  ~GpuForward();

  // Checkpoint tensors decoder layer l reads (the static form needs no device).
  std::vector<std::string> layer_tensors(int64_t l) const;
  static std::vector<std::string> layer_tensors(const ModelConfig& config, const Checkpoint& ckpt,
                                                int64_t l);
  // Device bytes of scratch per token of a chunk, and of converted weights for layer l.
  uint64_t bytes_per_token() const;
  uint64_t converted_bytes(int64_t l, const LayerBlob& blob) const;
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
  // x [T, H] fp32 on the device, updated in place (rounded to bf16 at the end when round_bf16).
  void forward(const GpuChunk& chunk, float* x, bool round_bf16);
  // The statistics of every forward since the last take (synchronizes the stream).
  std::vector<AmaxStat> take_stats();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::gpu
