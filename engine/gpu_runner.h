// The decoder-layer loop of `strata quantize --device cuda` (docs/CUDA.md "The engine on the
// GPU"). run_quantize() prepares everything shared with the CPU path (plan, calibration tokens,
// embedding, activation store, exporter, resume manifest) and hands the layers to this loop:
//
//   read layer l+1 (LayerReader: merged preads into a pinned buffer, then one copy to the device
//   on a copy stream)   ||   layer l's forward on the device, chunk by chunk   ||   layer l-1
//   quantized and written by the CPU exporter on a writer thread
//
// Hidden states: resident on the device in bf16 (exact: the forward rounds them to bf16 between
// layers) when the whole store fits in --max_gpu_memory_gb beside two layers' weights and one
// chunk's working set; otherwise they stay in the host ActivationStore (in memory, or spilled to
// --offload_folder under --max_cpu_memory_gb, exactly as on the CPU path) and each chunk is
// copied in and out. A chunk is as many consecutive micro-batches as the working set allows.
// These choices, and one or two device buffers for layer weights, are engine/memory_plan.h's.
//
// Ranks (engine/gpu_ranks.h): with GpuLoop::comm of several ranks, each runs its own
// micro-batches on GPU local_rank mod devices; a layer is read once in total (each tensor by its
// writer, then broadcast, on the reader thread) and the statistics are combined over the ranks
// before the writer thread gets them.
//
// Resume: the same manifest steps as the CPU path. A step whose hidden states live only on the
// device (or only in memory) is recorded once it is durable: the hidden states are written to
// the resume folder when the checkpoint bytes read since the last record reach kResumeEvery
// times the store's size (always for small stores, so the fixtures record every layer; for a
// large calibration set writing them every layer would cost more than reading the weights).
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
#include "engine/options.h"
#include "engine/run_times.h"
#include "export/modelopt.h"
#include "export/plan.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "io/layer_reader.h"
#include "model/forward.h"

namespace strata {

// The part of the GPU setup that needs only the checkpoint's headers, started before the export
// head and the embedding (single process) so that it overlaps them: on a helper thread, the
// CUDA context is created and the loop's pinned host buffers are allocated (page-locking host
// memory costs about half a second per GiB): two layers' weights, and the hidden states' when
// a GPU memory cap leaves them no room on the device. run_layers_gpu takes over what fits its
// plan and allocates the rest itself.
struct GpuEarlySetup {
  std::future<void> done;
  uint64_t blob_bytes = 0;               // the largest layer's blob (weights[i] hold it)
  gpu::PinnedBuffer weights[2], hidden;  // hidden: empty when not allocated early
};
// nullptr without CUDA or without layers to run. store_bytes: the bf16 hidden states' size;
// host_fits: they may stay in host memory.
std::unique_ptr<GpuEarlySetup> gpu_early_setup(const ModelConfig& config, const Checkpoint& ckpt,
                                               int64_t first_layer, int64_t num_layers,
                                               uint64_t store_bytes, bool host_fits,
                                               uint64_t max_gpu_memory_bytes);

struct GpuLoop {
  const ModelConfig& config;
  const Checkpoint& ckpt;
  const QuantPlan& plan;
  ActivationStore& store;  // holds the inputs of first_layer
  const std::vector<Batch>& batches;
  ModeloptExporter& exporter;
  int64_t first_layer = 0;
  uint64_t max_gpu_memory_bytes = 0;  // 0: the device's free memory
  bool host_fits = true;              // the hidden states may be held in (pinned) host memory
  std::string resume_dir;
  GpuOptions gpu;  // QuantizeJob::gpu (engine/options.h)
  // Records step `next` as done (CPU path's commit): hidden = the file holding its inputs.
  std::function<void(int64_t next, const std::string& hidden, const std::string& old_input)> commit;
  std::function<void(const LayerReport&)> layer_done;
  // Ranks (engine/gpu_ranks.h): null or one rank, the single process. With several, `batches`
  // are this rank's micro-batches, store_ids[i] the store's index of batches[i].
  Comm* comm = nullptr;
  std::vector<size_t> store_ids;
  RunTimes* times = nullptr;       // the loop's parts and device_setup are added here
  PageWarmer* warm = nullptr;      // gpu_warm_start's, told of each layer read
  GpuEarlySetup* early = nullptr;  // gpu_early_setup's, taken over
  TestHooks test;                  // QuantizeJob::test: host store, fail rank, exchange thread
};

// A step's hidden states are made durable once the checkpoint bytes read since the last durable
// step reach kResumeEvery times their size: writing them costs at most 1/kResumeEvery of the
// reading, and a kill costs at most kResumeEvery times their size of reading again.
inline constexpr uint64_t kResumeEvery = 16;

// "" when the GPU path can run this model; else why not.
std::string gpu_unsupported(const ModelConfig& config, const Checkpoint& ckpt);
// Starts reading the tensors of layers [first_layer, num_layers), then the tail's, into the page
// cache in the background (io/layer_reader.h PageWarmer), at most kWarmBytes ahead of the layer
// loop, so that the disk works while the run starts up and while the loop computes and writes;
// the caller keeps it until the run ends and hands it to the loop (GpuLoop::warm). nullptr when
// there is nothing to read.
inline constexpr uint64_t kWarmBytes = 8ull << 30;
std::unique_ptr<PageWarmer> gpu_warm_start(const Checkpoint& ckpt, const ModeloptExporter& exporter,
                                           int64_t first_layer, int64_t num_layers);
// Runs layers [first_layer, num_layers). Throws strata::Error without CUDA.
void run_layers_gpu(GpuLoop& loop);

}  // namespace strata
