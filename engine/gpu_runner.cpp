#include "engine/gpu_runner.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
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
#include "engine/gpu_ranks.h"
#include "engine/memory_plan.h"
#include "engine/parallel.h"
#include "io/layer_reader.h"

#if STRATA_WITH_CUDA
#include "model/cuda/gpu_forward.h"
#include "model/groups.h"
#include "ops/cuda/convert.h"
#include "quant/cuda/quant_cuda.h"
#endif

namespace strata {

std::unique_ptr<PageWarmer> gpu_warm_start(const Checkpoint& ckpt, const ModeloptExporter& exporter,
                                           int64_t first_layer, int64_t num_layers) {
  LayerReader reader(ckpt);
  std::vector<LayerBlob> blobs;
  for (int64_t l = std::max<int64_t>(first_layer, 0); l <= num_layers; ++l)
    blobs.push_back(reader.plan(exporter.step_sources(l + 1)));  // the last: the tail's
  if (blobs.size() < 2) return nullptr;
  return std::make_unique<PageWarmer>(std::move(blobs), kWarmBytes);
}

#if !STRATA_WITH_CUDA

std::unique_ptr<GpuEarlySetup> gpu_early_setup(const ModelConfig&, const Checkpoint&, int64_t,
                                               int64_t, uint64_t, bool, uint64_t) {
  return nullptr;
}
std::string gpu_unsupported(const ModelConfig&, const Checkpoint&) {
  return "this strata was built without CUDA";
}
void run_layers_gpu(GpuLoop&) {
  fail("--device cuda: this strata was built without CUDA; use --device cpu");
}

#else

std::string gpu_unsupported(const ModelConfig& config, const Checkpoint& ckpt) {
  return gpu::GpuForward::unsupported(config, ckpt);
}

std::unique_ptr<GpuEarlySetup> gpu_early_setup(const ModelConfig& config, const Checkpoint& ckpt,
                                               int64_t first_layer, int64_t num_layers,
                                               uint64_t store_bytes, bool host_fits,
                                               uint64_t max_gpu_memory_bytes) {
  if (first_layer >= num_layers || cuda_device_count() == 0) return nullptr;
  auto early = std::make_unique<GpuEarlySetup>();
  LayerReader reader(ckpt);
  for (int64_t l = std::max<int64_t>(first_layer, 0); l < num_layers; ++l)
    early->blob_bytes = std::max(
        early->blob_bytes, reader.plan(gpu::GpuForward::layer_tensors(config, ckpt, l)).bytes);
  // The hidden states go to pinned host memory when two layers' weights and they exceed the
  // cap (the loop's own choice also counts its working set; a buffer it does not take is freed).
  const bool hidden = host_fits && max_gpu_memory_bytes > 0 &&
                      2 * early->blob_bytes + store_bytes > max_gpu_memory_bytes;
  GpuEarlySetup* e = early.get();
  early->done = std::async(std::launch::async, [e, hidden, store_bytes]() {
    set_cuda_device(0);
    gpu::cuda_memory_info();  // creates the context
    e->weights[0].reserve(e->blob_bytes);
    e->weights[1].reserve(e->blob_bytes);
    if (hidden) e->hidden.reserve(store_bytes);
  });
  return early;
}

namespace {

// Makes a written file durable (its dirty pages, through a fresh descriptor).
void fsync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  STRATA_CHECK(fd >= 0, path, ": cannot open to sync: ", std::strerror(errno));
  const bool ok = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  STRATA_CHECK(ok, path, ": fsync failed: ", std::strerror(err));
}

struct Pending {
  int64_t layer = -1;
  std::unique_ptr<MaxCalibrator> calib;
  std::unique_ptr<PrecomputedWeights> weights;          // quantized on the device
  std::future<std::pair<LayerReport, double> > report;  // and the writer's seconds
  bool durable = false;
  std::string hidden, old_input;
};

// Weight quantization on the device (the default; --gpu_quantize off leaves it to the CPU
// exporter): layer l's quantized modules encoded from its device blob with quant/cuda
// (bit-identical to the CPU encoders: the fused group's weight amax for NVFP4's weight_scale_2,
// the module's own amax for FP8) and copied back for the writer thread, which then only adds the
// activation scales and writes. It runs on a helper thread with its own stream while layer l's
// forward computes on the compute stream (both only read the blob), and needs no allocation per
// layer: the amax slots and one module's outputs (the arena) are reserved up front.
class DeviceQuantizer {
 public:
  // Groups every layer's quantized modules (amax slots: one per NVFP4 fused group, one per FP8
  // module); sizes the arena for the largest module's outputs. Only the modules `take` accepts
  // (with ranks, the ones this rank writes) are quantized here; so are none of a fused group with
  // a compressed source (an FP8-block weight in the blob): the CPU exporter decompresses and
  // quantizes those. The stream is on `device`.
  DeviceQuantizer(const QuantPlan& plan, int64_t first_layer, int device,
                  const std::function<bool(const PlannedModule&)>& take)
      : qs_(device) {
    layers_.resize(static_cast<size_t>(plan.num_layers));
    std::vector<std::map<std::string, int> > group_slot(layers_.size());
    std::set<std::string> compressed_groups;
    for (const PlannedModule& m : plan.modules) {
      if (m.source != SourceCompression::kNone) compressed_groups.insert(fused_group_key(m.module));
    }
    for (const PlannedModule& m : plan.modules) {
      if (m.layer < first_layer || m.layer >= plan.num_layers || m.format == QFormat::kNone ||
          compressed_groups.count(fused_group_key(m.module)) || !take(m))
        continue;
      Layer& L = layers_[static_cast<size_t>(m.layer)];
      const int64_t n = m.shape[0] * m.shape[1];
      int slot = -1;
      uint64_t out = 0;
      switch (m.format) {
        case QFormat::kNvfp4:
        case QFormat::kW4A16Nvfp4: {
          const std::string key = fused_group_key(m.module);
          auto [it, fresh] = group_slot[static_cast<size_t>(m.layer)].emplace(
              key, static_cast<int>(L.slots.size()));
          if (fresh) L.slots.emplace_back();
          slot = it->second;
          out = static_cast<uint64_t>(n / 2 + n / 16);
          break;
        }
        case QFormat::kFp8:
          slot = static_cast<int>(L.slots.size());
          L.slots.emplace_back();
          out = static_cast<uint64_t>(n);
          break;
        case QFormat::kMxfp8:
          out = static_cast<uint64_t>(n + n / 32);
          break;
        case QFormat::kNone:
          break;
      }
      if (m.format == QFormat::kFp8) L.slots[static_cast<size_t>(slot)].push_back(&m);
      L.jobs.push_back({&m, slot});
      arena_bytes_ = std::max(arena_bytes_, out);
      max_slots_ = std::max(max_slots_, L.slots.size());
    }
    // An NVFP4 group's amax covers every planned module of its fused group, quantized or not,
    // as the CPU exporter's does.
    for (const PlannedModule& m : plan.modules) {
      if (m.layer < first_layer || m.layer >= plan.num_layers) continue;
      const std::map<std::string, int>& g = group_slot[static_cast<size_t>(m.layer)];
      auto it = g.find(fused_group_key(m.module));
      if (it != g.end())
        layers_[static_cast<size_t>(m.layer)].slots[static_cast<size_t>(it->second)].push_back(&m);
    }
  }
  // Device bytes reserve() takes.
  uint64_t device_bytes() const { return arena_bytes_ + 4 * max_slots_ + 256; }
  void reserve(gpu::DeviceBudget& budget) {
    arena_ = gpu::DeviceBuffer(budget, std::max<uint64_t>(arena_bytes_, 1), "weight quantization");
    slots_ = gpu::DeviceBuffer(budget, 4 * std::max<uint64_t>(max_slots_, 1), "weight amaxes");
  }

  PrecomputedWeights quantize(int64_t l, const LayerBlob& blob, const uint8_t* dev) {
    namespace qc = strata::quant::cuda;
    const Layer& L = layers_[static_cast<size_t>(l)];
    PrecomputedWeights out;
    if (L.jobs.empty()) return out;
    auto weight = [&](const std::string& module) -> const LayerBlob::Item& {
      auto it = blob.items.find(module + ".weight");
      STRATA_ASSERT(it != blob.items.end(), "no blob item for ", module);
      return it->second;
    };
    // Every amax slot at once: one copy back for the layer.
    float* slots = slots_.as<float>();
    std::vector<float> amax(L.slots.size(), 0.0f);
    if (!amax.empty()) {
      strata::cuda::fill_zero(slots, amax.size() * 4, qs_);
      for (size_t s = 0; s < L.slots.size(); ++s) {
        for (const PlannedModule* o : L.slots[s]) {
          const LayerBlob::Item& it = weight(o->module);
          qc::weight_amax(dev + it.offset, it.dtype, shape_numel(it.shape), slots + s, qs_);
        }
      }
      strata::cuda::copy_to_host(amax.data(), slots, amax.size() * 4, qs_);
    }
    uint8_t* arena = arena_.as<uint8_t>();
    auto fetch = [&](const uint8_t* src, DType dtype, Shape shape) {
      Tensor t = Tensor::zeros(dtype, std::move(shape));
      strata::cuda::copy_to_host(t.mutable_bytes(), src, t.nbytes(), qs_);
      return t;
    };
    for (const Job& j : L.jobs) {
      const PlannedModule& m = *j.module;
      const LayerBlob::Item& it = weight(m.module);
      const void* w = dev + it.offset;
      const int64_t rows = m.shape[0], cols = m.shape[1];
      const std::string& M = m.module;
      QuantizedWeight& o = out[M];
      switch (m.format) {
        case QFormat::kNvfp4:
        case QFormat::kW4A16Nvfp4: {
          uint8_t* packed = arena;
          uint8_t* scales = arena + rows * cols / 2;
          const float ws2 = qc::nvfp4_quantize(
              w, it.dtype, rows, cols, amax[static_cast<size_t>(j.slot)], packed, scales, M, qs_);
          o.nvfp4 = Nvfp4Weight{fetch(packed, DType::kU8, {rows, cols / 2}),
                                fetch(scales, DType::kF8E4M3, {rows, cols / 16}),
                                Tensor::scalar_f32(ws2)};
          break;
        }
        case QFormat::kFp8: {
          const float ws = qc::fp8_quantize(w, it.dtype, rows * cols,
                                            amax[static_cast<size_t>(j.slot)], arena, M, qs_);
          o.fp8 = Fp8Weight{fetch(arena, DType::kF8E4M3, {rows, cols}), Tensor::scalar_f32(ws)};
          break;
        }
        case QFormat::kMxfp8: {
          uint8_t* scales = arena + rows * cols;
          qc::mxfp8_quantize(w, it.dtype, rows, cols, arena, scales, M, qs_);
          o.mxfp8 = Mxfp8Weight{fetch(arena, DType::kF8E4M3, {rows, cols}),
                                fetch(scales, DType::kU8, {rows, cols / 32})};
          break;
        }
        case QFormat::kNone:
          break;
      }
    }
    return out;
  }

 private:
  struct Job {
    const PlannedModule* module;
    int slot;  // its amax slot; -1 for MXFP8 (no amax)
  };
  struct Layer {
    std::vector<Job> jobs;                                  // plan order
    std::vector<std::vector<const PlannedModule*> > slots;  // slot -> the modules of its amax
  };
  std::vector<Layer> layers_;
  uint64_t arena_bytes_ = 0;
  size_t max_slots_ = 0;
  gpu::DeviceBuffer arena_, slots_;
  strata::cuda::Stream qs_;
};

}  // namespace

void run_layers_gpu(GpuLoop& loop) {
  STRATA_CHECK(cuda_device_count() > 0,
               "--device cuda: no CUDA device is visible; use --device "
               "cpu");
  RunTimes unused_times;
  RunTimes& times = loop.times ? *loop.times : unused_times;
  PhaseTimer setup;
  double setup_parts[4] = {0, 0, 0, 0};  // device and forward, plans, buffers, hidden states in
  const int64_t L = loop.plan.num_layers, H = loop.config.hidden_size;
  ActivationStore& store = loop.store;
  // Ranks (engine/gpu_ranks.h): this rank's GPU; ranks sharing one split its memory by default.
  Comm* comm = loop.comm && loop.comm->size() > 1 ? loop.comm : nullptr;
  const int device = comm ? gpu_rank_device(*comm, cuda_device_count()) : 0;
  set_cuda_device(device);
  uint64_t gpu_limit = loop.max_gpu_memory_bytes;
  if (comm && gpu_limit == 0)
    gpu_limit = gpu::cuda_memory_info().free / 20 * 19 /
                static_cast<uint64_t>(gpu_rank_sharers(*comm, cuda_device_count()));
  // The reader thread's own communicator, so that layer l+1's exchange overlaps layer l.
  // (--test_gpu_ranks_exchange main: none, the exchange on the main thread.)
  std::unique_ptr<ThreadChannel> channel =
      comm && !loop.test.gpu_exchange_on_main ? make_thread_channel(*comm) : nullptr;
  // The store's index of loop.batches[b].
  auto sid = [&](size_t b) { return loop.store_ids.empty() ? b : loop.store_ids[b]; };
  gpu::DeviceBudget budget(gpu_limit);
  gpu::Stream compute, copy;
  gpu::GpuForwardOptions fo;
  fo.gemm_bf16 = loop.gpu.gemm_bf16;
  fo.gemm_threads = loop.gpu.gemm_threads;
  fo.profile = loop.gpu.profile;
  fo.warp_attention = loop.gpu.warp_attention;
  gpu::GpuForward f(loop.config, loop.ckpt, budget, compute, fo);
  setup_parts[0] = setup.lap(&times.device_setup);
  LayerReader reader(loop.ckpt);

  // Every layer's read plan (headers only), and the largest buffers they need.
  std::vector<LayerBlob> blobs(static_cast<size_t>(L));
  std::vector<BlobShare> shares(static_cast<size_t>(L));
  uint64_t max_blob = 0, max_conv = 0;
  for (int64_t l = loop.first_layer; l < L; ++l) {
    blobs[l] = reader.plan(f.layer_tensors(l));
    if (comm) {
      // Each tensor read by the rank that writes it (rank 0 for one no step names).
      std::set<std::string> sources(loop.exporter.step_sources(l + 1).begin(),
                                    loop.exporter.step_sources(l + 1).end());
      shares[l] = plan_share(loop.ckpt, blobs[l], [&](const std::string& n) {
        return sources.count(n) ? loop.exporter.owner_of(n) : 0;
      });
    }
    max_blob = std::max(max_blob, blobs[l].bytes);
    max_conv = std::max(max_conv, f.converted_bytes(l, blobs[l]));
  }
  const LayerBlob tail = reader.plan(loop.exporter.step_sources(L + 1));
  // The budget: one or two layers' weights, converted weights, token metadata, then either the
  // whole store (resident) or two bf16 chunk buffers, then chunks (engine/memory_plan.h).
  STRATA_ASSERT(store.dtype() == DType::kBF16, "the GPU path keeps bf16 hidden states");
  int64_t longest_seq = 0;
  for (const Batch& b : loop.batches) {
    for (int64_t s = 0; s < b.n_seqs(); ++s)
      longest_seq = std::max(longest_seq, b.seq_offsets[s + 1] - b.seq_offsets[s]);
  }
  // Attention scores through GEMMs when one sequence's take at most an eighth of the budget.
  const uint64_t attention_cap = budget.limit() / 8;
  const uint64_t attention = f.attention_bytes(longest_seq, attention_cap);
  // Weights quantized on the device unless --gpu_quantize off (tests compare both with the CPU
  // exporter's bytes).
  std::unique_ptr<DeviceQuantizer> dq;
  if (loop.gpu.quantize)
    dq = std::make_unique<DeviceQuantizer>(
        loop.plan, loop.first_layer, device, [&](const PlannedModule& m) {
          return !comm || loop.exporter.owner_of(m.module + ".weight") == comm->rank();
        });
  // Two device buffers for layer weights let layer l+1 be copied in while layer l computes;
  // with one, the copy (a layer over the host link, tens of milliseconds) waits for layer l to
  // finish, and the memory of the second goes to larger chunks.
  GpuMemoryInputs mi;
  mi.left = budget.left();
  mi.max_blob = max_blob;
  mi.max_conv = max_conv;
  mi.attention = attention;
  mi.quantizer = dq ? dq->device_bytes() : 0;
  mi.forward_per_token = f.bytes_per_token();
  mi.hidden_size = H;
  for (const Batch& b : loop.batches)
    mi.batch_tokens.push_back(b.n_tokens());
  mi.host_fits = loop.host_fits;
  // Test hook (--test_gpu_host_store, tests/engine/CMakeLists.txt): hidden states in host
  // memory, one micro-batch per chunk, as a budget far below the store would make them on a
  // large run.
  mi.force_host = loop.test.gpu_host_store;
  mi.weight_buffers = loop.gpu.weight_buffers;
  const GpuMemoryPlan mp = plan_gpu_memory(mi);
  const int buffers = mp.buffers;
  const HiddenTier tier = mp.tier;
  const std::vector<PlannedChunk>& chunks = mp.chunks;
  const std::vector<int64_t>& token0 = mp.token0;  // tokens: micro-batches back to back
  const int64_t total = mp.total, largest = mp.largest, chunk_max = mp.chunk_max;
  const uint64_t store_bytes = mp.store_bytes, meta_bytes = mp.meta_bytes;

  setup_parts[1] = setup.lap(&times.device_setup);
  // Device allocations.
  gpu::DeviceBuffer weights[2];
  weights[0] = gpu::DeviceBuffer(budget, max_blob, "a layer's weights");
  if (buffers == 2) weights[1] = gpu::DeviceBuffer(budget, max_blob, "the next layer's weights");
  // Layer l's device copy.
  auto dev_weights = [&](int64_t l) -> gpu::DeviceBuffer& {
    return weights[buffers == 2 ? l % 2 : 0];
  };
  gpu::PinnedBuffer host_weights[2];
  gpu::PinnedBuffer hstore;  // kPinned: every micro-batch, bf16, back to back
  if (loop.early) {          // what gpu_early_setup allocated while the run started up
    loop.early->done.get();
    if (loop.early->blob_bytes >= max_blob) {
      host_weights[0] = std::move(loop.early->weights[0]);
      host_weights[1] = std::move(loop.early->weights[1]);
    }
    if (tier == HiddenTier::kPinned && loop.early->hidden.bytes() >= store_bytes)
      hstore = std::move(loop.early->hidden);
    loop.early->hidden = gpu::PinnedBuffer();
  }
  host_weights[0].reserve(max_blob);
  host_weights[1].reserve(max_blob);
  gpu::DeviceBuffer meta(budget, meta_bytes, "token positions");
  // Per chunk: its sequences' chunk-relative bounds (host) and where they start in `meta`.
  std::vector<std::vector<int64_t> > bounds(chunks.size());
  std::vector<int64_t> bounds_at(chunks.size());
  {
    std::vector<int64_t> m(meta_bytes / 8);
    int64_t at = 2 * total;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const PlannedChunk& c = chunks[i];
      bounds[i].push_back(0);
      for (size_t b = c.first; b < c.last; ++b) {
        const Batch& bt = loop.batches[b];
        for (int64_t s = 0; s < bt.n_seqs(); ++s) {
          for (int64_t t = bt.seq_offsets[s]; t < bt.seq_offsets[s + 1]; ++t) {
            const int64_t g = token0[b] + t;
            m[g] = bt.positions[t];
            m[total + g] = token0[b] - c.token0 + bt.seq_offsets[s];
          }
          bounds[i].push_back(token0[b] - c.token0 + bt.seq_offsets[s + 1]);
        }
      }
      bounds_at[i] = at;
      std::copy(bounds[i].begin(), bounds[i].end(), m.begin() + at);
      at += static_cast<int64_t>(bounds[i].size());
    }
    STRATA_ASSERT(static_cast<uint64_t>(at) * 8 <= meta_bytes, "token metadata");
    compute.copy_to_device(meta.data(), m.data(), m.size() * 8);
    compute.synchronize();
  }
  f.reserve(chunk_max, longest_seq, attention_cap);
  if (dq) dq->reserve(budget);
  const uint64_t chunk_bf16 = static_cast<uint64_t>(chunk_max * H) * 2;
  gpu::DeviceBuffer x(budget, chunk_bf16 * 2, "a chunk's hidden states");
  gpu::DeviceBuffer dstore, io[2];
  gpu::PinnedBuffer stage;  // kFile: one chunk; else one micro-batch (durable writes, the start)
  if (tier == HiddenTier::kDevice) {
    dstore = gpu::DeviceBuffer(budget, store_bytes, "the hidden states");
  } else {
    io[0] = gpu::DeviceBuffer(budget, chunk_bf16, "a chunk's inputs");
    io[1] = gpu::DeviceBuffer(budget, chunk_bf16, "the next chunk's inputs");
  }
  if (tier == HiddenTier::kPinned) hstore.reserve(store_bytes);
  stage.reserve(tier == HiddenTier::kFile ? chunk_bf16 : static_cast<uint64_t>(largest * H) * 2);
  setup_parts[2] = setup.lap(&times.device_setup);
  log_info("GPU: ", cuda_device_description(device), ", budget ", format_gib(budget.limit()),
           "; hidden states (", format_gib(store_bytes), ") ",
           tier == HiddenTier::kDevice   ? "resident on the device"
           : tier == HiddenTier::kPinned ? "in pinned host memory"
                                         : "streamed from --offload_folder",
           ", ", chunks.size(), " chunk(s) of up to ", chunk_max, " tokens; layer weights up to ",
           format_gib(max_blob), buffers == 2 ? " in two device buffers" : " in one device buffer",
           attention ? "; attention through batched GEMMs" : "",
           dq ? "; weights quantized on the device" : "; weights quantized by the CPU exporter");

  auto chunk_of = [&](size_t i) {
    gpu::GpuChunk g;
    g.tokens = chunks[i].tokens;
    g.positions = meta.as<int64_t>() + chunks[i].token0;
    g.seq_start = meta.as<int64_t>() + total + chunks[i].token0;
    g.seq_bounds = bounds[i];
    g.seq_bounds_dev = meta.as<int64_t>() + bounds_at[i];
    return g;
  };
  // Where micro-batch b's bf16 hidden states live on the device or in pinned memory.
  auto dev_at = [&](int64_t tok) { return dstore.as<uint16_t>() + tok * H; };
  auto host_at = [&](int64_t tok) { return reinterpret_cast<uint16_t*>(hstore.data()) + tok * H; };
  // The store's current inputs into the device or pinned tier.
  if (tier != HiddenTier::kFile) {
    for (size_t b = 0; b < loop.batches.size(); ++b) {
      const uint64_t n = store.batch_bytes(sid(b));
      if (tier == HiddenTier::kPinned) {
        store.read_raw(sid(b), host_at(token0[b]));
      } else {
        store.read_raw(sid(b), stage.data());
        compute.copy_to_device(dev_at(token0[b]), stage.data(), n);
        compute.synchronize();
      }
    }
  }
  // A durable step off the file tier: the outputs go to the store's next file.
  setup_parts[3] = setup.lap(&times.device_setup);
  log_info("GPU setup: device and forward ", str(setup_parts[0]).substr(0, 5), " s, plans ",
           str(setup_parts[1]).substr(0, 5), " s, buffers ", str(setup_parts[2]).substr(0, 5),
           " s, hidden states in ", str(setup_parts[3]).substr(0, 5), " s");
  auto write_store = [&](int64_t next) {
    store.begin(next);
    for (size_t b = 0; b < loop.batches.size(); ++b) {
      if (tier == HiddenTier::kPinned) {
        store.write_raw(sid(b), host_at(token0[b]));
      } else {
        compute.copy_to_host(stage.data(), dev_at(token0[b]), store.batch_bytes(sid(b)));
        compute.synchronize();
        store.write_raw(sid(b), stage.data());
      }
    }
  };

  // Layer l's weights: read into pinned memory, then (two device buffers) copied on the copy
  // stream; both on a helper thread, while the device computes the previous layer. With one
  // device buffer the copy waits for the previous layer at the top of the loop.
  auto fetch = [&](int64_t l) {
    return std::async(std::launch::async, [&, l]() {
      const int i = static_cast<int>(l % 2);
      if (comm) {  // this rank's share, then every rank's over the channel, then the copy
        read_share(loop.ckpt, shares[l], comm->rank(), host_weights[i].data());
        if (!channel) return;  // the exchange and the copy follow on the main thread
        set_cuda_device(device);
        exchange_share(*channel, shares[l], host_weights[i].data());
      } else {
        reader.read(blobs[l], host_weights[i].data());
        for (const auto& [n, item] : blobs[l].items)
          (void)loop.ckpt.tensor(n);  // read by this process (Checkpoint::bytes_read)
      }
      if (buffers == 1) return;
      copy.copy_to_device(dev_weights(l).data(), host_weights[i].data(), blobs[l].bytes);
      copy.synchronize();
    });
  };
  std::future<void> prefetch = fetch(loop.first_layer);
  Pending pending;
  PhaseTimer phase;                 // laps into `times` (the loop's parts)
  std::future<void> hidden_synced;  // the last durable step's hidden states reach the disk
  auto finish_pending = [&]() {
    if (pending.layer < 0) return;
    phase.lap(nullptr);
    const auto [r, busy] = pending.report.get();
    times.writer_busy += busy;
    if (hidden_synced.valid()) hidden_synced.get();
    phase.lap(&times.writer_wait);
    loop.layer_done(r);
    if (pending.durable) {
      loop.commit(pending.layer + 2, pending.hidden, pending.old_input);  // times its own part
    } else {
      loop.exporter.release_source(pending.layer + 1);
    }
    phase.lap(nullptr);
    pending = Pending{};
  };
  gpu::Stream h2d, d2h;
  gpu::Event in_ready[2], out_ready[2], io_free[2];
  uint64_t since_durable = 0;
  times.device_setup += setup.lap(nullptr);
  PhaseTimer loop_timer;
  for (int64_t l = loop.first_layer; l < L; ++l) {
    const bool last = l + 1 == L;
    phase.lap(nullptr);
    if (comm) test_fail_hook(*comm, l, loop.test);
    prefetch.get();
    const int hi = static_cast<int>(l % 2);
    // Without a reader thread's channel, every rank's share into every rank's buffer here.
    if (comm && !channel) exchange_share(*comm, shares[l], host_weights[hi].data());
    if (buffers == 1 || (comm && !channel)) {  // onto the GPU (layer l-1 is done with it)
      copy.copy_to_device(dev_weights(l).data(), host_weights[hi].data(), blobs[l].bytes);
      copy.synchronize();
    }
    if (loop.warm) loop.warm->advance();
    phase.lap(&times.read_wait);
    // Layer l's weights are quantized on a helper thread (own stream) while its forward runs.
    std::future<PrecomputedWeights> quantized;
    if (dq) {
      const LayerBlob* blob = &blobs[static_cast<size_t>(l)];
      const uint8_t* dev = dev_weights(l).as<uint8_t>();
      quantized = std::async(std::launch::async,
                             [&dq, l, blob, dev]() { return dq->quantize(l, *blob, dev); });
    }
    f.set_layer(l, blobs[l], dev_weights(l).data());
    // The next layer's buffer was last read by layer l-1 (forward and quantization), which
    // have finished (one buffer: its copy waits for layer l, at the top of the next step).
    compute.synchronize();
    if (!last) {
      prefetch = fetch(l + 1);
    } else if (tail.bytes > 0 && tail.bytes <= max_blob) {
      // The tensors after the layers (lm_head, final norm) read into the page cache while the
      // last layer computes, so that the exporter's tail step finds them there.
      prefetch =
          std::async(std::launch::async, [&]() { reader.read(tail, host_weights[L % 2].data()); });
    }
    since_durable += loop.exporter.source_bytes(l + 1);
    bool durable = last || tier == HiddenTier::kFile || since_durable >= kResumeEvery * store_bytes;
    if (comm) durable = any_rank(*comm, durable);  // ranks commit the same steps
    float* xf = x.as<float>();
    if (tier == HiddenTier::kFile && !last) store.begin(l + 2);
    // kPinned: chunk i+1 is copied in (h2d) and chunk i-1 out (d2h) while chunk i computes.
    auto copy_in = [&](size_t i) {
      const PlannedChunk& c = chunks[i];
      const int j = static_cast<int>(i % 2);
      io_free[j].wait(h2d);
      h2d.copy_to_device(io[j].data(), host_at(c.token0), static_cast<uint64_t>(c.tokens * H) * 2);
      in_ready[j].record(h2d);
    };
    if (tier == HiddenTier::kPinned) {
      for (int j = 0; j < 2; ++j)
        io_free[j].record(d2h);
      copy_in(0);
    }
    for (size_t i = 0; i < chunks.size(); ++i) {
      const PlannedChunk& c = chunks[i];
      const gpu::GpuChunk g = chunk_of(i);
      const int64_t n = c.tokens * H;
      const int j = static_cast<int>(i % 2);
      if (tier == HiddenTier::kDevice) {
        ops::cuda::bf16_to_f32(dev_at(c.token0), xf, n, compute.handle());
        f.forward(g, xf, true);
        if (!last) ops::cuda::cast_bf16(xf, dev_at(c.token0), n, compute.handle());
      } else if (tier == HiddenTier::kPinned) {
        if (i + 1 < chunks.size()) copy_in(i + 1);
        in_ready[j].wait(compute);
        ops::cuda::bf16_to_f32(io[j].as<uint16_t>(), xf, n, compute.handle());
        f.forward(g, xf, true);
        if (!last) ops::cuda::cast_bf16(xf, io[j].as<uint16_t>(), n, compute.handle());
        out_ready[j].record(compute);
        out_ready[j].wait(d2h);
        if (!last) d2h.copy_to_host(host_at(c.token0), io[j].data(), static_cast<uint64_t>(n) * 2);
        io_free[j].record(d2h);
      } else {
        for (size_t b = c.first; b < c.last; ++b)
          store.read_raw(sid(b), stage.data() + (token0[b] - c.token0) * H * 2);
        compute.copy_to_device(io[0].data(), stage.data(), static_cast<uint64_t>(n) * 2);
        compute.synchronize();  // the next chunk reuses `stage`
        ops::cuda::bf16_to_f32(io[0].as<uint16_t>(), xf, n, compute.handle());
        f.forward(g, xf, true);
        if (!last) {
          ops::cuda::cast_bf16(xf, io[0].as<uint16_t>(), n, compute.handle());
          compute.copy_to_host(stage.data(), io[0].data(), static_cast<uint64_t>(n) * 2);
          compute.synchronize();
          for (size_t b = c.first; b < c.last; ++b)
            store.write_raw(sid(b), stage.data() + (token0[b] - c.token0) * H * 2);
        }
      }
    }
    if (tier == HiddenTier::kPinned) d2h.synchronize();
    auto calib = std::make_unique<MaxCalibrator>();
    for (const gpu::AmaxStat& s : f.take_stats())
      calib->record(s.name, s.amax, s.rows);
    if (comm) allreduce_calibration(*comm, *calib);  // one process's statistics on every rank
    phase.lap(&times.compute);
    // Layer l-1's tensors are written (and synced) by now or soon; record it, then hand layer l
    // over. (Before this step's hidden states are written: the sync of the last durable ones
    // is waited for here.)
    finish_pending();
    std::string hidden, old_input;
    if (durable) {
      // The file the inputs were read from (the embedding's, or the last durable step's) goes
      // once this step is recorded.
      old_input = store.input_path();
      if (!last) {
        // Written here (the next layer overwrites the host copy); synced on a helper thread,
        // waited for before this step is recorded.
        if (tier != HiddenTier::kFile) write_store(l + 2);
        store.commit(loop.resume_dir, false);
        hidden = store.input_path();
        hidden_synced = std::async(std::launch::async, [hidden]() { fsync_file(hidden); });
        ++times.hidden_write_count;
      }
      since_durable = 0;
    }
    phase.lap(&times.hidden_writes);
    pending.layer = l;
    pending.calib = std::move(calib);
    pending.durable = durable;
    pending.hidden = hidden;
    pending.old_input = old_input;
    if (dq) pending.weights = std::make_unique<PrecomputedWeights>(quantized.get());
    phase.lap(&times.quantize);
    const MaxCalibrator* cp = pending.calib.get();
    const PrecomputedWeights* pw = pending.weights.get();
    // The writer thread quantizes what is left on the CPU, writes, and syncs its shards, so that
    // the step's commit finds them durable.
    pending.report = std::async(std::launch::async, [&loop, l, cp, pw]() {
      PhaseTimer busy;
      LayerReport r = loop.exporter.write_layer(l, *cp, pw);
      loop.exporter.sync();
      return std::make_pair(r, busy.lap(nullptr));
    });
  }
  finish_pending();
  if (prefetch.valid()) prefetch.get();
  times.layers += loop_timer.lap(nullptr);
  log_info("GPU: peak device memory ", format_gib(budget.peak()), " of ",
           format_gib(budget.limit()), "; waited ", str(times.read_wait).substr(0, 6),
           " s for weights, ", str(times.compute).substr(0, 6), " s computing");
}

#endif

}  // namespace strata
