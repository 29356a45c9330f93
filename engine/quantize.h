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
// Finished steps (the head, the decoder layers: each on the CPU, on the GPU as the resume cadence
// of engine/layer_loop.h allows) are synced and recorded in a resume manifest (engine/resume.h);
// running the same job again continues after the last recorded step and gives byte-identical
// output. A manifest of another job is refused, naming what changed.
#pragma once

#include <cstdint>
#include <future>
#include <string>
#include <vector>

#include "calib/dataset.h"
#include "engine/comm.h"
#include "engine/options.h"
#include "engine/run_times.h"
#include "export/modelopt.h"
#include "export/plan.h"

namespace strata {

struct QuantizeJob {
  std::string model_dir;
  std::string export_path;
  Recipe recipe;
  CalibOptions calib;
  int64_t batch_size = 8;  // sequences per micro-batch; the grouping depends only on sequence index
  uint64_t max_shard_bytes = 5ull << 30;
  bool progress = true;
  bool overwrite = false;      // start over: empty export_path and drop any resume state
  bool exact_mxfp4 = false;    // ExportOptions::exact_mxfp4
  std::string resume_dir;      // "" = <export_path>.strata_resume
  std::string offload_folder;  // spilled hidden states; "" = the resume folder
  // 0: no cap. Else the activation store spills when it does not fit beside the rest, and a run
  // whose minimum (MemoryEstimate::minimum) exceeds it is refused up front.
  uint64_t max_cpu_memory_bytes = 0;
  std::string version;  // producer version written to the config files
  // The ranks of a scaled-out run (engine/comm.h, docs/SCALEOUT.md); nullptr: a single process.
  // Every rank runs run_quantize with the same job; the output does not depend on the rank count.
  Comm* comm = nullptr;
  // --expert_parallel: with ranks, the routed experts of every MoE layer are split over the ranks
  // (each reads, computes and writes its range) instead of every rank holding all of them.
  bool expert_parallel = false;
  // Where the calibration forward runs (engine/gpu_runner.h). device_explicit: --device was
  // given; a model the GPU forward does not implement is then an error rather than a fallback.
  enum class Device { kCpu, kCuda };
  Device device = Device::kCpu;
  bool device_explicit = false;
  // With device kCuda: the CUDA driver's device count, when the CLI left its probe (0.1-0.2 s,
  // the driver's start) to a helper thread so that the checkpoint's config and headers are read
  // meanwhile; the run takes it at its device choice (none visible: --device cuda refused, the
  // default falls back to the CPU). Not valid: the CLI checked before the run.
  std::shared_future<int> cuda_devices;
  uint64_t max_gpu_memory_bytes = 0;  // --max_gpu_memory_gb; 0: the device's free memory
  GpuOptions gpu;                     // engine/options.h: the --gpu_* flags
  TestHooks test;                     // engine/options.h: the hidden --test_* flags
  CalibPrecision precision = CalibPrecision::kFp32Layers;  // --calib_precision
  // The process ends right after a successful run (the CLI, one process, nothing after it): the
  // run's mappings, host and pinned buffers, device memory and helper threads are left for the
  // exit to reclaim instead of being freed one by one (issue 22: the exit is outside the layer
  // loop). The output is complete and durable before run_quantize returns either way.
  bool leave_for_exit = false;
};

// Host memory a run needs, an upper bound on its peak RSS (docs/QUANTIZE.md "Memory and
// progress"): the process as measured before the heavy work, plus each host allocation the run
// makes after that, each term the largest of its kind:
//   baseline        the process's RSS measured once the calibration data and the forward exist
//                   (binary, libraries, config, tokens), before the activation store and the
//                   layers, and measured again once the exporter exists (its tables); the larger,
//                   and with ranks the largest over the ranks
//   startup_peak    the peak RSS by then (transients of start-up): no bound is below it
//   layer_weights   what the host holds of one decoder layer's weights, x2 when calibrating (the
//                   layer computing and the one prefetched): fp32 on the CPU path; on the GPU
//                   path the layer's quantized codes coming back from the device (at most 2
//                   bytes a value); with --expert_parallel, this rank's routed experts only
//   layer_source    one layer's source pages while they are read (mapped), x2 likewise
//   quantizer       fp32 temporaries of the largest module while it is quantized (plus its
//                   bf16 decompression when the source is compressed), times the exporter's
//                   workers (export_workers(): that many modules are quantized at once)
//   fused_outputs   fused experts (plan.fused_experts, gpt-oss): one projection's encoded
//                   experts of a layer, held per expert and again as the fused tensor
//   outside_pages   the largest tensor outside the decoder layers (embedding, lm_head) while read
//   activations     the activation store in memory: every micro-batch, or one when spilled (on
//                   the GPU path: the hidden states in pinned host memory, when they go there)
//   working         one micro-batch's working set (fp32 buffer, layer intermediates, attention)
//   threads         the stacks and allocator arenas of the threads the run starts after the
//                   baseline: kThreadAllowance for each of the CPU kernels' threads, the
//                   exporter's workers and kHelperThreads (reader, writer, head, sync), and
//                   the early reads' kFirstReadThreads with their kFirstReadBytes buffers
//   statistics      local_hessian: the largest layer's per-16-block input second moments (16
//                   doubles per input feature of every searched module, each name its own), x3:
//                   the layer computing, the one being written, and the GPU forward's copy read
//                   back from the device (or the CPU's shared-input copies being made)
//   pinned          GPU path: the pinned buffers of engine/gpu_runner.cpp, two layer blobs and
//                   the one-micro-batch staging buffer
//   device_context  GPU path: the CUDA context's and libraries' host memory. Before the context
//                   exists, kCudaContextAllowance (used to decide whether the store spills);
//                   once the device placement exists, measured: the RSS then, less the baseline
//                   and the pinned buffers and hidden states the placement holds, plus
//                   kCudaLazyLoadingAllowance for the kernels loaded on first use
struct MemoryEstimate {
  uint64_t baseline = 0;
  uint64_t startup_peak = 0;
  uint64_t layer_weights = 0;
  uint64_t layer_source = 0;
  uint64_t quantizer = 0;
  uint64_t fused_outputs = 0;
  uint64_t outside_pages = 0;
  uint64_t activations = 0;      // as held: all micro-batches in memory, or one when spilled
  uint64_t activations_all = 0;  // every micro-batch, in the store's dtype
  uint64_t activations_one = 0;  // the largest micro-batch
  uint64_t working = 0;
  uint64_t statistics = 0;
  uint64_t workers = 1;  // modules quantized at once (export_workers())
  uint64_t threads = 0;
  uint64_t pinned = 0;
  uint64_t device_context = 0;
  bool calibrated = false;
  bool spilled = false;
  bool on_gpu = false;
  bool context_measured = false;  // device_context is the measured one, not the allowance
  // max(startup_peak, fixed() + activations).
  uint64_t total() const;
  // Everything but the activation store.
  uint64_t fixed() const;
  // The least a run can take: the store spilled (one micro-batch resident).
  uint64_t minimum() const;
  std::string describe() const;
};
// The CUDA context's host memory assumed before it exists (MemoryEstimate::device_context).
inline constexpr uint64_t kCudaContextAllowance = 1ull << 30;
// Added to the measured context: the CUDA runtime loads kernels on their first launch (lazy
// loading), after the measurement, and their host-side images grow the context. Measured on the
// H200 (2026-12-03): the GPU runs of the test fixtures grew by about 145 MiB after the measurement
// (with 128 MiB here, peak RSS exceeded the bound by 16-17 MiB in 19 GPU tests); 256 MiB leaves
// room for the kernels other shapes select (cuBLAS picks per shape).
inline constexpr uint64_t kCudaLazyLoadingAllowance = 256ull << 20;
// A thread's stack and allocator arena (MemoryEstimate::threads): about 0.4 MiB measured per
// CPU kernel thread on the test fixtures, taken as 1 MiB.
inline constexpr uint64_t kThreadAllowance = 1ull << 20;
inline constexpr uint64_t kHelperThreads = 4;
// Allocations from this size on are mapped and unmapped each time (mallopt M_MMAP_THRESHOLD) when
// the layers run on the CPU, so that freed layer tensors leave the resident set (QuantizeRun's
// choose_device says why).
inline constexpr uint64_t kCpuMmapThreshold = 4ull << 20;
// The early page-cache reads of the first step's tensors (the run's start, single process):
// threads, and each one's read buffer (io/layer_reader.h PageWarmer).
inline constexpr uint64_t kFirstReadThreads = 4;
inline constexpr uint64_t kFirstReadBytes = 1ull << 20;
// micro_batch_tokens: tokens per micro-batch (empty when weight-only).
// expert_ranks > 1: expert parallelism over that many ranks, so that a rank holds only its
// share of each layer's `experts` routed experts (the largest share). baseline and startup_peak
// are the caller's (measured: core/rss.h); on_gpu and the GPU terms likewise
// (engine/quantize_steps.h with_gpu_host_memory, with_measured_context).
MemoryEstimate estimate_memory(const QuantPlan& plan, const Checkpoint& ckpt,
                               const std::vector<int64_t>& micro_batch_tokens, int64_t seq_len,
                               int64_t hidden_size, bool bf16_store, int expert_ranks = 1,
                               int64_t experts = 0);
struct QuantizeResult {
  QuantPlan plan;
  CalibReport calib;
  std::vector<LayerReport> layers;
  std::vector<std::string> files;
  bool calibrated = false;  // false for weight-only streaming conversions
  // --export_path already held the finished export of this same run (its run record,
  // engine/resume.h): nothing was done and the rest of the result is empty.
  bool already_complete = false;
  int64_t resumed_at_step = 0;
  MemoryEstimate memory;
  double seconds = 0.0;
  // Checkpoint tensor bytes this rank read from the files (every tensor when single-process;
  // with ranks each tensor is read by one rank, so the ranks' sum is one read of the checkpoint).
  uint64_t bytes_read = 0;
  // With --expert_parallel: bytes of expert rows this rank sent to other ranks (dispatch and
  // results), and the seconds spent in those exchanges.
  uint64_t expert_bytes_sent = 0;
  double expert_exchange_seconds = 0.0;
  RunTimes times;  // wall time per phase (engine/run_times.h)
  // --gpu_profile: the disk's bytes read and written by phase and each half second
  // (core/disk_timeline.h); empty otherwise.
  std::string disk_timeline;
  // --gpu_profile: the process's age when the run's clock started (core/process_clock.h; before
  // it: the process's start and the CLI's parsing), and the finish's steps with their seconds.
  double clock_started_after = -1;
  std::string finish_steps;
};

// Everything `--dry-run` prints: formats per kind, which rule decided, estimated output size and
// memory. Reads only headers.
std::string describe_plan(const QuantPlan& plan, const Checkpoint& ckpt, const CalibOptions& calib,
                          int64_t hidden_size, int64_t batch_size);

QuantizeResult run_quantize(const QuantizeJob& job);

}  // namespace strata
