// The decoder layers of strata compare (engine/compare.h), on the CPU or the GPU: layer l of the
// source on its hidden states, and layer l of the export on the source's and on its own.
// engine/compare.cpp makes the CPU's from model/forward.h; engine/compare_gpu.cpp the GPU's
// (docs/COMPARE.md "On the GPU").
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "model/forward.h"
#include "ops/backend.h"

namespace strata {

class CompareLayers {
 public:
  virtual ~CompareLayers() = default;
  // hs, local, hq [T, H] host fp32, updated in place: hs by the source's layer l, local and hq by
  // the export's; each run's MoE routing goes to its observer (rs, rl, rq), token by token.
  virtual void run(int64_t l, float* hs, float* local, float* hq, Observer* rs, Observer* rl,
                   Observer* rq) = 0;
};

struct CompareGpuOptions {
  uint64_t max_gpu_memory_bytes = 0;  // 0: the device's free memory
  bool gemm_bf16 = true;              // the GEMMs' inputs in bf16 (fp32 accumulation), or fp32
  // Test hook: chunks of at most this many tokens (or one sequence, when longer), as a tight cap
  // would make them; 0: as many as fit.
  int64_t test_chunk_tokens = 0;
  bool bf16_between_layers = true;
  bool simulate_activations = false;
  ActQuant::Kind kv_cache = ActQuant::Kind::kNone;
};

// "" when both checkpoints' layers run on the GPU with o's serving simulation; else why not.
std::string gpu_compare_unsupported(const ModelConfig& cs, const Checkpoint& ks,
                                    const ModelConfig& cq, const Checkpoint& kq,
                                    const CompareGpuOptions& o);

// Both models' layers on the GPU, chunks of whole sequences under the memory cap. Throws
// strata::Error without CUDA, or when one sequence does not fit the cap.
std::unique_ptr<CompareLayers> gpu_compare_layers(const ModelConfig& cs, const Checkpoint& ks,
                                                  const ModelConfig& cq, const Checkpoint& kq,
                                                  const Batch& batch,
                                                  const CompareGpuOptions& options);

// Both models' final norms and lm_heads (`spec`, model/forward.h) on the GPU: logits of rows of
// host hidden states computed on the device (the norm in fp32, the GEMM as options.gemm_bf16
// says) and copied back. Empty when the two do not fit --max_gpu_memory_gb together (the caller
// then uses the CPU's heads), or without CUDA. Made after the layers' device memory is released.
struct LogitsHeads {
  std::unique_ptr<LogitsHead> source, quantized;
};
LogitsHeads gpu_logits_heads(const Checkpoint& ks, const HeadSpec& source, const Checkpoint& kq,
                             const HeadSpec& quantized, const CompareGpuOptions& options);

}  // namespace strata
