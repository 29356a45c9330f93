#include "engine/gpu_runner.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>
#include <set>

#include "calib/max_calib.h"
#include "core/device.h"
#include "core/error.h"
#include "core/gpu_memory.h"
#include "core/log.h"
#include "engine/gpu_ranks.h"
#include "engine/parallel.h"
#include "io/layer_reader.h"

#if STRATA_WITH_CUDA
#include "model/cuda/gpu_forward.h"
#include "model/cuda/kernels.h"
#include "model/groups.h"
#include "quant/cuda/quant_cuda.h"
#endif

namespace strata {

#if !STRATA_WITH_CUDA

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

namespace {

std::string gib(uint64_t b) {
  return str(static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0)).substr(0, 6) + " GiB";
}

struct Chunk {
  size_t first, last;  // micro-batches [first, last)
  int64_t token0 = 0, tokens = 0;
};

struct Pending {
  int64_t layer = -1;
  std::unique_ptr<MaxCalibrator> calib;
  std::unique_ptr<PrecomputedWeights> weights;  // STRATA_GPU_QUANTIZE
  std::future<LayerReport> report;
  bool durable = false;
  std::string hidden, old_input;
};

// STRATA_GPU_QUANTIZE=1 (experimental, off by default until tests/engine/gpu_vs_cpu_test.sh has
// passed with it on a GPU): layer l's quantized weights made on the device from its blob with
// quant/cuda (bit-identical to the CPU encoders: the fused group's weight amax for NVFP4's
// weight_scale_2, the module's own amax for FP8), copied back for the writer thread, so that
// the CPU exporter only adds the activation scales and writes.
PrecomputedWeights quantize_on_device(const QuantPlan& plan, int64_t l, const LayerBlob& blob,
                                      const uint8_t* dev, gpu::DeviceBudget& budget,
                                      strata::cuda::Stream& qs,
                                      const std::function<bool(const std::string&)>& mine) {
  namespace qc = strata::quant::cuda;
  PrecomputedWeights out;
  gpu::DeviceBuffer slot(budget, 4, "a weight amax");
  auto weight = [&](const std::string& module) -> const LayerBlob::Item& {
    auto it = blob.items.find(module + ".weight");
    STRATA_ASSERT(it != blob.items.end(), "no blob item for ", module);
    return it->second;
  };
  auto amax_of = [&](const std::vector<const PlannedModule*>& mods) {
    strata::cuda::fill_zero(slot.data(), 4, qs);
    for (const PlannedModule* o : mods) {
      const LayerBlob::Item& it = weight(o->module);
      qc::weight_amax(dev + it.offset, it.dtype, shape_numel(it.shape), slot.as<float>(), qs);
    }
    float a = 0.0f;
    strata::cuda::copy_to_host(&a, slot.data(), 4, qs);
    return a;
  };
  auto fetch = [&](const gpu::DeviceBuffer& b, DType dtype, Shape shape) {
    Tensor t = Tensor::zeros(dtype, std::move(shape));
    strata::cuda::copy_to_host(t.mutable_bytes(), b.data(), t.nbytes(), qs);
    return t;
  };
  std::vector<const PlannedModule*> layer;
  for (const PlannedModule& m : plan.modules)
    if (m.layer == l) layer.push_back(&m);
  std::map<std::string, float> group_amax;
  for (const PlannedModule* m : layer) {
    if (m->format == QFormat::kNone || !mine(m->module + ".weight")) continue;
    const LayerBlob::Item& it = weight(m->module);
    const void* w = dev + it.offset;
    const int64_t rows = m->shape[0], cols = m->shape[1];
    const std::string& M = m->module;
    std::vector<std::pair<std::string, Tensor> >& o = out[M];
    switch (m->format) {
      case QFormat::kNvfp4:
      case QFormat::kW4A16Nvfp4: {
        const std::string key = fused_group_key(M);
        auto g = group_amax.find(key);
        if (g == group_amax.end()) {
          std::vector<const PlannedModule*> members;
          for (const PlannedModule* x : layer)
            if (fused_group_key(x->module) == key) members.push_back(x);
          g = group_amax.emplace(key, amax_of(members)).first;
        }
        gpu::DeviceBuffer packed(budget, static_cast<uint64_t>(rows * cols / 2), "NVFP4 codes");
        gpu::DeviceBuffer scales(budget, static_cast<uint64_t>(rows * cols / 16), "NVFP4 scales");
        const float ws2 = qc::nvfp4_quantize(w, it.dtype, rows, cols, g->second,
                                             packed.as<uint8_t>(), scales.as<uint8_t>(), M, qs);
        o.emplace_back(M + ".weight", fetch(packed, DType::kU8, {rows, cols / 2}));
        o.emplace_back(M + ".weight_scale", fetch(scales, DType::kF8E4M3, {rows, cols / 16}));
        o.emplace_back(M + ".weight_scale_2", Tensor::scalar_f32(ws2));
        break;
      }
      case QFormat::kFp8: {
        const float a = amax_of({m});
        gpu::DeviceBuffer q(budget, static_cast<uint64_t>(rows * cols), "FP8 weights");
        const float ws = qc::fp8_quantize(w, it.dtype, rows * cols, a, q.as<uint8_t>(), M, qs);
        o.emplace_back(M + ".weight", fetch(q, DType::kF8E4M3, {rows, cols}));
        o.emplace_back(M + ".weight_scale", Tensor::scalar_f32(ws));
        break;
      }
      case QFormat::kMxfp8: {
        gpu::DeviceBuffer q(budget, static_cast<uint64_t>(rows * cols), "MXFP8 weights");
        gpu::DeviceBuffer sc(budget, static_cast<uint64_t>(rows * cols / 32), "MXFP8 scales");
        qc::mxfp8_quantize(w, it.dtype, rows, cols, q.as<uint8_t>(), sc.as<uint8_t>(), M, qs);
        o.emplace_back(M + ".weight", fetch(q, DType::kF8E4M3, {rows, cols}));
        o.emplace_back(M + ".weight_scale", fetch(sc, DType::kU8, {rows, cols / 32}));
        break;
      }
      case QFormat::kNone:
        break;
    }
  }
  return out;
}

}  // namespace

void run_layers_gpu(GpuLoop& loop) {
  STRATA_CHECK(cuda_device_count() > 0,
               "--device cuda: no CUDA device is visible; use --device "
               "cpu");
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
  std::unique_ptr<ThreadChannel> channel = comm ? make_thread_channel(*comm) : nullptr;
  // The store's index of loop.batches[b].
  auto sid = [&](size_t b) { return loop.store_ids.empty() ? b : loop.store_ids[b]; };
  gpu::DeviceBudget budget(gpu_limit);
  gpu::Stream compute, copy;
  gpu::GpuForwardOptions fo;
  fo.gemm_bf16 = loop.gemm_bf16;
  gpu::GpuForward f(loop.config, loop.ckpt, budget, compute, fo);
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
  // Tokens: micro-batches back to back.
  std::vector<int64_t> token0(loop.batches.size() + 1, 0);
  for (size_t b = 0; b < loop.batches.size(); ++b)
    token0[b + 1] = token0[b] + loop.batches[b].n_tokens();
  const int64_t total = token0.back();
  int64_t largest = 0;
  for (const Batch& b : loop.batches)
    largest = std::max(largest, b.n_tokens());

  // The budget: two layers' weights, converted weights, token metadata, then either the whole
  // store (resident) or two bf16 chunk buffers, then chunks.
  STRATA_ASSERT(store.dtype() == DType::kBF16, "the GPU path keeps bf16 hidden states");
  const uint64_t store_bytes = static_cast<uint64_t>(total * H) * 2;
  int64_t longest_seq = 0;
  for (const Batch& b : loop.batches) {
    for (int64_t s = 0; s < b.n_seqs(); ++s)
      longest_seq = std::max(longest_seq, b.seq_offsets[s + 1] - b.seq_offsets[s]);
  }
  // Attention scores through GEMMs when one sequence's take at most an eighth of the budget.
  const uint64_t attention_cap = budget.limit() / 8;
  const uint64_t attention = f.attention_bytes(longest_seq, attention_cap);
  const uint64_t fixed =
      2 * max_blob + max_conv + attention + static_cast<uint64_t>(total) * 16 + (16 << 20);
  const uint64_t per_token = f.bytes_per_token() + static_cast<uint64_t>(H) * 4;
  const uint64_t left = budget.left();
  const uint64_t least =
      fixed + (per_token + 4 * static_cast<uint64_t>(H)) * static_cast<uint64_t>(largest);
  STRATA_CHECK(least <= left, "GPU memory: --max_gpu_memory_gb leaves ", gib(left),
               " but two layers' weights (", gib(2 * max_blob), ") and one micro-batch of ",
               largest, " tokens need ", gib(least),
               "; raise --max_gpu_memory_gb or lower --batch_size");
  // Test hook (tests/engine/CMakeLists.txt): hidden states in host memory, one micro-batch per
  // chunk, as a budget far below the store would make them on a large run.
  const char* host_hook = std::getenv("STRATA_TEST_GPU_HOST_STORE");
  const bool force_host = host_hook && std::string(host_hook) == "1";
  enum class Tier { kDevice, kPinned, kFile };
  Tier tier = Tier::kFile;
  if (!force_host && fixed + store_bytes + per_token * static_cast<uint64_t>(largest) <= left) {
    tier = Tier::kDevice;
  } else if (loop.host_fits) {
    tier = Tier::kPinned;
  }
  // Off the device, each chunk also needs two bf16 in/out buffers for the overlapped copies.
  const uint64_t token_bytes =
      per_token + (tier == Tier::kDevice ? 0 : 4 * static_cast<uint64_t>(H));
  const uint64_t room = left - fixed - (tier == Tier::kDevice ? store_bytes : 0);
  const int64_t cap =
      force_host ? largest : std::max<int64_t>(largest, static_cast<int64_t>(room / token_bytes));
  std::vector<Chunk> chunks;
  for (size_t b = 0; b < loop.batches.size();) {
    Chunk c{b, b, token0[b], 0};
    while (c.last < loop.batches.size() && c.tokens + loop.batches[c.last].n_tokens() <= cap) {
      c.tokens += loop.batches[c.last].n_tokens();
      ++c.last;
    }
    chunks.push_back(c);
    b = c.last;
  }
  int64_t chunk_max = 0;
  for (const Chunk& c : chunks)
    chunk_max = std::max(chunk_max, c.tokens);

  // Device allocations.
  gpu::DeviceBuffer weights[2] = {gpu::DeviceBuffer(budget, max_blob, "a layer's weights"),
                                  gpu::DeviceBuffer(budget, max_blob, "the next layer's weights")};
  gpu::PinnedBuffer host_weights[2] = {gpu::PinnedBuffer(max_blob), gpu::PinnedBuffer(max_blob)};
  gpu::DeviceBuffer meta(budget, static_cast<uint64_t>(total) * 16, "token positions");
  {
    std::vector<int64_t> m(
        static_cast<size_t>(2 * total));  // positions, then chunk-relative starts
    for (const Chunk& c : chunks) {
      for (size_t b = c.first; b < c.last; ++b) {
        const Batch& bt = loop.batches[b];
        for (int64_t s = 0; s < bt.n_seqs(); ++s) {
          for (int64_t t = bt.seq_offsets[s]; t < bt.seq_offsets[s + 1]; ++t) {
            const int64_t g = token0[b] + t;
            m[g] = bt.positions[t];
            m[total + g] = token0[b] - c.token0 + bt.seq_offsets[s];
          }
        }
      }
    }
    compute.copy_to_device(meta.data(), m.data(), m.size() * 8);
    compute.synchronize();
  }
  f.reserve(chunk_max, longest_seq, attention_cap);
  const uint64_t chunk_bf16 = static_cast<uint64_t>(chunk_max * H) * 2;
  gpu::DeviceBuffer x(budget, chunk_bf16 * 2, "a chunk's hidden states");
  gpu::DeviceBuffer dstore, io[2];
  gpu::PinnedBuffer hstore;  // kPinned: every micro-batch, bf16, back to back
  gpu::PinnedBuffer stage;   // kFile: one chunk; else one micro-batch (durable writes, the start)
  if (tier == Tier::kDevice) {
    dstore = gpu::DeviceBuffer(budget, store_bytes, "the hidden states");
  } else {
    io[0] = gpu::DeviceBuffer(budget, chunk_bf16, "a chunk's inputs");
    io[1] = gpu::DeviceBuffer(budget, chunk_bf16, "the next chunk's inputs");
  }
  if (tier == Tier::kPinned) hstore.reserve(store_bytes);
  stage.reserve(tier == Tier::kFile ? chunk_bf16 : static_cast<uint64_t>(largest * H) * 2);
  log_info("GPU: ", cuda_device_description(device), ", budget ", gib(budget.limit()),
           "; hidden states (", gib(store_bytes), ") ",
           tier == Tier::kDevice   ? "resident on the device"
           : tier == Tier::kPinned ? "in pinned host memory"
                                   : "streamed from --offload_folder",
           ", ", chunks.size(), " chunk(s) of up to ", chunk_max, " tokens; layer weights up to ",
           gib(max_blob), attention ? "; attention through batched GEMMs" : "");

  auto chunk_of = [&](const Chunk& c) {
    gpu::GpuChunk g;
    g.tokens = c.tokens;
    g.positions = meta.as<int64_t>() + c.token0;
    g.seq_start = meta.as<int64_t>() + total + c.token0;
    g.seq_bounds.push_back(0);
    for (size_t b = c.first; b < c.last; ++b) {
      const Batch& bt = loop.batches[b];
      for (int64_t s = 0; s < bt.n_seqs(); ++s)
        g.seq_bounds.push_back(token0[b] - c.token0 + bt.seq_offsets[s + 1]);
    }
    return g;
  };
  // Where micro-batch b's bf16 hidden states live on the device or in pinned memory.
  auto dev_at = [&](int64_t tok) { return dstore.as<uint16_t>() + tok * H; };
  auto host_at = [&](int64_t tok) { return reinterpret_cast<uint16_t*>(hstore.data()) + tok * H; };
  // The store's current inputs into the device or pinned tier.
  if (tier != Tier::kFile) {
    for (size_t b = 0; b < loop.batches.size(); ++b) {
      const uint64_t n = store.batch_bytes(sid(b));
      if (tier == Tier::kPinned) {
        store.read_raw(sid(b), host_at(token0[b]));
      } else {
        store.read_raw(sid(b), stage.data());
        compute.copy_to_device(dev_at(token0[b]), stage.data(), n);
        compute.synchronize();
      }
    }
  }
  // A durable step off the file tier: the outputs go to the store's next file.
  auto write_store = [&](int64_t next) {
    store.begin(next);
    for (size_t b = 0; b < loop.batches.size(); ++b) {
      if (tier == Tier::kPinned) {
        store.write_raw(sid(b), host_at(token0[b]));
      } else {
        compute.copy_to_host(stage.data(), dev_at(token0[b]), store.batch_bytes(sid(b)));
        compute.synchronize();
        store.write_raw(sid(b), stage.data());
      }
    }
  };

  // Layer l's weights: read into pinned memory, then copied on the copy stream; both on a
  // helper thread, while the device computes the previous layer.
  auto fetch = [&](int64_t l) {
    return std::async(std::launch::async, [&, l]() {
      const int i = static_cast<int>(l % 2);
      if (comm) {  // this rank's share, then every rank's over the channel, then the copy
        read_share(loop.ckpt, shares[l], comm->rank(), host_weights[i].data());
        if (!channel) return;  // the exchange and the copy follow on the main thread
        set_cuda_device(device);
        exchange_share(*channel, shares[l], host_weights[i].data());
        copy.copy_to_device(weights[i].data(), host_weights[i].data(), blobs[l].bytes);
        copy.synchronize();
        return;
      }
      reader.read(blobs[l], host_weights[i].data());
      for (const auto& [n, item] : blobs[l].items)
        (void)loop.ckpt.tensor(n);  // read by this process (Checkpoint::bytes_read)
      copy.copy_to_device(weights[i].data(), host_weights[i].data(), blobs[l].bytes);
      copy.synchronize();
    });
  };
  std::future<void> prefetch = fetch(loop.first_layer);
  Pending pending;
  auto finish_pending = [&]() {
    if (pending.layer < 0) return;
    LayerReport r = pending.report.get();
    loop.layer_done(r);
    if (pending.durable) {
      loop.commit(pending.layer + 2, pending.hidden, pending.old_input);
    } else {
      loop.exporter.release_source(pending.layer + 1);
    }
    pending = Pending{};
  };
  gpu::Stream h2d, d2h;
  const char* dq_hook = std::getenv("STRATA_GPU_QUANTIZE");
  const bool device_quantize = dq_hook && std::string(dq_hook) == "1";
  std::unique_ptr<strata::cuda::Stream> qs;
  if (device_quantize) qs = std::make_unique<strata::cuda::Stream>(device);
  gpu::Event in_ready[2], out_ready[2], io_free[2];
  uint64_t since_durable = 0;
  double t_wait = 0, t_compute = 0;
  for (int64_t l = loop.first_layer; l < L; ++l) {
    const bool last = l + 1 == L;
    auto t0 = std::chrono::steady_clock::now();
    if (comm) test_fail_hook(*comm, l);
    prefetch.get();
    if (comm && !channel) {  // every rank's share into every rank's buffer, then onto the GPU
      const int i = static_cast<int>(l % 2);
      exchange_share(*comm, shares[l], host_weights[i].data());
      copy.copy_to_device(weights[i].data(), host_weights[i].data(), blobs[l].bytes);
      copy.synchronize();
    }
    auto t1 = std::chrono::steady_clock::now();
    t_wait += std::chrono::duration<double>(t1 - t0).count();
    f.set_layer(l, blobs[l], weights[l % 2].data());
    // The next layer's buffer was last read by layer l-1, which has finished.
    compute.synchronize();
    if (!last) prefetch = fetch(l + 1);
    since_durable += loop.exporter.source_bytes(l + 1);
    bool durable = last || tier == Tier::kFile || since_durable >= kResumeEvery * store_bytes;
    if (comm) durable = any_rank(*comm, durable);  // ranks commit the same steps
    float* xf = x.as<float>();
    if (tier == Tier::kFile && !last) store.begin(l + 2);
    // kPinned: chunk i+1 is copied in (h2d) and chunk i-1 out (d2h) while chunk i computes.
    auto copy_in = [&](size_t i) {
      const Chunk& c = chunks[i];
      const int j = static_cast<int>(i % 2);
      io_free[j].wait(h2d);
      h2d.copy_to_device(io[j].data(), host_at(c.token0), static_cast<uint64_t>(c.tokens * H) * 2);
      in_ready[j].record(h2d);
    };
    if (tier == Tier::kPinned) {
      for (int j = 0; j < 2; ++j)
        io_free[j].record(d2h);
      copy_in(0);
    }
    for (size_t i = 0; i < chunks.size(); ++i) {
      const Chunk& c = chunks[i];
      const gpu::GpuChunk g = chunk_of(c);
      const int64_t n = c.tokens * H;
      const int j = static_cast<int>(i % 2);
      if (tier == Tier::kDevice) {
        gpu::bf16_to_f32(dev_at(c.token0), xf, n, compute.handle());
        f.forward(g, xf, true);
        if (!last) gpu::cast_bf16(xf, dev_at(c.token0), n, compute.handle());
      } else if (tier == Tier::kPinned) {
        if (i + 1 < chunks.size()) copy_in(i + 1);
        in_ready[j].wait(compute);
        gpu::bf16_to_f32(io[j].as<uint16_t>(), xf, n, compute.handle());
        f.forward(g, xf, true);
        if (!last) gpu::cast_bf16(xf, io[j].as<uint16_t>(), n, compute.handle());
        out_ready[j].record(compute);
        out_ready[j].wait(d2h);
        if (!last) d2h.copy_to_host(host_at(c.token0), io[j].data(), static_cast<uint64_t>(n) * 2);
        io_free[j].record(d2h);
      } else {
        for (size_t b = c.first; b < c.last; ++b)
          store.read_raw(sid(b), stage.data() + (token0[b] - c.token0) * H * 2);
        compute.copy_to_device(io[0].data(), stage.data(), static_cast<uint64_t>(n) * 2);
        compute.synchronize();  // the next chunk reuses `stage`
        gpu::bf16_to_f32(io[0].as<uint16_t>(), xf, n, compute.handle());
        f.forward(g, xf, true);
        if (!last) {
          gpu::cast_bf16(xf, io[0].as<uint16_t>(), n, compute.handle());
          compute.copy_to_host(stage.data(), io[0].data(), static_cast<uint64_t>(n) * 2);
          compute.synchronize();
          for (size_t b = c.first; b < c.last; ++b)
            store.write_raw(sid(b), stage.data() + (token0[b] - c.token0) * H * 2);
        }
      }
    }
    if (tier == Tier::kPinned) d2h.synchronize();
    auto calib = std::make_unique<MaxCalibrator>();
    for (const gpu::AmaxStat& s : f.take_stats())
      calib->record(s.name, s.amax, s.rows);
    if (comm) allreduce_calibration(*comm, *calib);  // one process's statistics on every rank
    t_compute += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    std::string hidden, old_input;
    if (durable) {
      // The file the inputs were read from (the embedding's, or the last durable step's) goes
      // once this step is recorded.
      old_input = store.input_path();
      if (!last) {
        if (tier != Tier::kFile) write_store(l + 2);
        hidden = store.commit(loop.resume_dir, true);
      }
    }
    // Layer l-1's tensors are written by now or soon; record it, then hand layer l over.
    finish_pending();
    if (durable) since_durable = 0;
    pending.layer = l;
    pending.calib = std::move(calib);
    pending.durable = durable;
    pending.hidden = hidden;
    pending.old_input = old_input;
    if (device_quantize) {
      pending.weights = std::make_unique<PrecomputedWeights>(
          quantize_on_device(loop.plan, l, blobs[l], weights[l % 2].as<uint8_t>(), budget, *qs,
                             [&](const std::string& n) {
                               return !comm || loop.exporter.owner_of(n) == comm->rank();
                             }));
    }
    const MaxCalibrator* cp = pending.calib.get();
    const PrecomputedWeights* pw = pending.weights.get();
    pending.report = std::async(
        std::launch::async, [&loop, l, cp, pw]() { return loop.exporter.write_layer(l, *cp, pw); });
  }
  finish_pending();
  log_info("GPU: peak device memory ", gib(budget.peak()), " of ", gib(budget.limit()), "; waited ",
           str(t_wait).substr(0, 6), " s for weights, ", str(t_compute).substr(0, 6),
           " s computing");
}

#endif

}  // namespace strata
