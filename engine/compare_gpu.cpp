// strata compare's decoder layers on the GPU (engine/compare_layers.h; docs/COMPARE.md "On the
// GPU"). Per layer l:
//
//   read the source's layer l (LayerReader, pinned)  ->  device  ->  GpuForward (source) on h_s
//   read the export's layer l                        ->  device  ->  GpuForward (export, Serving)
//                                                                    on h_s(l) and on h_q(l)
//
// with the next blob read on a helper thread while a layer computes, and both models' layers read
// into the page cache in that order up to kWarmBytes ahead (io/layer_reader.h PageWarmer), so
// that the disk reads without a pause between blobs. The hidden states stay on
// the host (the measurements are taken there, in double) and pass through the device a chunk of
// whole sequences at a time. Device memory: both models' largest layer blobs and converted
// (dequantized) weights, each forward's attention buffer, and per token of a chunk both
// forwards' working sets and the chunk's hidden states: the chunk is as many sequences as
// --max_gpu_memory_gb leaves room for.
#include <algorithm>
#include <future>

#include "core/error.h"
#include "core/log.h"
#include "engine/compare_layers.h"

#if STRATA_WITH_CUDA
#include "core/gpu_memory.h"
#include "engine/gpu_runner.h"
#include "io/layer_reader.h"
#include "model/common.h"
#include "model/cuda/gpu_forward.h"
#include "ops/cuda/convert.h"
#endif

namespace strata {

#if !STRATA_WITH_CUDA

std::string gpu_compare_unsupported(const ModelConfig&, const Checkpoint&, const ModelConfig&,
                                    const Checkpoint&, const CompareGpuOptions&) {
  return "this strata was built without CUDA";
}

std::unique_ptr<CompareLayers> gpu_compare_layers(const ModelConfig&, const Checkpoint&,
                                                  const ModelConfig&, const Checkpoint&,
                                                  const Batch&, const CompareGpuOptions&) {
  fail("--device cuda: this strata was built without CUDA; use --device cpu");
}

LogitsHeads gpu_logits_heads(const Checkpoint&, const HeadSpec&, const Checkpoint&, const HeadSpec&,
                             const CompareGpuOptions&) {
  return {};
}

#else

std::string gpu_compare_unsupported(const ModelConfig& cs, const Checkpoint& ks,
                                    const ModelConfig& cq, const Checkpoint& kq,
                                    const CompareGpuOptions& o) {
  if (std::string why = gpu::GpuForward::unsupported(cs, ks); !why.empty())
    return ks.dir() + ": " + why;
  if (std::string why = gpu::GpuForward::unsupported(cq, kq, {o.simulate_activations, o.kv_cache});
      !why.empty())
    return kq.dir() + ": " + why;
  return "";
}

namespace {

// Alignment and small allocations, as quantize's plan (engine/memory_plan.cpp) leaves them.
constexpr uint64_t kSlack = 16ull << 20;

// One model's side: its forward, its reader, its layers' blobs and their device buffer.
struct Side {
  const Checkpoint& ckpt;
  gpu::GpuForward forward;
  LayerReader reader;
  std::vector<LayerBlob> blobs;
  uint64_t max_blob = 0, max_converted = 0;
  gpu::DeviceBuffer weights;

  Side(const ModelConfig& c, const Checkpoint& k, gpu::DeviceBudget& budget,
       const gpu::Stream& stream, const gpu::GpuForwardOptions& o, gpu::Serving serving)
      : ckpt(k), forward(c, k, budget, stream, o, serving), reader(k) {
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      blobs.push_back(reader.plan(forward.layer_tensors(l)));
      max_blob = std::max(max_blob, blobs.back().bytes);
      max_converted = std::max(max_converted, forward.converted_bytes(l, blobs.back()));
    }
  }
};

// A chunk: sequences [first, last) of the batch, tokens [token0, token0 + tokens).
struct Chunk {
  int64_t first = 0, last = 0, token0 = 0, tokens = 0;
  std::vector<int64_t> bounds;  // chunk-relative sequence bounds
  int64_t meta_at = 0;          // where its bounds are in the device metadata
};

class GpuCompareLayers final : public CompareLayers {
 public:
  GpuCompareLayers(const ModelConfig& cs, const Checkpoint& ks, const ModelConfig& cq,
                   const Checkpoint& kq, const Batch& batch, const CompareGpuOptions& o)
      : batch_(batch),
        H_(cs.hidden_size),
        round_bf16_(o.bf16_between_layers),
        budget_(o.max_gpu_memory_bytes),
        src_(cs, ks, budget_, stream_, forward_options(o), {}),
        exp_(cq, kq, budget_, stream_, forward_options(o), {o.simulate_activations, o.kv_cache}) {
    plan(o);
  }

  void run(int64_t l, float* hs, float* local, float* hq, Observer* rs, Observer* rl,
           Observer* rq) override {
    load(src_, l, 2 * l);
    forward_all(src_, hs, rs);
    load(exp_, l, 2 * l + 1);
    forward_all(exp_, local, rl);
    forward_all(exp_, hq, rq);
  }

 private:
  static gpu::GpuForwardOptions forward_options(const CompareGpuOptions& o) {
    gpu::GpuForwardOptions f;
    f.gemm_bf16 = o.gemm_bf16;
    return f;
  }

  // Chunks of whole sequences as large as the budget leaves room for, the forwards' scratch and
  // the token metadata.
  void plan(const CompareGpuOptions& o) {
    int64_t longest = 0;
    for (int64_t s = 0; s < batch_.n_seqs(); ++s)
      longest = std::max(longest, batch_.seq_offsets[s + 1] - batch_.seq_offsets[s]);
    const uint64_t cap = budget_.limit() / 8;  // attention scores through GEMMs up to this
    const uint64_t T = static_cast<uint64_t>(batch_.n_tokens());
    const uint64_t meta = (2 * T + T + 2 * static_cast<uint64_t>(batch_.n_seqs()) + 2) * 8;
    const uint64_t fixed = src_.max_blob + exp_.max_blob + src_.max_converted + exp_.max_converted +
                           src_.forward.attention_bytes(longest, cap) +
                           exp_.forward.attention_bytes(longest, cap) + meta + kSlack;
    const uint64_t per_token = src_.forward.bytes_per_token(longest) +
                               exp_.forward.bytes_per_token(longest) +
                               static_cast<uint64_t>(H_) * 4;
    const uint64_t left = budget_.left() > fixed ? budget_.left() - fixed : 0;
    int64_t fit = static_cast<int64_t>(std::min<uint64_t>(left / per_token, T));
    if (o.test_chunk_tokens > 0 && fit >= longest)
      fit = std::max(longest, std::min(fit, o.test_chunk_tokens));
    STRATA_CHECK(fit >= longest,
                 "--max_gpu_memory_gb: ", static_cast<double>(budget_.limit()) / (1ull << 30),
                 " GiB cannot hold one layer of each model (",
                 static_cast<double>(fixed) / (1ull << 30), " GiB) beside a sequence of ", longest,
                 " tokens (", static_cast<double>(per_token * longest) / (1ull << 30),
                 " GiB); raise it, or compare shorter sequences (--max_tokens)");
    std::vector<int64_t> m(static_cast<size_t>(2 * T));  // positions, chunk-relative seq starts
    for (int64_t s = 0; s < batch_.n_seqs();) {
      Chunk c;
      c.first = s;
      c.token0 = batch_.seq_offsets[s];
      c.bounds.push_back(0);
      while (s < batch_.n_seqs() && batch_.seq_offsets[s + 1] - c.token0 <= fit) {
        for (int64_t t = batch_.seq_offsets[s]; t < batch_.seq_offsets[s + 1]; ++t) {
          m[t] = batch_.positions[t];
          m[T + t] = batch_.seq_offsets[s] - c.token0;
        }
        c.bounds.push_back(batch_.seq_offsets[s + 1] - c.token0);
        ++s;
      }
      c.last = s;
      c.tokens = batch_.seq_offsets[s] - c.token0;
      c.meta_at = static_cast<int64_t>(m.size());
      m.insert(m.end(), c.bounds.begin(), c.bounds.end());
      chunk_max_ = std::max(chunk_max_, c.tokens);
      chunks_.push_back(std::move(c));
    }
    meta_ = gpu::DeviceBuffer(budget_, m.size() * 8, "token positions");
    stream_.copy_to_device(meta_.data(), m.data(), m.size() * 8);
    stream_.synchronize();
    for (Side* side : {&src_, &exp_}) {
      side->weights = gpu::DeviceBuffer(budget_, side->max_blob, "layer weights");
      side->forward.reserve(chunk_max_, longest, cap);
    }
    x_ = gpu::DeviceBuffer(budget_, static_cast<uint64_t>(chunk_max_ * H_) * 4, "hidden states");
    host_[0].reserve(std::max(src_.max_blob, exp_.max_blob));
    host_[1].reserve(std::max(src_.max_blob, exp_.max_blob));
    log_info("compare on the GPU: ", chunks_.size(), " chunk(s) of up to ", chunk_max_, " tokens, ",
             static_cast<double>(budget_.limit()) / (1ull << 30), " GiB budget");
    std::vector<LayerBlob> order;  // the read order of read_ahead
    for (size_t l = 0; l < src_.blobs.size(); ++l) {
      order.push_back(src_.blobs[l]);
      order.push_back(exp_.blobs[l]);
    }
    warm_ = std::make_unique<PageWarmer>(std::move(order), kWarmBytes);
    read_ahead(0);
  }

  // Blob i of the read order (source 0, export 0, source 1, ...) into host buffer i % 2.
  void read_ahead(int64_t i) {
    const int64_t L = static_cast<int64_t>(src_.blobs.size());
    if (i >= 2 * L) return;
    Side& side = i % 2 == 0 ? src_ : exp_;
    const LayerBlob& blob = side.blobs[static_cast<size_t>(i / 2)];
    uint8_t* dst = host_[i % 2].data();
    reading_ = std::async(std::launch::async, [&side, &blob, dst] { side.reader.read(blob, dst); });
  }

  // Layer l of `side` onto the device (blob `i` of the read order), the next blob's read started.
  void load(Side& side, int64_t l, int64_t i) {
    reading_.get();
    warm_->advance();
    const LayerBlob& blob = side.blobs[static_cast<size_t>(l)];
    stream_.copy_to_device(side.weights.data(), host_[i % 2].data(), blob.bytes);
    stream_.synchronize();  // host_[i % 2] is read into again two blobs on
    read_ahead(i + 1);
    side.forward.set_layer(l, blob, side.weights.data());
  }

  void forward_all(Side& side, float* h, Observer* routing) {
    side.forward.set_routing_observer(routing);
    for (const Chunk& c : chunks_) {
      gpu::GpuChunk g;
      const int64_t T = batch_.n_tokens();
      g.tokens = c.tokens;
      g.positions = meta_.as<int64_t>() + c.token0;
      g.seq_start = meta_.as<int64_t>() + T + c.token0;
      g.seq_bounds = c.bounds;
      g.seq_bounds_dev = meta_.as<int64_t>() + c.meta_at;
      const uint64_t bytes = static_cast<uint64_t>(c.tokens * H_) * 4;
      stream_.copy_to_device(x_.data(), h + c.token0 * H_, bytes);
      side.forward.forward(g, x_.as<float>(), round_bf16_);
      stream_.copy_to_host(h + c.token0 * H_, x_.data(), bytes);
      stream_.synchronize();
    }
    side.forward.take_stats();  // nothing observes them: clears the device's slots
    side.forward.set_routing_observer(nullptr);
  }

  const Batch& batch_;
  const int64_t H_;
  const bool round_bf16_;
  gpu::DeviceBudget budget_;
  gpu::Stream stream_;
  Side src_, exp_;
  std::vector<Chunk> chunks_;
  int64_t chunk_max_ = 0;
  gpu::DeviceBuffer meta_, x_;
  gpu::PinnedBuffer host_[2];
  std::unique_ptr<PageWarmer> warm_;  // declared before reading_: destroyed after it
  std::future<void> reading_;
};

}  // namespace

std::unique_ptr<CompareLayers> gpu_compare_layers(const ModelConfig& cs, const Checkpoint& ks,
                                                  const ModelConfig& cq, const Checkpoint& kq,
                                                  const Batch& batch,
                                                  const CompareGpuOptions& options) {
  return std::make_unique<GpuCompareLayers>(cs, ks, cq, kq, batch, options);
}

namespace {

// The head on the device: the norm weight in fp32, lm_head in the GEMM dtype, and per call of up
// to kHeadRows rows their hidden states, normed rows and logits; the ops are the CUDA backend's
// (ops/backend.h rms_norm, linear), the CPU head's (model/common.cpp) on the device.
class GpuHead final : public LogitsHead {
 public:
  static constexpr int64_t kHeadRows = 512;

  // o.max_gpu_memory_bytes: this head's budget (bytes()).
  GpuHead(const Checkpoint& ckpt, const HeadSpec& h, const CompareGpuOptions& o)
      : h_(h), budget_(o.max_gpu_memory_bytes) {
    ops::CudaBackendOptions bo;
    bo.gemm_bf16 = o.gemm_bf16;
    backend_ = std::make_unique<ops::CudaBackend>(budget_, stream_, bo, 1, 0);
    const int64_t H = h.hidden, V = h.vocab;
    backend_->reserve_scratch(static_cast<uint64_t>(kHeadRows * H) * 4 + (1ull << 20));
    norm_ = gpu::DeviceBuffer(budget_, static_cast<uint64_t>(H) * 4, "the final norm");
    const std::vector<float> nw = model::load_weight(ckpt, h.norm, {H});
    stream_.copy_to_device(norm_.data(), nw.data(), nw.size() * 4);
    // lm_head as stored, converted on the device into the GEMM dtype (bf16 used as is).
    const Tensor w = ckpt.tensor(h.lm_head);
    STRATA_CHECK(w.shape() == Shape({V, H}), ckpt.dir(), ": '", h.lm_head, "' has shape ",
                 shape_str(w.shape()), " but config.json implies ", shape_str(Shape{V, H}));
    const uint64_t esz = o.gemm_bf16 ? 2 : 4;
    head_ = gpu::DeviceBuffer(budget_, static_cast<uint64_t>(V * H) * esz, "lm_head");
    if (o.gemm_bf16 && w.dtype() == DType::kBF16) {
      stream_.copy_to_device(head_.data(), w.bytes(), w.nbytes());
    } else {
      gpu::DeviceBuffer stored(budget_, w.nbytes(), "lm_head as stored");
      stream_.copy_to_device(stored.data(), w.bytes(), w.nbytes());
      if (o.gemm_bf16)
        ops::cuda::convert_to_bf16(stored.data(), w.dtype(), head_.as<uint16_t>(), V * H,
                                   stream_.handle());
      else
        ops::cuda::convert_to_f32(stored.data(), w.dtype(), head_.as<float>(), V * H,
                                  stream_.handle());
      stream_.synchronize();  // before `stored` goes
    }
    x_ = gpu::DeviceBuffer(budget_, static_cast<uint64_t>(kHeadRows * H) * 4, "head inputs");
    xn_ = gpu::DeviceBuffer(budget_, static_cast<uint64_t>(kHeadRows * H) * 4, "head norms");
    y_ = gpu::DeviceBuffer(budget_, static_cast<uint64_t>(kHeadRows * V) * 4, "logits");
    stream_.synchronize();
    gpu::cuda_check_last("the GPU head's weights");
  }

  // Device bytes of a head for `h` (weights, lm_head's copy as stored unless it is the GEMM
  // dtype's bf16, the per-call buffers and scratch, 17 MiB of slack for the backend's own).
  static uint64_t bytes(const Checkpoint& ckpt, const HeadSpec& h, bool gemm_bf16) {
    const uint64_t H = static_cast<uint64_t>(h.hidden), V = static_cast<uint64_t>(h.vocab);
    const DType stored = ckpt.entry(h.lm_head).dtype;
    const uint64_t staging = gemm_bf16 && stored == DType::kBF16
                                 ? 0
                                 : ckpt.entry(h.lm_head).end - ckpt.entry(h.lm_head).begin;
    return V * H * (gemm_bf16 ? 2 : 4) + staging + H * 4 +
           static_cast<uint64_t>(kHeadRows) * (3 * H * 4 + V * 4) + (17ull << 20);
  }

  void logits(const float* hidden, int64_t n, float* out) const override {
    const int64_t H = h_.hidden, V = h_.vocab;
    ops::Weight norm{norm_.data(), {H}, true};
    norm.offset = h_.norm_offset;
    const ops::Weight head{head_.data(), {V, H}, false};
    for (int64_t r = 0; r < n; r += kHeadRows) {
      const int64_t m = std::min(kHeadRows, n - r);
      stream_.copy_to_device(x_.data(), hidden + r * H, static_cast<uint64_t>(m * H) * 4);
      backend_->rms_norm(x_.as<float>(), m, H, norm, h_.eps, xn_.as<float>());
      backend_->linear(xn_.as<float>(), m, head, y_.as<float>());
      stream_.copy_to_host(out + r * V, y_.data(), static_cast<uint64_t>(m * V) * 4);
      stream_.synchronize();
    }
    gpu::cuda_check_last("the GPU head's logits");
  }

 private:
  HeadSpec h_;
  gpu::DeviceBudget budget_;
  gpu::Stream stream_;
  std::unique_ptr<ops::CudaBackend> backend_;
  gpu::DeviceBuffer norm_, head_, x_, xn_, y_;
};

}  // namespace

LogitsHeads gpu_logits_heads(const Checkpoint& ks, const HeadSpec& source, const Checkpoint& kq,
                             const HeadSpec& quantized, const CompareGpuOptions& options) {
  const uint64_t ns = GpuHead::bytes(ks, source, options.gemm_bf16);
  const uint64_t nq = GpuHead::bytes(kq, quantized, options.gemm_bf16);
  const uint64_t limit = gpu::DeviceBudget(options.max_gpu_memory_bytes).limit();
  if (ns + nq > limit) return {};
  // An lm_head stored quantized is dequantized by the CPU's head (model/common.h load_weight).
  for (const auto& [k, h] : {std::pair{&ks, &source}, std::pair{&kq, &quantized}}) {
    const DType d = k->entry(h->lm_head).dtype;
    if (d != DType::kBF16 && d != DType::kF16 && d != DType::kF32) return {};
  }
  // Each head its own budget, their sum the cap.
  CompareGpuOptions o = options;
  o.max_gpu_memory_bytes = ns;
  LogitsHeads h;
  h.source = std::make_unique<GpuHead>(ks, source, o);
  o.max_gpu_memory_bytes = nq;
  h.quantized = std::make_unique<GpuHead>(kq, quantized, o);
  return h;
}

#endif

}  // namespace strata
