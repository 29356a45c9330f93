// The quantize run, one decoder layer at a time:
//   plan (recipe x checkpoint, checked before any work)
//   -> calibration sequences -> embed
//   -> per layer: load its weights, run every micro-batch through it with a MaxCalibrator
//      watching, quantize and write its tensors, keep its outputs as the next layer's inputs
//      (full-precision outputs, as ModelOpt's max calibration does)
//   -> the remaining tensors, index, config files, sidecar files.
// Formats that need no activation statistics (w4a16_nvfp4, mxfp8, no KV cache) skip the
// forward entirely: a streaming conversion.
//
// Every finished step (head, each decoder layer, tail) is synced and recorded in a resume
// manifest (engine/resume.h); running the same job again continues after the last recorded step
// and gives byte-identical output. A manifest of another job is refused, naming what changed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "calib/dataset.h"
#include "engine/plan.h"
#include "export/modelopt.h"

namespace strata {

struct QuantizeJob {
  std::string model_dir;
  std::string export_path;
  Recipe recipe;
  CalibOptions calib;
  int64_t batch_size = 8;  // sequences per micro-batch; the grouping depends only on sequence index
  uint64_t max_shard_bytes = 5ull << 30;
  bool progress = true;
  bool overwrite = false;  // start over: empty export_path and drop any resume state
  std::string resume_dir;  // "" = <export_path>.strata_resume
  uint64_t max_cpu_memory_bytes =
      0;                // 0: no cap; else refused up front when the estimate exceeds it
  std::string version;  // producer version written to the config files
};

// Host memory a run needs besides the program itself (docs/QUANTIZE.md "Memory"):
//   2 x the largest decoder layer's weights in fp32 (the layer computing, the one prefetched)
//   + hidden states of every calibration token, fp32 (tokens x hidden x 4)
//   + one micro-batch's working set (batch_size x longest sequence x hidden x 4 x 16)
struct MemoryEstimate {
  uint64_t layer_weights = 0;  // one layer, fp32
  uint64_t activations = 0;
  uint64_t working = 0;
  uint64_t total() const { return 2 * layer_weights + activations + working; }
  std::string describe() const;
};
MemoryEstimate estimate_memory(const QuantPlan& plan, uint64_t tokens, int64_t seq_len,
                               int64_t hidden_size, int64_t batch_size);

struct QuantizeResult {
  QuantPlan plan;
  CalibReport calib;
  std::vector<LayerReport> layers;
  std::vector<std::string> files;
  bool calibrated = false;  // false for weight-only streaming conversions
  int64_t resumed_at_step = 0;
  MemoryEstimate memory;  // 0 for a fresh run; else the first step this run did
  double seconds = 0.0;
};

// Everything `--dry-run` prints: formats per kind, which rule decided, estimated output size and
// memory. Reads only headers.
std::string describe_plan(const QuantPlan& plan, const Checkpoint& ckpt, const CalibOptions& calib,
                          int64_t hidden_size, int64_t batch_size);

QuantizeResult run_quantize(const QuantizeJob& job);

}  // namespace strata
