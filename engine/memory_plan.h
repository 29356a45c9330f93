// The GPU layer loop's memory plan (engine/gpu_runner.h, docs/CUDA.md "The engine on the GPU"):
// from the device memory left in the budget and the sizes of what the loop holds, how many device
// buffers hold layer weights, where the calibration hidden states live, and how consecutive
// micro-batches are grouped into chunks (one forward call each). Pure: sizes in, plan out; it
// needs no GPU (tests/engine/memory_plan_test.cpp).
//
// The rules, for B weight buffers (B = 1 or 2):
//   fixed(B)  = B * max_blob + max_conv + attention + meta_bytes + 16 MiB + quantizer
//               (sliced: max_conv and quantizer as "Slices" below says)
//   per_token = forward_per_token + 4 * H       (the chunk's fp32 hidden states)
//   least(B)  = fixed(B) + (per_token + 4 * H) * largest      (off the device: two bf16 in/out
//                                                               buffers of 2 * H bytes a token)
//   B fits when least(B) <= left; if even B = 1 does not, the run is refused with the sizes.
//   Tier: kDevice when fixed(B) + store_bytes + per_token * largest <= left (and not
//   force_host); else kPinned when host_fits; else kFile.
//   Chunk cap in tokens: max(largest, room / token_bytes), room = left - fixed(B) - (store_bytes
//   on the device), token_bytes = per_token (+ 4 * H off the device); force_host: largest.
//   Chunks: consecutive micro-batches, each chunk as many as fit the cap (at least one).
//   B = 2 unless forced, or two do not fit, or one buffer's chunks number at most 3/4 of two's.
// Split: when even B = 1 does not fit one micro-batch and the sequences are given, the unit is a
// sequence instead: `largest` above reads the longest sequence, meta counts a bound per sequence
// ((3 * total + sequences) * 8), and chunks are consecutive sequences of one micro-batch up to
// the cap (never across micro-batches). The GPU forward's bytes do not depend on how tokens are
// chunked (docs/CUDA.md), so this changes no byte of the export. Refused only when one sequence
// does not fit, with the --max_gpu_memory_gb that would.
// Slices: when even that does not fit with max_conv and the routed experts' decompression can be
// deferred (max_conv_deferred < max_conv, expert_slot > 0), the GPU decompresses the experts a
// slice at a time (docs/CUDA.md "Memory"): max_conv becomes max_conv_deferred + slice *
// expert_slot, slice = min(experts - 1, 1 + (left - least with a slice of one) / 2 /
// expert_slot): half of what one expert at a time leaves goes to larger slices, half to chunks;
// the quantizer adds quantizer_deferred (it decompresses each deferred weight it quantizes).
// Refused only when a slice of one expert and one sequence (or micro-batch) do not fit, with the
// --max_gpu_memory_gb that would. A layer that fits is never sliced (expert_slice 0: every expert
// decompressed at set_layer, once per layer). Slicing changes no byte of the export either.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace strata {

struct GpuMemoryInputs {
  uint64_t left = 0;                  // device bytes left in the budget (after the forward's setup)
  uint64_t max_blob = 0;              // the largest layer's weights: one device buffer
  uint64_t max_conv = 0;              // the largest layer's converted weights
  uint64_t attention = 0;             // the attention score buffer (0: the warp kernel)
  uint64_t quantizer = 0;             // device weight quantization's buffers (0: off)
  uint64_t forward_per_token = 0;     // the forward's scratch per token of a chunk
  int64_t hidden_size = 0;            // H
  std::vector<int64_t> batch_tokens;  // tokens of each micro-batch, in order
  bool host_fits = true;              // the hidden states may be held in (pinned) host memory
  bool force_host = false;            // test hook: never on the device, one micro-batch per chunk
  bool force_split = false;           // test hook: split (below) even where it is not needed
  int weight_buffers = 0;             // 0: the planner chooses; 1 or 2: forced
  // Tokens of each micro-batch's sequences (empty: micro-batches are never split).
  std::vector<std::vector<int64_t>> seq_tokens;
  uint64_t limit = 0;  // the whole budget (--max_gpu_memory_gb), for the refusal's advice
  // Slices (above): the largest layer's converted weights when its routed experts' compressed
  // weights are deferred, one expert's bytes in the slice buffer, the routed experts of a layer.
  uint64_t max_conv_deferred = 0;
  uint64_t expert_slot = 0;
  uint64_t quantizer_deferred = 0;  // and the device quantizer's buffer for one of them (0: off)
  int64_t experts = 0;
  int64_t force_expert_slice = 0;  // test hook: this many experts a slice (0: the planner's)
};

// Where the hidden states of every micro-batch live between layers.
enum class HiddenTier {
  kDevice,  // the whole store, bf16, on the device
  kPinned,  // in pinned host memory, each chunk copied in and out (overlapped)
  kFile,    // in the host ActivationStore (spilled files), each chunk staged through one
            // micro-batch buffer a micro-batch at a time
};

struct PlannedChunk {
  size_t first = 0, last = 0;  // micro-batches [first, last) (split: last = first + 1)
  int64_t token0 = 0, tokens = 0;
};

struct GpuMemoryPlan {
  int buffers = 2;  // device buffers for layer weights
  HiddenTier tier = HiddenTier::kFile;
  std::vector<PlannedChunk> chunks;
  std::vector<int64_t> token0;  // micro-batch b's first token (back to back); [n] = total
  int64_t total = 0;            // tokens of every micro-batch
  int64_t largest = 0;          // tokens of the largest micro-batch
  bool split = false;           // chunks are sequences of one micro-batch (see above)
  int64_t longest_seq = 0;      // tokens of the longest sequence (0 without seq_tokens)
  int64_t chunk_max = 0;        // tokens of the largest chunk
  uint64_t store_bytes = 0;     // every micro-batch's hidden states in bf16
  // Token metadata on the device: positions [total], chunk-relative sequence starts [total], and
  // each chunk's sequence bounds (at most tokens + 1 per chunk; chunks <= micro-batches).
  uint64_t meta_bytes = 0;
  int64_t expert_slice = 0;  // routed experts decompressed at a time (0: all, at set_layer)
};

// Throws strata::Error when one buffer and one micro-batch (split: one sequence) do not fit in
// `left`, or when two buffers are forced and do not fit; each message gives the sizes and what
// to change.
GpuMemoryPlan plan_gpu_memory(const GpuMemoryInputs& in);

// Bytes as GiB for messages: "1.5 GiB" (at most six characters of the number).
std::string format_gib(uint64_t bytes);

}  // namespace strata
