#include "engine/gpu_runner.h"

#include <algorithm>
#include <future>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "calib/max_calib.h"
#include "core/device.h"
#include "core/error.h"
#include "core/gpu_memory.h"
#include "core/log.h"
#include "core/parallel.h"
#include "engine/gpu_ranks.h"
#include "engine/memory_plan.h"
#include "engine/parallel.h"
#include "engine/quantize_steps.h"
#include "engine/weight_quantizer.h"
#include "io/layer_reader.h"
#include "ops/cuda/amax.h"

#if STRATA_WITH_NCCL
#include "engine/nccl_comm.h"
#endif
#if STRATA_WITH_CUDA
#include "model/cuda/gpu_forward.h"
#include "ops/cuda/convert.h"
#include "ops/cuda/cuda_backend.h"
#include "ops/cuda/gemm.h"
#endif

namespace strata {

std::unique_ptr<PageWarmer> gpu_warm_start(const Checkpoint& ckpt, const ModeloptExporter& exporter,
                                           int64_t first_layer, int64_t num_layers,
                                           const TestHooks& test) {
  const LayerReader reader(ckpt);
  const int64_t first = std::max<int64_t>(first_layer, 0);
  // Layers first..num_layers-1, planned on the start-up threads.
  std::vector<LayerBlob> blobs(static_cast<size_t>(std::max<int64_t>(num_layers - first, 0)));
  parallel_chunks(blobs.size(), startup_threads(), 1, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i)
      blobs[i] = reader.plan(exporter.step_sources(first + static_cast<int64_t>(i) + 1));
  });
  if (blobs.size() < 2) return nullptr;
  // --test_gpu_read: another pattern (bench/read_bench), else the default.
  return std::make_unique<PageWarmer>(std::move(blobs), kWarmBytes, test.gpu_read);
}

uint64_t largest_blob(const std::vector<LayerBlob>& blobs, int64_t first_layer) {
  uint64_t most = 0;
  for (size_t l = static_cast<size_t>(std::max<int64_t>(first_layer, 0)); l < blobs.size(); ++l)
    most = std::max(most, blobs[l].bytes);
  return most;
}

#if !STRATA_WITH_CUDA

std::shared_future<void> gpu_library_preload(std::shared_future<int>) {
  return {};
}
std::unique_ptr<GpuEarlySetup> gpu_early_setup(int64_t, int64_t, uint64_t, uint64_t, bool,
                                               uint64_t) {
  return nullptr;
}
std::vector<LayerBlob> gpu_layer_blobs(const ModelConfig&, const Checkpoint&, int64_t) {
  return {};
}
std::string gpu_unsupported(const ModelConfig&, const Checkpoint&) {
  return "this strata was built without CUDA";
}
std::unique_ptr<Placement> make_gpu_placement(GpuLoop&) {
  fail("--device cuda: this strata was built without CUDA; use --device cpu");
}

#else

std::string gpu_unsupported(const ModelConfig& config, const Checkpoint& ckpt) {
  return gpu::GpuForward::unsupported(config, ckpt);
}

std::vector<LayerBlob> gpu_layer_blobs(const ModelConfig& config, const Checkpoint& ckpt,
                                       int64_t num_layers) {
  const std::vector<std::vector<std::string> > names =
      gpu::GpuForward::layer_tensors(config, ckpt, 0, num_layers);
  const LayerReader reader(ckpt);
  std::vector<LayerBlob> blobs(names.size());
  parallel_chunks(names.size(), startup_threads(), 1, [&](size_t begin, size_t end) {
    for (size_t l = begin; l < end; ++l)
      blobs[l] = reader.plan(names[l]);
  });
  return blobs;
}

std::shared_future<void> gpu_library_preload(std::shared_future<int> devices) {
  return std::async(std::launch::async,
                    [devices]() {
                      if ((devices.valid() ? devices.get() : cuda_device_count()) == 0) return;
                      try {
                        ops::cuda::gemm_library_load();
                      } catch (const Error&) {
                        // the GPU setup's own call loads it again and reports why it cannot
                      }
                    })
      .share();
}

std::unique_ptr<GpuEarlySetup> gpu_early_setup(int64_t first_layer, int64_t num_layers,
                                               uint64_t blob_bytes, uint64_t store_bytes,
                                               bool host_fits, uint64_t max_gpu_memory_bytes) {
  if (first_layer >= num_layers || cuda_device_count() == 0) return nullptr;
  auto early = std::make_unique<GpuEarlySetup>();
  early->blob_bytes = blob_bytes;
  // The hidden states go to pinned host memory when two layers' weights and they exceed the
  // cap (the loop's own choice also counts its working set; a buffer it does not take is freed).
  const bool hidden = host_fits && max_gpu_memory_bytes > 0 &&
                      2 * early->blob_bytes + store_bytes > max_gpu_memory_bytes;
  GpuEarlySetup* e = early.get();
  early->done = std::async(std::launch::async, [e, hidden, store_bytes]() {
    PhaseTimer t;
    set_cuda_device(0);
    gpu::cuda_memory_info();  // creates the context
    t.lap(&e->context);
    ops::cuda::gemm_library_load();
    t.lap(&e->libraries);
    e->weights[0].reserve(e->blob_bytes);
    e->weights[1].reserve(e->blob_bytes);
    if (hidden) e->hidden.reserve(store_bytes);
    t.lap(&e->pinned);
  });
  return early;
}

namespace {

// `b` after `a` in one buffer: b's items and ranges shifted to a 4096-aligned offset past a's.
void append_blob(LayerBlob& a, const LayerBlob& b) {
  const uint64_t shift = (a.bytes + 4095) / 4096 * 4096;
  for (auto [name, item] : b.items) {
    item.offset += shift;
    a.items.emplace(name, item);
  }
  for (LayerBlob::Range r : b.ranges) {
    r.buffer_offset += shift;
    a.ranges.push_back(r);
  }
  a.bytes = shift + b.bytes;
}

// The device's placement of the layer loop (engine/layer_loop.h): layer weights in one or two
// device buffers, read through pinned memory on a helper thread; hidden states on the device, in
// pinned host memory or in the store's files (engine/memory_plan.h), run chunk by chunk.
class DevicePlacement : public Placement {
 public:
  explicit DevicePlacement(GpuLoop& loop);
  void prefetch(int64_t l) override;
  void take(int64_t l) override;
  std::future<PrecomputedWeights> quantize(int64_t l) override;
  void forward(int64_t l, bool last, MaxCalibrator& calib) override;
  uint64_t hidden_bytes() const override { return mp_.store_bytes; }
  bool always_durable() const override { return mp_.tier == HiddenTier::kFile; }
  StepFiles end_step(int64_t next, bool durable) override;
  bool overlap_writer() const override { return true; }
  void finish() override;
  uint64_t pinned_bytes() const override {
    return host_weights_[0].bytes() + host_weights_[1].bytes() + stage_.bytes() +
           (quant_ ? quant_->staging_bytes() : 0);
  }
  uint64_t pinned_hidden_bytes() const override { return hstore_.bytes(); }

 private:
  // Setup, in order.
  void plan_layers();       // every layer's read plan (headers only) and the largest buffers
  void plan_memory();       // engine/memory_plan.h: buffers, tier, chunks
  void allocate();          // device and pinned buffers
  void upload_positions();  // every chunk's token positions and sequence bounds
  void load_hidden();       // the store's current inputs into the device or pinned tier

  // The store's index of batches[b].
  size_t sid(size_t b) const { return loop_.store_ids.empty() ? b : loop_.store_ids[b]; }
  // Layer l's device copy.
  gpu::DeviceBuffer& dev_weights(int64_t l) { return weights_[mp_.buffers == 2 ? l % 2 : 0]; }
  // Where the bf16 hidden states of token `tok` (micro-batches back to back) live.
  uint16_t* dev_at(int64_t tok) { return dstore_.as<uint16_t>() + tok * H_; }
  uint16_t* host_at(int64_t tok) { return reinterpret_cast<uint16_t*>(hstore_.data()) + tok * H_; }
  gpu::GpuChunk chunk(size_t i);
  void write_store(int64_t next);
  // Expert parallelism: the chunk counts of all ranks agreed (rounds_), and the exchanges'
  // traffic of a layer logged and added to the run's.
  void agree_rounds();
  void log_exchanges(int64_t l);

  GpuLoop& loop_;
  const int64_t L_, H_;
  Comm* comm_ = nullptr;  // several ranks, else null
  int device_ = 0;
  std::unique_ptr<ThreadChannel> channel_;
  std::unique_ptr<gpu::DeviceBudget> budget_;
  gpu::Stream compute_, copy_, h2d_, d2h_;
  std::unique_ptr<gpu::GpuForward> f_;
  std::unique_ptr<LayerReader> reader_;
  std::vector<LayerBlob> blobs_;
  std::vector<BlobShare> shares_;
  // Expert parallelism: the rows exchanged over NCCL; per layer this rank's own routed experts'
  // runs (read by it alone, after the shared part of the blob); every rank runs rounds_ chunks a
  // layer, empty ones past its own.
  bool ep_ = false;
  std::unique_ptr<DeviceExpertExchange> xchg_;
  std::vector<BlobShare> own_;
  size_t rounds_ = 0;
  uint64_t max_blob_ = 0, max_conv_ = 0, attention_cap_ = 0, attention_ = 0;
  uint64_t max_conv_deferred_ = 0, largest_deferred_ = 0;
  int64_t longest_seq_ = 0;
  // Weight quantization on the device (the default; --gpu_quantize off leaves it to the CPU
  // exporter), on a backend and stream of its own beside the forward (both only read the weights).
  std::unique_ptr<WeightQuantizer> dq_;
  // local_hessian (dq_->needs_hessians()): the calibrator of the last forward, whose input
  // statistics the layer's quantization reads once that forward has run.
  const MaxCalibrator* forward_calib_ = nullptr;
  gpu::Stream quant_stream_;
  std::unique_ptr<ops::CudaBackend> quant_;
  GpuMemoryPlan mp_;
  gpu::DeviceBuffer weights_[2], meta_, x_, dstore_, io_[2];
  gpu::PinnedBuffer host_weights_[2], hstore_, stage_;
  std::vector<std::vector<int64_t> > bounds_;   // per chunk: its sequences' bounds (host)
  std::vector<std::vector<int64_t> > seq_ids_;  // per chunk: its sequences' Batch::seq_ids
  std::vector<int64_t> bounds_at_;              // and where they start in meta_
  std::future<void> next_;
  gpu::Event in_ready_[2], out_ready_[2], io_free_[2];
};

DevicePlacement::DevicePlacement(GpuLoop& loop)
    : loop_(loop), L_(loop.plan.num_layers), H_(loop.config.hidden_size) {
  STRATA_CHECK(cuda_device_count() > 0,
               "--device cuda: no CUDA device is visible; use --device cpu");
  PhaseTimer setup;
  double parts[4] = {0, 0, 0, 0};  // device and forward, plans, buffers, hidden states in
  double device_part = 0;          // of parts[0]: the device chosen and its context
  // Ranks (engine/gpu_ranks.h): this rank's GPU; ranks sharing one split its memory by default.
  comm_ = loop.comm && loop.comm->size() > 1 ? loop.comm : nullptr;
  ep_ = comm_ && loop.expert_parallel;
  device_ = comm_ ? gpu_rank_device(*comm_, cuda_device_count()) : 0;
  set_cuda_device(device_);
  gpu::cuda_memory_info();  // the context (the early setup's, when it made it first)
  device_part = setup.lap(&parts[0]);
  uint64_t gpu_limit = loop.max_gpu_memory_bytes;
  if (comm_ && gpu_limit == 0)
    gpu_limit = gpu::cuda_memory_info().free / 20 * 19 /
                static_cast<uint64_t>(gpu_rank_sharers(*comm_, cuda_device_count()));
  // The reader thread's own communicator, so that layer l+1's exchange overlaps layer l.
  // (--test_gpu_ranks_exchange main: none, the exchange on the main thread.)
  if (comm_ && !loop.test.gpu_exchange_on_main) channel_ = make_thread_channel(*comm_);
  budget_ = std::make_unique<gpu::DeviceBudget>(gpu_limit);
  gpu::GpuForwardOptions fo;
  fo.gemm_bf16 = loop.gpu.gemm_bf16;
  fo.profile = loop.gpu.profile;
  fo.warp_attention = loop.gpu.warp_attention;
  fo.bf16_ops = loop.bf16_ops;
  fo.sequence_stats = kv_cache_affine(loop.plan.recipe.kv_cache);
  fo.hessian_bytes =
      local_hessian_device_bytes(loop.plan, loop.first_layer, loop.config.num_experts);
  static_assert(ops::cuda::kHistogramBins == kHeadroomBins);
  if (loop.plan.recipe.calibration == CalibrationMethod::kNvfp4ActHeadroom)
    fo.histogram_thresholds = headroom_thresholds();
  if (ep_) {
    fo.expert_rank = comm_->rank();
    fo.expert_ranks = comm_->size();
  }
  f_ = std::make_unique<gpu::GpuForward>(loop.config, loop.ckpt, *budget_, compute_, fo);
  if (ep_) {
#if STRATA_WITH_NCCL
    auto x = std::make_unique<NcclExpertExchange>(*comm_, device_);  // collective
    f_->set_expert_exchange(x.get());
    xchg_ = std::move(x);
#else
    fail("--expert_parallel on GPU ranks: this strata was built without NCCL; use --device cpu");
#endif
  }
  reader_ = std::make_unique<LayerReader>(loop.ckpt);
  setup.lap(&parts[0]);
  plan_layers();
  plan_memory();
  agree_rounds();
  parts[1] = setup.lap(nullptr);
  allocate();
  upload_positions();
  parts[2] = setup.lap(nullptr);
  const char* tier = mp_.tier == HiddenTier::kDevice   ? "resident on the device"
                     : mp_.tier == HiddenTier::kPinned ? "in pinned host memory"
                                                       : "streamed from --offload_folder";
  log_info("GPU: ", cuda_device_description(device_), ", budget ", format_gib(budget_->limit()),
           "; hidden states (", format_gib(mp_.store_bytes), ") ", tier, ", ", mp_.chunks.size(),
           " chunk(s) of up to ", mp_.chunk_max, " tokens",
           mp_.split ? str(" (sequences of a micro-batch: one micro-batch of ", mp_.largest,
                           " tokens does not fit beside a layer)")
                     : std::string(),
           "; layer weights up to ", format_gib(max_blob_),
           mp_.expert_slice > 0
               ? str(", routed experts decompressed ", mp_.expert_slice, " at a time")
               : std::string(),
           mp_.buffers == 2 ? " in two device buffers" : " in one device buffer",
           attention_ ? "; attention through batched GEMMs" : "",
           dq_ ? "; weights quantized on the device" : "; weights quantized by the CPU exporter");
  load_hidden();
  parts[3] = setup.lap(nullptr);
  const GpuEarlySetup* e = loop.early;
  log_info("GPU setup: device and forward ", str(parts[0]).substr(0, 5), " s (device ",
           str(device_part).substr(0, 5), " s), plans ", str(parts[1]).substr(0, 5), " s, buffers ",
           str(parts[2]).substr(0, 5), " s, hidden states in ", str(parts[3]).substr(0, 5), " s",
           e ? str("; on the early setup's thread: context ", format_double("%.3f", e->context),
                   " s, GEMM libraries ", format_double("%.3f", e->libraries),
                   " s, pinned buffers ", format_double("%.3f", e->pinned), " s")
             : std::string());
}

void DevicePlacement::plan_layers() {
  blobs_.resize(static_cast<size_t>(L_));
  shares_.resize(static_cast<size_t>(L_));
  own_.resize(static_cast<size_t>(L_));
  const int64_t E = loop_.config.num_experts;
  for (int64_t l = loop_.first_layer; l < L_; ++l) {
    // Expert parallelism: the routed experts of other ranks are not in this rank's blob, and
    // its own come after the part every rank holds.
    std::vector<std::string> names, own;
    for (const std::string& n : f_->layer_tensors(l)) {
      const int64_t e = ep_ ? routed_expert_of(n) : -1;
      if (e < 0 || e >= E) {
        names.push_back(n);
      } else if (expert_owner(e, E, comm_->size()) == comm_->rank()) {
        own.push_back(n);
      }
    }
    // The run's plan of the layer when every tensor of it is this rank's to read.
    const bool whole =
        !ep_ && loop_.layer_blobs && static_cast<size_t>(l) < loop_.layer_blobs->size();
    blobs_[l] = whole ? (*loop_.layer_blobs)[static_cast<size_t>(l)] : reader_->plan(names);
    if (comm_) {
      // Each tensor read by the rank that writes it (rank 0 for one no step names).
      std::set<std::string> sources(loop_.exporter.step_sources(l + 1).begin(),
                                    loop_.exporter.step_sources(l + 1).end());
      shares_[l] = plan_share(loop_.ckpt, blobs_[l], [&](const std::string& n) {
        return sources.count(n) ? loop_.exporter.owner_of(n) : 0;
      });
    }
    if (ep_) {
      append_blob(blobs_[l], reader_->plan(own));
      LayerBlob placed;  // the own items at their offsets in the blob, for their runs
      for (const std::string& n : own)
        placed.items.emplace(n, blobs_[l].items.at(n));
      const int me = comm_->rank();
      own_[l] = plan_share(loop_.ckpt, placed, [me](const std::string&) { return me; });
    }
    max_blob_ = std::max(max_blob_, blobs_[l].bytes);
  }
  // What each layer converts on the device, whole and with its routed experts deferred
  // (memory_plan.h "Slices"): a bind per layer and way, on the start-up threads (a Kimi-K2's
  // 61 layers of 1152 experts took most of a second in a row).
  const size_t first = static_cast<size_t>(loop_.first_layer), n = static_cast<size_t>(L_) - first;
  std::vector<uint64_t> conv(n), conv_deferred(n), largest(n);
  parallel_chunks(n, startup_threads(), 1, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const int64_t l = static_cast<int64_t>(first + i);
      conv[i] = f_->converted_bytes(l, blobs_[l]);
      conv_deferred[i] = f_->converted_bytes(l, blobs_[l], true, &largest[i]);
    }
  });
  for (size_t i = 0; i < n; ++i) {
    max_conv_ = std::max(max_conv_, conv[i]);
    max_conv_deferred_ = std::max(max_conv_deferred_, conv_deferred[i]);
    largest_deferred_ = std::max(largest_deferred_, largest[i]);
  }
}

void DevicePlacement::plan_memory() {
  // The budget: one or two layers' weights, converted weights, token metadata, then either the
  // whole store (resident) or two bf16 chunk buffers, then chunks (engine/memory_plan.h).
  STRATA_ASSERT(loop_.store.dtype() == DType::kBF16, "the GPU path keeps bf16 hidden states");
  for (const Batch& b : loop_.batches) {
    for (int64_t s = 0; s < b.n_seqs(); ++s)
      longest_seq_ = std::max(longest_seq_, b.seq_offsets[s + 1] - b.seq_offsets[s]);
  }
  // Attention scores through GEMMs when one sequence's take at most an eighth of the budget.
  attention_cap_ = budget_->limit() / 8;
  // Weights quantized on the device unless --gpu_quantize off (tests compare both with the CPU
  // exporter's bytes).
  if (loop_.gpu.quantize)
    dq_ = std::make_unique<WeightQuantizer>(
        loop_.plan, loop_.first_layer,
        [&](const PlannedModule& m) {
          return !comm_ || loop_.exporter.owner_of(m.module + ".weight") == comm_->rank();
        },
        // Compressed sources decompressed by the forward are quantized from there, unless
        // --exact_mxfp4 converts MXFP4 in closed form (the exporter's).
        !loop_.exact_mxfp4);
  // Two device buffers for layer weights let layer l+1 be copied in while layer l computes;
  // with one, the copy (a layer over the host link, tens of milliseconds) waits for layer l to
  // finish, and the memory of the second goes to larger chunks.
  GpuMemoryInputs mi;
  mi.left = budget_->left();
  mi.max_blob = max_blob_;
  mi.max_conv = max_conv_;
  attention_ = f_->attention_bytes(longest_seq_, attention_cap_);
  mi.attention = attention_;
  mi.quantizer = dq_ ? dq_->encoded_bytes() + 4 * static_cast<uint64_t>(dq_->max_groups()) + 256 +
                           dq_->hessian_bytes()
                     : 0;
  mi.forward_per_token = f_->bytes_per_token(longest_seq_);
  mi.hidden_size = H_;
  for (const Batch& b : loop_.batches) {
    mi.batch_tokens.push_back(b.n_tokens());
    std::vector<int64_t>& seqs = mi.seq_tokens.emplace_back();
    for (int64_t s = 0; s < b.n_seqs(); ++s)
      seqs.push_back(b.seq_offsets[s + 1] - b.seq_offsets[s]);
  }
  mi.limit = budget_->limit();
  mi.host_fits = loop_.host_fits;
  // Test hook (--test_gpu_host_store, tests/engine/CMakeLists.txt): hidden states in host
  // memory, one micro-batch per chunk, as a budget far below the store would make them on a
  // large run.
  mi.force_host = loop_.test.gpu_host_store;
  mi.force_split = loop_.test.gpu_split;
  // Routed experts decompressed in slices when a layer's do not fit at once (not with expert
  // parallelism, whose ranks hold a part of them each).
  if (!ep_) {
    mi.max_conv_deferred = max_conv_deferred_;
    mi.expert_slot = f_->expert_slot_bytes();
    mi.experts = loop_.config.num_experts;
    mi.quantizer_deferred = dq_ ? largest_deferred_ : 0;
    // Test hook (--test_gpu_expert_slice N): N experts a slice whatever the budget.
    mi.force_expert_slice = loop_.test.gpu_expert_slice;
  }
  mi.weight_buffers = loop_.gpu.weight_buffers;
  mp_ = plan_gpu_memory(mi);
}

void DevicePlacement::allocate() {
  gpu::DeviceBudget& budget = *budget_;
  f_->set_expert_slice(mp_.expert_slice);
  weights_[0] = gpu::DeviceBuffer(budget, max_blob_, "a layer's weights");
  if (mp_.buffers == 2)
    weights_[1] = gpu::DeviceBuffer(budget, max_blob_, "the next layer's weights");
  if (loop_.early) {  // what gpu_early_setup allocated while the run started up
    loop_.early->done.get();
    if (loop_.early->blob_bytes >= max_blob_) {
      host_weights_[0] = std::move(loop_.early->weights[0]);
      host_weights_[1] = std::move(loop_.early->weights[1]);
    }
    if (mp_.tier == HiddenTier::kPinned && loop_.early->hidden.bytes() >= mp_.store_bytes)
      hstore_ = std::move(loop_.early->hidden);
    loop_.early->hidden = gpu::PinnedBuffer();
  }
  host_weights_[0].reserve(max_blob_);
  host_weights_[1].reserve(max_blob_);
  meta_ = gpu::DeviceBuffer(budget, mp_.meta_bytes, "token positions");
  f_->reserve(mp_.chunk_max, longest_seq_, attention_cap_);
  if (dq_) {
    quant_ = std::make_unique<ops::CudaBackend>(budget, quant_stream_, ops::CudaBackendOptions{},
                                                std::max<int64_t>(dq_->max_groups(), 1), 0);
    quant_->reserve_scratch(std::max<uint64_t>(dq_->encoded_bytes(), 1));
    if (mp_.expert_slice > 0) quant_->reserve_decompression(largest_deferred_);
    if (dq_->needs_hessians()) quant_->reserve_hessian(dq_->hessian_bytes());
    quant_->use_for_quantization(device_);
  }
  const uint64_t chunk_bf16 = static_cast<uint64_t>(mp_.chunk_max * H_) * 2;
  x_ = gpu::DeviceBuffer(budget, chunk_bf16 * 2, "a chunk's hidden states");
  if (mp_.tier == HiddenTier::kDevice) {
    dstore_ = gpu::DeviceBuffer(budget, mp_.store_bytes, "the hidden states");
  } else {
    io_[0] = gpu::DeviceBuffer(budget, chunk_bf16, "a chunk's inputs");
    io_[1] = gpu::DeviceBuffer(budget, chunk_bf16, "the next chunk's inputs");
  }
  if (mp_.tier == HiddenTier::kPinned) hstore_.reserve(mp_.store_bytes);
  // One micro-batch: the file tier's chunks pass through it a micro-batch at a time; the other
  // tiers' durable writes and the start.
  stage_.reserve(static_cast<uint64_t>(mp_.largest * H_) * 2);
}

void DevicePlacement::upload_positions() {
  // meta_: positions [total], each token's sequence start in its chunk [total], then per chunk
  // its sequences' chunk-relative bounds.
  const std::vector<PlannedChunk>& chunks = mp_.chunks;
  const int64_t total = mp_.total;
  bounds_.assign(chunks.size(), {});
  seq_ids_.assign(chunks.size(), {});
  bounds_at_.assign(chunks.size(), 0);
  std::vector<int64_t> m(mp_.meta_bytes / 8);
  int64_t at = 2 * total;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const PlannedChunk& c = chunks[i];
    bounds_[i].push_back(0);
    for (size_t b = c.first; b < c.last; ++b) {
      const Batch& bt = loop_.batches[b];
      const int64_t t0 = mp_.token0[b];
      for (int64_t s = 0; s < bt.n_seqs(); ++s) {
        const int64_t g0 = t0 + bt.seq_offsets[s];
        if (g0 < c.token0 || g0 >= c.token0 + c.tokens) continue;  // another chunk's (split)
        for (int64_t t = bt.seq_offsets[s]; t < bt.seq_offsets[s + 1]; ++t) {
          const int64_t g = t0 + t;
          m[g] = bt.positions[t];
          m[total + g] = t0 - c.token0 + bt.seq_offsets[s];
        }
        bounds_[i].push_back(t0 - c.token0 + bt.seq_offsets[s + 1]);
        seq_ids_[i].push_back(bt.seq_ids[static_cast<size_t>(s)]);
      }
    }
    bounds_at_[i] = at;
    std::copy(bounds_[i].begin(), bounds_[i].end(), m.begin() + at);
    at += static_cast<int64_t>(bounds_[i].size());
  }
  STRATA_ASSERT(static_cast<uint64_t>(at) * 8 <= mp_.meta_bytes, "token metadata");
  compute_.copy_to_device(meta_.data(), m.data(), m.size() * 8);
  compute_.synchronize();
}

void DevicePlacement::load_hidden() {
  ActivationStore& store = loop_.store;
  const bool embed = static_cast<bool>(loop_.embed);  // layer 0's inputs are made here
  if (mp_.tier == HiddenTier::kFile) {
    if (!embed) return;
    store.begin(1);
    for (size_t b = 0; b < loop_.batches.size(); ++b) {
      loop_.embed(sid(b), stage_.data());
      store.write_raw(sid(b), stage_.data());
    }
    store.commit(loop_.resume_dir, false);
    return;
  }
  // Micro-batch b's inputs into `dst`: embedded, or as the store holds them.
  auto fill = [&](size_t b, void* dst) {
    if (embed) {
      loop_.embed(sid(b), dst);
    } else {
      store.read_raw(sid(b), dst);
    }
  };
  for (size_t b = 0; b < loop_.batches.size(); ++b) {
    const int64_t tok = mp_.token0[b];
    if (mp_.tier == HiddenTier::kPinned) {
      fill(b, host_at(tok));
    } else {
      fill(b, stage_.data());
      compute_.copy_to_device(dev_at(tok), stage_.data(), store.batch_bytes(sid(b)));
      compute_.synchronize();
    }
  }
}

gpu::GpuChunk DevicePlacement::chunk(size_t i) {
  const PlannedChunk& c = mp_.chunks[i];
  gpu::GpuChunk g;
  g.tokens = c.tokens;
  g.positions = meta_.as<int64_t>() + c.token0;
  g.seq_start = meta_.as<int64_t>() + mp_.total + c.token0;
  g.seq_bounds = bounds_[i];
  g.seq_ids = seq_ids_[i];
  g.seq_bounds_dev = meta_.as<int64_t>() + bounds_at_[i];
  return g;
}

void DevicePlacement::prefetch(int64_t l) {
  // Layer l's weights: read into pinned memory, then (two device buffers) copied on the copy
  // stream; both on a helper thread, while the device computes the previous layer. With one
  // device buffer the copy waits for the previous layer (take()).
  next_ = std::async(std::launch::async, [this, l]() {
    uint8_t* host = host_weights_[l % 2].data();
    if (comm_) {  // this rank's share, then every rank's over the channel, then the copy
      read_share(loop_.ckpt, shares_[l], comm_->rank(), host);
      if (ep_) read_share(loop_.ckpt, own_[l], comm_->rank(), host);  // never broadcast
      if (!channel_) return;  // the exchange and the copy follow on the main thread
      set_cuda_device(device_);
      exchange_share(*channel_, shares_[l], host);
    } else {
      // The warmer reads the layer first, this read copies it (ReadPattern::consumer_waits;
      // --test_gpu_read ...:nowait reads beside it).
      if (loop_.warm && loop_.test.gpu_read.consumer_waits)
        loop_.warm->wait_read(static_cast<size_t>(l - loop_.first_layer));
      reader_->read(blobs_[l], host);
      for (const auto& [n, item] : blobs_[l].items)
        (void)loop_.ckpt.tensor(n);  // read by this process (Checkpoint::bytes_read)
    }
    if (mp_.buffers == 1) return;
    copy_.copy_to_device(dev_weights(l).data(), host, blobs_[l].bytes);
    copy_.synchronize();
  });
}

void DevicePlacement::take(int64_t l) {
  next_.get();
  uint8_t* host = host_weights_[l % 2].data();
  // Without a reader thread's channel, every rank's share into every rank's buffer here.
  if (comm_ && !channel_) exchange_share(*comm_, shares_[l], host);
  if (mp_.buffers == 1 || (comm_ && !channel_)) {  // onto the GPU (layer l-1 is done with it)
    copy_.copy_to_device(dev_weights(l).data(), host, blobs_[l].bytes);
    copy_.synchronize();
  }
  if (loop_.warm) loop_.warm->advance();
  f_->set_layer(l, blobs_[l], dev_weights(l).data());
  // The next layer's buffer was last read by layer l-1 (forward and quantization), which have
  // finished (one buffer: its copy waits for layer l, at the top of the next step).
  compute_.synchronize();
}

std::future<PrecomputedWeights> DevicePlacement::quantize(int64_t l) {
  if (!dq_) return {};
  const LayerBlob* blob = &blobs_[static_cast<size_t>(l)];
  const uint8_t* dev = dev_weights(l).as<uint8_t>();
  auto run = [this, l, blob, dev]() {
    const MaxCalibrator* calib = dq_->needs_hessians() ? forward_calib_ : nullptr;
    return dq_->quantize(
        l, *quant_,
        [&](const std::string& module) {
          // A compressed source's weight as the forward decompressed it, else as stored.
          if (const ops::StoredWeight* d = f_->decompressed_weight(module + ".weight")) return *d;
          auto it = blob->items.find(module + ".weight");
          STRATA_ASSERT(it != blob->items.end(), "no blob item for ", module);
          const LayerBlob::Item& item = it->second;
          return ops::StoredWeight{dev + item.offset, item.dtype, item.shape[0],
                                   shape_numel(item.shape) / item.shape[0]};
        },
        [&](const std::string& module) {
          const BlockHessian* h = calib ? calib->hessian(module) : nullptr;
          return h ? h->normalized() : std::vector<double>{};
        });
  };
  // local_hessian: when the loop takes the result, after the layer's forward has gathered the
  // statistics (a deferred task: if the forward fails, it never runs).
  if (dq_->needs_hessians()) return std::async(std::launch::deferred, run);
  // On a helper thread while the layer's forward runs.
  return std::async(std::launch::async, run);
}

void DevicePlacement::forward(int64_t l, bool last, MaxCalibrator& calib) {
  ActivationStore& store = loop_.store;
  const std::vector<PlannedChunk>& chunks = mp_.chunks;
  const HiddenTier tier = mp_.tier;
  float* xf = x_.as<float>();
  if (tier == HiddenTier::kFile && !last) store.begin(l + 2);
  f_->track_hessians(calib.hessian_names());  // local_hessian's (empty: none)
  forward_calib_ = nullptr;
  // kPinned: chunk i+1 is copied in (h2d) and chunk i-1 out (d2h) while chunk i computes.
  auto copy_in = [&](size_t i) {
    const PlannedChunk& c = chunks[i];
    const int j = static_cast<int>(i % 2);
    io_free_[j].wait(h2d_);
    h2d_.copy_to_device(io_[j].data(), host_at(c.token0), static_cast<uint64_t>(c.tokens * H_) * 2);
    in_ready_[j].record(h2d_);
  };
  if (tier == HiddenTier::kPinned && !chunks.empty()) {
    for (int j = 0; j < 2; ++j)
      io_free_[j].record(d2h_);
    copy_in(0);
  }
  // Expert parallelism: every rank runs rounds_ chunks (the MoE exchanges are collective), an
  // empty one past its own.
  for (size_t i = 0; i < std::max(chunks.size(), rounds_); ++i) {
    if (i >= chunks.size()) {
      gpu::GpuChunk none;
      none.seq_bounds = {0};
      f_->forward(none, xf, true);
      continue;
    }
    const PlannedChunk& c = chunks[i];
    const gpu::GpuChunk g = chunk(i);
    const int64_t n = c.tokens * H_;
    const int j = static_cast<int>(i % 2);
    if (tier == HiddenTier::kDevice) {
      ops::cuda::bf16_to_f32(dev_at(c.token0), xf, n, compute_.handle());
      f_->forward(g, xf, true);
      if (!last) ops::cuda::cast_bf16(xf, dev_at(c.token0), n, compute_.handle());
    } else if (tier == HiddenTier::kPinned) {
      if (i + 1 < chunks.size()) copy_in(i + 1);
      in_ready_[j].wait(compute_);
      ops::cuda::bf16_to_f32(io_[j].as<uint16_t>(), xf, n, compute_.handle());
      f_->forward(g, xf, true);
      if (!last) ops::cuda::cast_bf16(xf, io_[j].as<uint16_t>(), n, compute_.handle());
      out_ready_[j].record(compute_);
      out_ready_[j].wait(d2h_);
      if (!last) d2h_.copy_to_host(host_at(c.token0), io_[j].data(), static_cast<uint64_t>(n) * 2);
      io_free_[j].record(d2h_);
    } else if (mp_.split) {
      // A chunk of sequences of micro-batch b: the stage holds b from its first chunk, each
      // chunk's outputs replace its inputs there, and b is written after its last chunk.
      const size_t b = c.first;
      uint8_t* stage = stage_.data();
      uint8_t* in = io_[0].as<uint8_t>();
      const uint64_t off = static_cast<uint64_t>((c.token0 - mp_.token0[b]) * H_) * 2;
      if (c.token0 == mp_.token0[b]) store.read_raw(sid(b), stage);
      compute_.copy_to_device(in, stage + off, static_cast<uint64_t>(n) * 2);
      compute_.synchronize();
      ops::cuda::bf16_to_f32(io_[0].as<uint16_t>(), xf, n, compute_.handle());
      f_->forward(g, xf, true);
      if (!last) {
        ops::cuda::cast_bf16(xf, io_[0].as<uint16_t>(), n, compute_.handle());
        compute_.copy_to_host(stage + off, in, static_cast<uint64_t>(n) * 2);
        compute_.synchronize();
        if (c.token0 + c.tokens == mp_.token0[b + 1]) store.write_raw(sid(b), stage);
      }
    } else {
      // Through the stage one micro-batch at a time: the host holds one micro-batch of the
      // spilled store, as on the CPU path (the memory bound's `pinned`), however large the chunk.
      uint8_t* stage = stage_.data();
      uint8_t* in = io_[0].as<uint8_t>();
      auto at = [&](size_t b) { return (mp_.token0[b] - c.token0) * H_ * 2; };
      auto bytes = [&](size_t b) {
        return static_cast<uint64_t>((mp_.token0[b + 1] - mp_.token0[b]) * H_) * 2;
      };
      for (size_t b = c.first; b < c.last; ++b) {
        store.read_raw(sid(b), stage);
        compute_.copy_to_device(in + at(b), stage, bytes(b));
        compute_.synchronize();  // the next micro-batch reuses the stage
      }
      ops::cuda::bf16_to_f32(io_[0].as<uint16_t>(), xf, n, compute_.handle());
      f_->forward(g, xf, true);
      if (!last) {
        ops::cuda::cast_bf16(xf, io_[0].as<uint16_t>(), n, compute_.handle());
        for (size_t b = c.first; b < c.last; ++b) {
          compute_.copy_to_host(stage, in + at(b), bytes(b));
          compute_.synchronize();
          store.write_raw(sid(b), stage);
        }
      }
    }
  }
  if (tier == HiddenTier::kPinned) d2h_.synchronize();
  for (const gpu::AmaxStat& s : f_->take_stats())
    calib.record(s.name, s.amax, s.rows, s.hist);
  for (const gpu::HessianStats& h : f_->take_hessians()) {
    for (const std::string& n : h.names)
      calib.record_hessian(n, h.cols, h.sums, h.rows);
  }
  forward_calib_ = &calib;
  for (gpu::SequenceStats& s : f_->take_sequence_stats()) {
    MaxCalibrator::SequenceStat q;
    q.tokens = s.tokens;
    q.sum = std::move(s.sum);
    q.max = std::move(s.max);
    q.min = std::move(s.min);
    calib.record_sequence(s.name, s.seq_id, s.layout, std::move(q));
  }
  if (ep_) log_exchanges(l);
}

void DevicePlacement::agree_rounds() {
  rounds_ = mp_.chunks.size();
  if (!ep_) return;
  std::vector<uint64_t> n(static_cast<size_t>(comm_->size()), 0);
  n[static_cast<size_t>(comm_->rank())] = mp_.chunks.size();
  comm_->allreduce_sum(n.data(), n.size());
  rounds_ = static_cast<size_t>(*std::max_element(n.begin(), n.end()));
}

void DevicePlacement::log_exchanges(int64_t l) {
#if STRATA_WITH_NCCL
  const NcclExpertExchange::Layer t = static_cast<NcclExpertExchange&>(*xchg_).take_layer();
  log_info("expert all-to-all: layer ", l, ": sent ", t.bytes_sent, " bytes, received ",
           t.bytes_received, " bytes (other ranks), ", t.exchanges, " exchanges in ",
           str(t.device_ms).substr(0, 7), " ms on the device (NCCL), counts ",
           str(t.counts_ms).substr(0, 7), " ms on the host");
  if (loop_.expert_traffic) {
    loop_.expert_traffic->bytes_sent += t.bytes_sent;
    loop_.expert_traffic->seconds += (t.device_ms + t.counts_ms) / 1000.0;
  }
#else
  (void)l;
#endif
}

void DevicePlacement::write_store(int64_t next) {
  ActivationStore& store = loop_.store;
  store.begin(next);
  for (size_t b = 0; b < loop_.batches.size(); ++b) {
    const int64_t tok = mp_.token0[b];
    if (mp_.tier == HiddenTier::kPinned) {
      store.write_raw(sid(b), host_at(tok));
    } else {
      compute_.copy_to_host(stage_.data(), dev_at(tok), store.batch_bytes(sid(b)));
      compute_.synchronize();
      store.write_raw(sid(b), stage_.data());
    }
  }
}

StepFiles DevicePlacement::end_step(int64_t next, bool durable) {
  // The outputs stay where they are; a durable step's are written to the store's next file
  // (the file tier's already are) and synced on a helper thread.
  StepFiles files;
  if (!durable) return files;
  if (mp_.tier != HiddenTier::kFile) write_store(next);
  loop_.store.commit(loop_.resume_dir, false);
  files.hidden = loop_.store.input_path();
  std::string hidden = files.hidden;
  files.synced = std::async(std::launch::async, [hidden]() { fsync_file(hidden); });
  return files;
}

void DevicePlacement::finish() {
  if (next_.valid()) next_.get();
  log_info("GPU: peak device memory ", format_gib(budget_->peak()), " of ",
           format_gib(budget_->limit()));
  if (loop_.times)
    log_info("GPU: waited ", str(loop_.times->read_wait).substr(0, 6), " s for weights, ",
             str(loop_.times->compute).substr(0, 6), " s computing");
}

}  // namespace

std::unique_ptr<Placement> make_gpu_placement(GpuLoop& loop) {
  return std::make_unique<DevicePlacement>(loop);
}

#endif

}  // namespace strata
