#include "engine/gpu_runner.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>

#include "calib/max_calib.h"
#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/layer_reader.h"

#if STRATA_WITH_CUDA
#include "model/cuda/gpu_forward.h"
#include "model/cuda/kernels.h"
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
  std::future<LayerReport> report;
  bool durable = false;
  std::string hidden, old_input;
};

}  // namespace

void run_layers_gpu(GpuLoop& loop) {
  STRATA_CHECK(cuda_device_count() > 0, "--device cuda: no CUDA device is visible; use --device "
                                        "cpu");
  const int64_t L = loop.plan.num_layers, H = loop.config.hidden_size;
  ActivationStore& store = loop.store;
  DeviceBudget budget(loop.max_gpu_memory_bytes);
  Stream compute, copy;
  gpu::GpuForwardOptions fo;
  fo.gemm_bf16 = loop.gemm_bf16;
  gpu::GpuForward f(loop.config, loop.ckpt, budget, compute, fo);
  LayerReader reader(loop.ckpt);

  // Every layer's read plan (headers only), and the largest buffers they need.
  std::vector<LayerBlob> blobs(static_cast<size_t>(L));
  uint64_t max_blob = 0, max_conv = 0;
  for (int64_t l = loop.first_layer; l < L; ++l) {
    blobs[l] = reader.plan(f.layer_tensors(l));
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
  // store (resident) or nothing, then chunks.
  const uint64_t store_bytes = static_cast<uint64_t>(total * H) * 2;
  const uint64_t fixed = 2 * max_blob + max_conv + static_cast<uint64_t>(total) * 16 + (16 << 20);
  const uint64_t per_token = f.bytes_per_token() + static_cast<uint64_t>(H) * 4;
  const uint64_t left = budget.left();
  STRATA_CHECK(fixed + per_token * static_cast<uint64_t>(largest) <= left,
               "GPU memory: --max_gpu_memory_gb leaves ", gib(left), " but two layers' weights (",
               gib(2 * max_blob), ") and one micro-batch of ", largest, " tokens (",
               gib(per_token * static_cast<uint64_t>(largest)), ") need ",
               gib(fixed + per_token * static_cast<uint64_t>(largest)),
               "; raise --max_gpu_memory_gb or lower --batch_size");
  // Test hook (tests/engine/CMakeLists.txt): hidden states in host memory, one micro-batch per
  // chunk, as a budget far below the store would make them on a large run.
  const char* host_hook = std::getenv("STRATA_TEST_GPU_HOST_STORE");
  const bool force_host = host_hook && std::string(host_hook) == "1";
  const bool resident =
      !force_host && fixed + store_bytes + per_token * static_cast<uint64_t>(largest) <= left;
  const uint64_t room = left - fixed - (resident ? store_bytes : 0);
  const int64_t cap =
      force_host ? largest : std::max<int64_t>(largest, static_cast<int64_t>(room / per_token));
  std::vector<Chunk> chunks;
  for (size_t b = 0; b < loop.batches.size();) {
    Chunk c{b, b, token0[b], 0};
    while (c.last < loop.batches.size() &&
           c.tokens + loop.batches[c.last].n_tokens() <= cap) {
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
  DeviceBuffer weights[2] = {DeviceBuffer(budget, max_blob, "a layer's weights"),
                             DeviceBuffer(budget, max_blob, "the next layer's weights")};
  PinnedBuffer host_weights[2] = {PinnedBuffer(max_blob), PinnedBuffer(max_blob)};
  DeviceBuffer meta(budget, static_cast<uint64_t>(total) * 16, "token positions");
  {
    std::vector<int64_t> m(static_cast<size_t>(2 * total));  // positions, then chunk-relative starts
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
  f.reserve(chunk_max);
  DeviceBuffer x(budget, static_cast<uint64_t>(chunk_max * H) * 4, "a chunk's hidden states");
  DeviceBuffer dstore;
  PinnedBuffer stage(resident ? static_cast<uint64_t>(largest * H) * 4
                              : static_cast<uint64_t>(chunk_max * H) * 4);
  if (resident) dstore = DeviceBuffer(budget, store_bytes, "the hidden states");
  log_info("GPU: ", cuda_device_description(0), ", budget ", gib(budget.limit()),
           "; hidden states ", resident ? "resident on the device" : "in host memory", " (",
           gib(store_bytes), "), ", chunks.size(), " chunk(s) of up to ", chunk_max,
           " tokens; layer weights up to ", gib(max_blob));

  auto chunk_of = [&](const Chunk& c) {
    gpu::GpuChunk g;
    g.tokens = c.tokens;
    g.positions = meta.as<int64_t>() + c.token0;
    g.seq_start = meta.as<int64_t>() + total + c.token0;
    return g;
  };
  // Micro-batch b between the host store (fp32) and the device store (bf16), through x.
  auto upload = [&](size_t b) {
    const int64_t n = loop.batches[b].n_tokens() * H;
    store.read(b, reinterpret_cast<float*>(stage.data()));
    compute.copy_to_device(x.data(), stage.data(), static_cast<uint64_t>(n) * 4);
    gpu::cast_bf16(x.as<float>(), dstore.as<uint16_t>() + token0[b] * H, n, compute.handle());
    compute.synchronize();
  };
  auto download = [&](size_t b) {
    const int64_t n = loop.batches[b].n_tokens() * H;
    gpu::bf16_to_f32(dstore.as<uint16_t>() + token0[b] * H, x.as<float>(), n, compute.handle());
    compute.copy_to_host(stage.data(), x.data(), static_cast<uint64_t>(n) * 4);
    compute.synchronize();
    store.write(b, reinterpret_cast<const float*>(stage.data()));
  };
  if (resident) {
    for (size_t b = 0; b < loop.batches.size(); ++b)
      upload(b);
  }

  // Layer l's weights: read into pinned memory, then copied on the copy stream; both on a
  // helper thread, while the device computes the previous layer.
  auto fetch = [&](int64_t l) {
    return std::async(std::launch::async, [&, l]() {
      const int i = static_cast<int>(l % 2);
      reader.read(blobs[l], host_weights[i].data());
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
  uint64_t since_durable = 0;
  double t_wait = 0, t_compute = 0;
  for (int64_t l = loop.first_layer; l < L; ++l) {
    const bool last = l + 1 == L;
    auto t0 = std::chrono::steady_clock::now();
    prefetch.get();
    auto t1 = std::chrono::steady_clock::now();
    t_wait += std::chrono::duration<double>(t1 - t0).count();
    f.set_layer(l, blobs[l], weights[l % 2].data());
    // The next layer's buffer was last read by layer l-1, which has finished.
    compute.synchronize();
    if (!last) prefetch = fetch(l + 1);
    since_durable += loop.exporter.source_bytes(l + 1);
    const bool durable = last || store.spilled() || since_durable >= kResumeEvery * store_bytes;
    if (!last && (!resident || durable)) store.begin(l + 2);
    for (const Chunk& c : chunks) {
      const gpu::GpuChunk g = chunk_of(c);
      if (resident) {
        gpu::bf16_to_f32(dstore.as<uint16_t>() + c.token0 * H, x.as<float>(), c.tokens * H,
                         compute.handle());
        f.forward(g, x.as<float>(), true);
        if (!last)
          gpu::cast_bf16(x.as<float>(), dstore.as<uint16_t>() + c.token0 * H, c.tokens * H,
                         compute.handle());
      } else {
        float* host = reinterpret_cast<float*>(stage.data());
        for (size_t b = c.first; b < c.last; ++b)
          store.read(b, host + (token0[b] - c.token0) * H);
        compute.copy_to_device(x.data(), host, static_cast<uint64_t>(c.tokens * H) * 4);
        f.forward(g, x.as<float>(), true);
        if (!last) {
          compute.copy_to_host(host, x.data(), static_cast<uint64_t>(c.tokens * H) * 4);
          compute.synchronize();
          for (size_t b = c.first; b < c.last; ++b)
            store.write(b, host + (token0[b] - c.token0) * H);
        }
      }
    }
    auto calib = std::make_unique<MaxCalibrator>();
    for (const gpu::AmaxStat& s : f.take_stats())
      calib->record(s.name, s.amax, s.rows);
    t_compute += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    std::string hidden, old_input;
    if (!last) {
      if (resident && durable) {
        for (size_t b = 0; b < loop.batches.size(); ++b)
          download(b);
      }
      old_input = store.spilled() ? store.input_path() : "";
      if (!resident || durable) hidden = store.commit(loop.resume_dir, durable);
    }
    // Layer l-1's tensors are written by now or soon; record it, then hand layer l over.
    finish_pending();
    if (durable) since_durable = 0;
    pending.layer = l;
    pending.calib = std::move(calib);
    pending.durable = durable;
    pending.hidden = hidden;
    pending.old_input = old_input;
    const MaxCalibrator* cp = pending.calib.get();
    pending.report = std::async(std::launch::async, [&loop, l, cp]() {
      return loop.exporter.write_layer(l, *cp);
    });
  }
  finish_pending();
  log_info("GPU: peak device memory ", gib(budget.peak()), " of ", gib(budget.limit()),
           "; waited ", str(t_wait).substr(0, 6), " s for weights, ", str(t_compute).substr(0, 6),
           " s computing");
}

#endif

}  // namespace strata
