// The device's placement of the layer loop (engine/layer_loop.h), for `strata quantize --device
// cuda` (docs/CUDA.md "The engine on the GPU"):
//
//   read layer l+1 (LayerReader: merged preads into a pinned buffer, then one copy to the device
//   on a copy stream)   ||   layer l's forward on the device, chunk by chunk, and its weights
//   quantized on a second stream   ||   layer l-1 written by the exporter on the writer thread
//
// Hidden states: resident on the device in bf16 (exact: the forward rounds them to bf16 between
// layers) when the whole store fits in --max_gpu_memory_gb beside two layers' weights and one
// chunk's working set; otherwise they stay in the host ActivationStore (in pinned memory, or
// spilled to --offload_folder under --max_cpu_memory_gb, exactly as on the CPU path) and each
// chunk is copied in and out. A chunk is as many consecutive micro-batches as the working set
// allows. These choices, and one or two device buffers for layer weights, are
// engine/memory_plan.h's. A durable step's hidden states (engine/layer_loop.h) are copied to the
// store's next file and synced on a helper thread.
//
// Ranks (engine/gpu_ranks.h): with GpuLoop::comm of several ranks, each runs its own
// micro-batches on GPU local_rank mod devices; a layer is read once in total (each tensor by its
// writer, then broadcast, on the reader thread) and the statistics are combined over the ranks
// by the loop. With expert parallelism a rank's blob is the layer's shared tensors (read and
// broadcast as above) followed by its own routed experts (read by it alone, never broadcast):
//
//   blob buffer:   | attention, norms, router, shared experts (every rank) | my experts |
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "core/gpu_memory.h"
#include "engine/activation_store.h"
#include "engine/comm.h"
#include "engine/layer_loop.h"
#include "engine/options.h"
#include "engine/run_times.h"
#include "export/modelopt.h"
#include "export/plan.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "io/layer_reader.h"
#include "model/forward.h"

namespace strata {

struct ExpertTraffic;  // engine/parallel.h

// The part of the GPU setup that needs only the checkpoint's headers, started before the export
// head and the embedding (single process) so that it overlaps them: on a helper thread, the
// CUDA context is created and the loop's pinned host buffers are allocated (page-locking host
// memory costs about half a second per GiB): two layers' weights, and the hidden states' when
// a GPU memory cap leaves them no room on the device. the device placement takes over what
// fits its plan and allocates the rest itself.
struct GpuEarlySetup {
  std::future<void> done;
  uint64_t blob_bytes = 0;               // the largest layer's blob (weights[i] hold it)
  gpu::PinnedBuffer weights[2], hidden;  // hidden: empty when not allocated early
  // Its parts' seconds (the GPU setup's log line); libraries: what was left of cuBLAS's load
  // (gpu_library_preload) once the context existed.
  double context = 0, libraries = 0, pinned = 0;
};
// cuBLAS (ops/cuda/gemm.h gemm_library_load: over half a gigabyte of libraries, of which loading
// maps and relocates about 300 MB) loaded on a helper thread from a GPU run's first moment, once
// `devices` (the CLI's probe) reports a device, before the page warmer's streams start: loaded
// beside them, its page faults queued behind their read-ahead and took 3.2-4.0 s of the GPU setup
// (1.1-1.8 s beside the warmer's former pattern) on 2026-12-05's H100. Whoever needs the library
// first waits for it (a function-local static); a load that fails is reported by that caller.
// `devices` not valid: the helper thread asks cuda_device_count() itself. An invalid future
// without CUDA.
std::shared_future<void> gpu_library_preload(std::shared_future<int> devices);
// nullptr without CUDA or without layers to run. blob_bytes: the largest blob of the layers to run
// (gpu_layer_blobs); store_bytes: the bf16 hidden states' size; host_fits: they may stay in host
// memory.
std::unique_ptr<GpuEarlySetup> gpu_early_setup(int64_t first_layer, int64_t num_layers,
                                               uint64_t blob_bytes, uint64_t store_bytes,
                                               bool host_fits, uint64_t max_gpu_memory_bytes);

// Every decoder layer's weights as the device placement reads them (one pinned blob a layer,
// io/layer_reader.h), planned once on the start-up threads and shared by the memory estimate, the
// early setup and the placement (each planned them itself before: four passes over a Kimi-K2's
// 208k tensors). Empty without CUDA.
std::vector<LayerBlob> gpu_layer_blobs(const ModelConfig& config, const Checkpoint& ckpt,
                                       int64_t num_layers);
// The largest blob of layers [first_layer, blobs.size()); 0 when none.
uint64_t largest_blob(const std::vector<LayerBlob>& blobs, int64_t first_layer);

struct GpuLoop {
  const ModelConfig& config;
  const Checkpoint& ckpt;
  const QuantPlan& plan;
  ActivationStore& store;  // holds the inputs of first_layer, unless `embed` is set
  const std::vector<Batch>& batches;
  const ModeloptExporter& exporter;
  int64_t first_layer = 0;
  uint64_t max_gpu_memory_bytes = 0;  // 0: the device's free memory
  bool host_fits = true;              // the hidden states may be held in (pinned) host memory
  std::string resume_dir;
  GpuOptions gpu;            // QuantizeJob::gpu (engine/options.h)
  bool exact_mxfp4 = false;  // --exact_mxfp4: the exporter converts MXFP4 sources itself
  // Ranks (engine/gpu_ranks.h): null or one rank, the single process. With several, `batches`
  // are this rank's micro-batches, store_ids[i] the store's index of batches[i].
  Comm* comm = nullptr;
  std::vector<size_t> store_ids;
  const RunTimes* times = nullptr;  // the loop's, for the closing log line
  PageWarmer* warm = nullptr;       // gpu_warm_start's (blob i: layer first_layer + i)
  GpuEarlySetup* early = nullptr;   // gpu_early_setup's, taken over
  TestHooks test;                   // QuantizeJob::test: host store, exchange thread
  bool bf16_ops = false;            // QuantizeJob::precision is kBf16Ops
  // Expert parallelism over the ranks (docs/SCALEOUT.md "Expert parallel on GPU ranks"): each
  // rank holds and reads only its range of every layer's routed experts, the MoE rows go to the
  // experts' ranks and back over NCCL, and the ranks run their chunks in lockstep rounds.
  // expert_traffic: where the exchanges' bytes and seconds are added (the run's summary).
  bool expert_parallel = false;
  ExpertTraffic* expert_traffic = nullptr;
  // Set when the run starts at layer 0 and the store holds nothing yet: writes micro-batch b's
  // embedding (the store's index; bf16 [T_b, H]) to `out`. The placement embeds straight into
  // its pinned or device hidden states (through its stage for the latter), or into the store's
  // file when they stream from there, so that no file lies between the embedding and the GPU.
  std::function<void(size_t b, void* out)> embed = {};
  // gpu_layer_blobs' (indexed by layer), or nullptr: the placement plans its layers itself.
  const std::vector<LayerBlob>* layer_blobs = nullptr;
};

// "" when the GPU path can run this model; else why not.
std::string gpu_unsupported(const ModelConfig& config, const Checkpoint& ckpt);
// Starts reading the tensors of layers [first_layer, num_layers) into the page
// cache in the background (io/layer_reader.h PageWarmer), at most kWarmBytes ahead of the layer
// loop, so that the disk works while the run starts up and while the loop computes and writes;
// the caller keeps it until the run ends and hands it to the loop (GpuLoop::warm). nullptr when
// there is nothing to read.
inline constexpr uint64_t kWarmBytes = 8ull << 30;
std::unique_ptr<PageWarmer> gpu_warm_start(const Checkpoint& ckpt, const ModeloptExporter& exporter,
                                           int64_t first_layer, int64_t num_layers,
                                           const TestHooks& test = {});
// The device placement for layers [first_layer, num_layers): its plans made, its buffers
// allocated, the current hidden states in place. Throws strata::Error without CUDA.
std::unique_ptr<Placement> make_gpu_placement(GpuLoop& loop);

}  // namespace strata
