// The switches of a quantize run beyond its inputs: how the GPU path runs, and test hooks. Filled
// by cli/quantize.cpp from flags of `strata quantize` (docs/QUANTIZE.md "Test and benchmark
// switches"); QuantizeJob holds them and hands the engine's parts what they use. Nothing below
// cli/ reads the environment.
#pragma once

#include <cstdint>
#include <optional>

#include "io/layer_reader.h"

namespace strata {

// --calib_precision (docs/QUANTIZE.md "Calibration precision"): how the calibration forward rounds
// inside a decoder layer. The activation and KV scales follow it; weights do not depend on it.
enum class CalibPrecision {
  kFp32Layers,  // fp32 inside a layer (GPU: bf16 GEMM inputs), bf16 between layers (default)
  kBf16Ops,     // rounded to bf16 after every op as transformers' bf16 model runs (ModelOpt's)
};

// The GPU path (engine/gpu_runner.h, model/cuda/gpu_forward.h; docs/CUDA.md). Ignored on the
// CPU. Only gemm_bf16 changes the activation scales; the rest leave every byte as it is.
struct GpuOptions {
  bool gemm_bf16 = true;        // --gpu_gemm bf16|fp32: the forward's GEMM inputs
  int weight_buffers = 0;       // --gpu_weight_buffers 1|2: layer weight buffers; 0: planned
  bool quantize = true;         // --gpu_quantize on|off: weights quantized on the device
  bool warp_attention = false;  // --gpu_attention warp: the warp-per-query kernel always
  bool profile = false;         // --gpu_profile: device time per part of the forward, logged
  // --resume_every SECONDS: the least time between two steps whose hidden states are written for
  // resume (engine/layer_loop.h ResumeCadence; the CPU writes every step's anyway). A run shorter
  // than this writes none before its end; a kill redoes at most about this long.
  double resume_every_s = 60;
};

// Test hooks (hidden flags --test_*, docs/QUANTIZE.md "Test and benchmark switches"): they make
// tiny fixtures take the paths that large runs take, or fail and stall on purpose.
struct TestHooks {
  // --test_activation_budget BYTES: the activation store's budget, in place of the one
  // --max_cpu_memory_gb leaves (1: every micro-batch spills).
  std::optional<uint64_t> activation_budget;
  // --test_slow_layer_ms MS: every step sleeps this long after its tensors are written and
  // before it is committed (or, not durable, goes on), so that a kill lands mid-run.
  int64_t slow_layer_ms = 0;
  // --test_fail_rank R --test_fail_layer L: rank R throws at the start of layer L.
  int fail_rank = -1;
  int64_t fail_layer = -1;
  // --test_gpu_host_store: the GPU path keeps the hidden states off the device, one micro-batch
  // per chunk, as a budget far below the store would on a large run.
  bool gpu_host_store = false;
  // --test_gpu_split: the GPU path runs chunks of sequences of one micro-batch, as a budget that
  // cannot hold one micro-batch beside a layer would (engine/memory_plan.h "Split").
  bool gpu_split = false;
  // --test_gpu_expert_slice N: the GPU path decompresses a compressed source's routed experts N
  // at a time, as a budget that cannot hold a layer's decompressed experts would
  // (engine/memory_plan.h "Slices"); 0: as the planner decides.
  int64_t gpu_expert_slice = 0;
  // --test_gpu_ranks_exchange main: GPU ranks exchange each layer's shares on the main thread
  // instead of the reader thread's own communicator.
  bool gpu_exchange_on_main = false;
  // --test_gpu_read THREADS[:none|sequential|willneed[:PIECE_MiB[:READ_KiB]]][:wait|nowait]: the
  // GPU path's page-cache warmer (engine/gpu_runner.h gpu_warm_start) in that pattern, and
  // whether the loop's reader waits for it (io/layer_reader.h ReadPattern), for
  // bench/gpu_bench.sh to time patterns that bench/read_bench ranked.
  ReadPattern gpu_read;
  // --test_writeback layer|none: after each layer step that is not durable the writer asks the
  // kernel to start writing its shards back (layer, the default), or leaves the dirty pages to
  // the kernel's own writeback until the next durable step's fsync (none), for bench/gpu_bench.sh
  // to time both against the read + write floor (whose writer leaves them to the kernel).
  bool writeback_per_layer = true;
  // --test_first_reads gentle|streams: on the GPU path the first step's early reads stay 1 MiB
  // reads on 4 threads beside the layers' warmer (gentle, the default) or, once the start-up's own
  // reads are done, go on as 4 sequential streams (streams: a candidate for the loop's wait at
  // layer 0 for the export head, docs/PERFORMANCE.md eighth session; not timed, the ninth's runs no
  // longer showed that wait), for bench/gpu_bench.sh to time both.
  bool first_reads_streams = false;
};

}  // namespace strata
