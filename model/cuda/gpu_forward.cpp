#include "model/cuda/gpu_forward.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>

#include "core/error.h"
#include "core/parallel.h"
#include "io/source_weights.h"
#include "model/arch.h"
#include "model/common.h"
#include "model/layer.h"
#include "ops/cuda/convert.h"

namespace strata::gpu {
namespace {

constexpr uint64_t kAlign = 256;
constexpr int64_t kFp8Block = 128;  // DeepSeek's FP8 weight blocks (io/source_weights.h)
uint64_t align_up(uint64_t x) {
  return (x + kAlign - 1) / kAlign * kAlign;
}

// The INT4 pack-quantized or MXFP4 weight stored for `name` ("<M>.weight", absent as such), if
// any; the device decompresses those (FP8 blocks are stored under M.weight itself).
std::optional<SourceWeight> compressed_weight(const Checkpoint& ckpt, const std::string& name) {
  if (!name.ends_with(".weight") || ckpt.has(name)) return std::nullopt;
  std::optional<SourceWeight> sw = find_source_weight(ckpt, name.substr(0, name.size() - 7));
  if (!sw || (sw->compression != SourceCompression::kInt4Pack &&
              sw->compression != SourceCompression::kMxfp4))
    return std::nullopt;
  return sw;
}

// A ModelOpt export's quantized weight "<M>.weight" (NVFP4, FP8 per tensor or per 128-block,
// MXFP8, MXFP4; the shapes model/common.cpp checks), as a Compressed whose pointers are offsets
// from `base` into the blob (null: nothing to point at); std::nullopt when `name` is not one.
std::optional<ops::Compressed> export_weight(const Checkpoint& ckpt, const std::string& name,
                                             const Shape& shape, const LayerBlob* blob,
                                             const uint8_t* base) {
  if (!name.ends_with(".weight") || shape.size() != 2 || !ckpt.has(name)) return std::nullopt;
  const std::string m = name.substr(0, name.size() - 7);
  if (!ckpt.has(m + ".weight_scale")) return std::nullopt;
  const TensorEntry& w = ckpt.entry(name);
  const TensorEntry& sc = ckpt.entry(m + ".weight_scale");
  auto bad = [&](const char* what) {
    fail(ckpt.dir(), ": '", m, "' looks ModelOpt-quantized but ", what, "; the export is damaged");
  };
  auto at = [&](const std::string& n) -> const void* {
    if (!base || !blob) return nullptr;
    return base + blob->items.at(n).offset;
  };
  ops::Compressed c;
  c.values = at(name);
  c.scales = at(m + ".weight_scale");
  const int64_t out = shape[0], in = shape[1];
  if (w.dtype == DType::kU8 && sc.dtype == DType::kU8) {  // MXFP4
    if (w.shape != Shape{out, in / 2} || sc.shape != Shape{out, in / 32})
      bad("its MXFP4 tensors have unexpected shapes");
    c.kind = ops::Compressed::Kind::kMxfp4;
    c.stored_cols = in / 32;
  } else if (w.dtype == DType::kU8) {  // NVFP4, blocks of 16 or 32
    if (w.shape != Shape{out, in / 2} || sc.dtype != DType::kF8E4M3 ||
        (sc.shape != Shape{out, in / 16} && sc.shape != Shape{out, in / 32}) ||
        !ckpt.has(m + ".weight_scale_2"))
      bad("its NVFP4 tensors have unexpected shapes or dtypes");
    c.kind = ops::Compressed::Kind::kNvfp4;
    c.group = in / sc.shape[1];
    c.global_scale = at(m + ".weight_scale_2");
  } else if (w.dtype == DType::kF8E4M3 && sc.dtype == DType::kF32) {
    c.kind = ops::Compressed::Kind::kFp8;
    const int64_t nr = (out + kFp8Block - 1) / kFp8Block, nc = (in + kFp8Block - 1) / kFp8Block;
    if (w.shape != shape || (shape_numel(sc.shape) != 1 && sc.shape != Shape{nr, 1, nc, 1}))
      bad("its FP8 tensors have unexpected shapes");
    c.group = shape_numel(sc.shape) == 1 ? 0 : kFp8Block;
  } else if (w.dtype == DType::kF8E4M3 && sc.dtype == DType::kU8) {
    if (w.shape != shape || sc.shape != Shape{out, in / 32})
      bad("its MXFP8 tensors have unexpected shapes");
    c.kind = ops::Compressed::Kind::kMxfp8;
  } else {
    return std::nullopt;
  }
  return c;
}

// Whether tensor `n` is part of an export's quantized weight (the weight or its scales).
bool export_tensor(const Checkpoint& ckpt, const std::string& n) {
  for (const char* suffix : {".weight", ".weight_scale", ".weight_scale_2"}) {
    if (!n.ends_with(suffix)) continue;
    const std::string m = n.substr(0, n.size() - std::string(suffix).size());
    if (ckpt.has(m + ".weight") && ckpt.has(m + ".weight_scale")) {
      const TensorEntry& w = ckpt.entry(m + ".weight");
      if (w.dtype == DType::kU8 || w.dtype == DType::kF8E4M3) return true;
    }
  }
  return false;
}

// Tokens of the sizing runs: one sequence, long enough that the scratch's alignment is noise.
constexpr int64_t kSizingTokens = 1024;

// A layer's weights in its device blob: GEMM weights used as stored when they are already in the
// GEMM dtype (and aligned), else converted (or decompressed, for FP8 blocks) into `converted`;
// fp32 weights likewise. With base null, only counts the converted bytes.
class BlobBinder final : public model::Binder {
 public:
  // decompressed: where each decompressed weight lands (by its "<M>.weight" name), or null.
  BlobBinder(const Checkpoint& ckpt, const LayerBlob& blob, const uint8_t* base,
             DeviceBuffer* converted, bool gemm_bf16, const Stream& stream,
             std::map<std::string, ops::StoredWeight>* decompressed = nullptr)
      : ckpt_(ckpt),
        blob_(blob),
        base_(base),
        converted_(converted),
        gemm_bf16_(gemm_bf16),
        stream_(stream),
        decompressed_(decompressed) {}

  uint64_t used() const { return used_; }
  // Routed experts' compressed weights are deferred (ops::Weight::compressed): the backend's moe()
  // decompresses them in slices (docs/CUDA.md "Memory"); nothing is converted for them here.
  void defer_routed_experts(bool on) { defer_ = on; }
  // The largest deferred weight's bf16 bytes (the device quantizer decompresses one at a time).
  uint64_t largest_deferred() const { return largest_deferred_; }
  // Expert parallelism: only the routed experts expert_owner gives rank `rank` of `ranks` are
  // bound (the others are not in this rank's blob).
  void hold_experts_of(int rank, int ranks) {
    rank_ = rank;
    ranks_ = ranks;
  }
  bool holds_expert(int64_t e, int64_t experts) const override {
    return ranks_ <= 1 || expert_owner(e, experts, ranks_) == rank_;
  }

  ops::Weight matrix(const std::string& name, const Shape& shape) override {
    return weight(name, shape);
  }

  ops::Weight weight(const std::string& name, const Shape& shape) {
    if (!blob_.items.count(name)) {
      if (std::optional<SourceWeight> sw = compressed_weight(ckpt_, name))
        return compressed(*sw, shape);
    }
    if (std::optional<ops::Compressed> c = export_weight(ckpt_, name, shape, &blob_, base_)) {
      untranspose(name, *c);
      return decompressed(name, *c, shape);
    }
    const LayerBlob::Item& it = item(name, shape);
    const int64_t n = shape_numel(shape);
    const uint64_t esz = gemm_bf16_ ? 2 : 4;
    ops::Weight w{nullptr, shape, false};
    if (ckpt_.transposed_view(name)) {  // stored [in, out] (gpt-oss's bf16 experts)
      const DType gemm = gemm_bf16_ ? DType::kBF16 : DType::kF32;
      void* dst = alloc(static_cast<uint64_t>(n) * esz);
      // The device's weight quantization reads it in its stored dtype, as the CPU does.
      void* q = it.dtype == gemm ? dst : alloc(dtype_bytes(it.dtype, n));
      if (!base_) return w;
      ops::cuda::convert_transposed(base_ + it.offset, it.dtype, shape[1], shape[0], dst, gemm,
                                    stream_.handle());
      if (q != dst)
        ops::cuda::convert_transposed(base_ + it.offset, it.dtype, shape[1], shape[0], q, it.dtype,
                                      stream_.handle());
      record(name, q, it.dtype, shape);
      w.data = dst;
      return w;
    }
    if (it.dtype == DType::kF8E4M3) {  // an FP8-block source, decompressed as on the CPU
      const std::string sname = name + "_scale_inv";
      auto sc = blob_.items.find(sname);
      STRATA_CHECK(sc != blob_.items.end(), ckpt_.dir(), ": '", name, "' is F8_E4M3 without '",
                   sname, "'");
      const Shape want{(shape[0] + kFp8Block - 1) / kFp8Block,
                       (shape[1] + kFp8Block - 1) / kFp8Block};
      STRATA_CHECK(sc->second.shape == want, ckpt_.dir(), ": '", sname, "' has shape ",
                   shape_str(sc->second.shape), "; 128x128 blocks of ", shape_str(shape), " need ",
                   shape_str(want));
      ops::Compressed c;
      c.kind = ops::Compressed::Kind::kFp8Block;
      c.group = kFp8Block;
      c.scale_dtype = sc->second.dtype;
      if (base_) {
        c.values = base_ + it.offset;
        c.scales = base_ + sc->second.offset;
      }
      return decompressed(name, c, shape);
    }
    const bool as_is = gemm_bf16_ ? it.dtype == DType::kBF16 : it.dtype == DType::kF32;
    if (as_is && it.offset % 16 == 0) {
      w.data = base_ ? base_ + it.offset : nullptr;
      return w;
    }
    void* dst = alloc(static_cast<uint64_t>(n) * esz);
    if (!base_) return w;
    if (gemm_bf16_) {
      ops::cuda::convert_to_bf16(base_ + it.offset, it.dtype, static_cast<uint16_t*>(dst), n,
                                 stream_.handle());
    } else {
      ops::cuda::convert_to_f32(base_ + it.offset, it.dtype, static_cast<float*>(dst), n,
                                stream_.handle());
    }
    w.data = dst;
    return w;
  }

  ops::Weight vector(const std::string& name, const Shape& shape) override {
    const LayerBlob::Item& it = item(name, shape);
    const int64_t n = shape_numel(shape);
    ops::Weight w{nullptr, shape, true};
    if (it.dtype == DType::kF32 && it.offset % 16 == 0) {
      w.data = base_ ? base_ + it.offset : nullptr;
      return w;
    }
    void* dst = alloc(static_cast<uint64_t>(n) * 4);
    if (!base_) return w;
    ops::cuda::convert_to_f32(base_ + it.offset, it.dtype, static_cast<float*>(dst), n,
                              stream_.handle());
    w.data = dst;
    return w;
  }

  bool has(const std::string& name) const override {
    return blob_.items.count(name) > 0 || compressed_weight(ckpt_, name).has_value();
  }
  Shape shape_of(const std::string& name) const override {
    if (!blob_.items.count(name)) {
      if (std::optional<SourceWeight> sw = compressed_weight(ckpt_, name)) return sw->shape;
    }
    return blob_.items.at(name).shape;
  }

 private:
  // An INT4 pack-quantized or MXFP4 weight, decompressed as the CPU decompresses it
  // (io/source_weights.h).
  ops::Weight compressed(const SourceWeight& sw, const Shape& shape) {
    STRATA_CHECK(sw.shape == shape, ckpt_.dir(), ": '", sw.stored, "' holds ", shape_str(sw.shape),
                 " but config.json implies ", shape_str(shape));
    const LayerBlob::Item& v = blob_.items.at(sw.stored);
    ops::Compressed c;
    const bool int4 = sw.compression == SourceCompression::kInt4Pack;
    const LayerBlob::Item& sc =
        blob_.items.at(sw.module + (int4 ? ".weight_scale" : ".weight_scales"));
    c.kind = int4 ? ops::Compressed::Kind::kInt4Pack : ops::Compressed::Kind::kMxfp4;
    c.group = sw.group;
    c.stored_cols = v.shape[1];
    c.scale_dtype = sc.dtype;
    if (base_) {
      c.values = base_ + v.offset;
      c.scales = base_ + sc.offset;
    }
    return decompressed(sw.module + ".weight", c, shape);
  }
  // A compressed weight: deferred (a routed expert's of a compressed source, with
  // defer_routed_experts: ops::decompress_weights takes those kinds), else decompressed into the
  // converted weights in the GEMM dtype, and in bf16 for the device's weight quantization. An
  // export's weights (strata compare, or an export read as a source) are never deferred.
  ops::Weight decompressed(const std::string& name, const ops::Compressed& c, const Shape& shape) {
    ops::Weight w{nullptr, shape, false};
    const int64_t n = shape_numel(shape);
    using K = ops::Compressed::Kind;
    const bool source_kind =
        c.kind == K::kInt4Pack || c.kind == K::kMxfp4 || c.kind == K::kFp8Block;
    if (defer_ && source_kind && routed_expert_of(name) >= 0) {
      largest_deferred_ = std::max(largest_deferred_, static_cast<uint64_t>(n) * 2);
      w.compressed = c;
      if (decompressed_)
        (*decompressed_)[name] = ops::StoredWeight{nullptr, DType::kBF16, shape[0], shape[1], c};
      return w;
    }
    void* dst = alloc(static_cast<uint64_t>(n) * (gemm_bf16_ ? 2 : 4));
    void* q = bf16_copy(dst, n);
    if (!base_) return w;
    ops::decompress_weight(c, shape[0], shape[1], dst, gemm_bf16_, stream_.handle());
    if (q != dst) ops::decompress_weight(c, shape[0], shape[1], q, true, stream_.handle());
    record(name, q, DType::kBF16, shape);
    w.data = dst;
    return w;
  }
  // An export's fused experts (gpt-oss: values U8 [E, in/2, out] with block scales [E, in/16,
  // out] for NVFP4, F8_E4M3 [E, in, out] for FP8; io/fused_experts.h) are transposed views: each
  // expert's values and scales stored [cols, rows] of the view's [rows, cols]. They are copied
  // transposed into the converted weights, as Checkpoint::tensor copies them on the CPU, and
  // decompressed from there.
  void untranspose(const std::string& name, ops::Compressed& c) {
    const std::string m = name.substr(0, name.size() - 7);  // without ".weight"
    auto one = [&](const std::string& n, const void*& at) {
      if (!ckpt_.transposed_view(n)) return;
      const TensorEntry& e = ckpt_.entry(n);
      STRATA_CHECK(e.shape.size() == 2 && dtype_bits(e.dtype) == 8, ckpt_.dir(), ": '", n,
                   "' is a transposed view of ", dtype_name(e.dtype), " ", shape_str(e.shape),
                   "; the GPU reads an export's fused experts as 2-D tensors of bytes");
      void* dst = alloc(static_cast<uint64_t>(shape_numel(e.shape)));
      if (!base_) return;
      ops::cuda::convert_transposed(at, e.dtype, e.shape[1], e.shape[0], dst, e.dtype,
                                    stream_.handle());
      at = dst;
    };
    one(name, c.values);
    one(m + ".weight_scale", c.scales);
  }
  // Where the device's weight quantization reads a decompressed weight: in bf16, as the CPU
  // decompresses it (FP8's rounding follows the weight's dtype, quant/cuda/quant_cuda.h), so a
  // second copy beside an fp32 GEMM's `dst`.
  void* bf16_copy(void* dst, int64_t n) {
    return gemm_bf16_ ? dst : alloc(static_cast<uint64_t>(n) * 2);
  }
  void record(const std::string& name, const void* q, DType dtype, const Shape& shape) {
    if (decompressed_) (*decompressed_)[name] = ops::StoredWeight{q, dtype, shape[0], shape[1]};
  }

  const LayerBlob::Item& item(const std::string& name, const Shape& shape) const {
    auto it = blob_.items.find(name);
    STRATA_CHECK(it != blob_.items.end(), ckpt_.dir(), ": tensor '", name,
                 "' is missing; the checkpoint does not match its config.json");
    STRATA_CHECK(it->second.shape == shape, ckpt_.dir(), ": tensor '", name, "' has shape ",
                 shape_str(it->second.shape), " but config.json implies ", shape_str(shape));
    return it->second;
  }
  void* alloc(uint64_t bytes) {
    const uint64_t at = used_;
    used_ += align_up(bytes);
    if (!base_) return nullptr;
    STRATA_ASSERT(used_ <= converted_->bytes(), "converted weights overflow");
    return converted_->as<uint8_t>() + at;
  }

  const Checkpoint& ckpt_;
  const LayerBlob& blob_;
  const uint8_t* base_;
  DeviceBuffer* converted_;
  bool gemm_bf16_;
  const Stream& stream_;
  std::map<std::string, ops::StoredWeight>* decompressed_;
  uint64_t used_ = 0, largest_deferred_ = 0;
  bool defer_ = false;
  int rank_ = 0, ranks_ = 1;
};

// Shapes only, from the checkpoint's headers: for the sizing runs, which need no weights.
class ShapeBinder final : public model::Binder {
 public:
  explicit ShapeBinder(const Checkpoint& ckpt) : ckpt_(ckpt) {}
  ops::Weight matrix(const std::string& name, const Shape& shape) override {
    return weight(name, shape);
  }
  ops::Weight weight(const std::string& name, const Shape& shape) {
    if (export_weight(ckpt_, name, shape, nullptr, nullptr)) return {nullptr, shape, false};
    if (!ckpt_.has(name)) {
      if (std::optional<SourceWeight> sw = compressed_weight(ckpt_, name)) {
        STRATA_CHECK(sw->shape == shape, ckpt_.dir(), ": '", sw->stored, "' holds ",
                     shape_str(sw->shape), " but config.json implies ", shape_str(shape));
        return {nullptr, shape, false};
      }
    }
    return {nullptr, checked(name, shape), false};
  }
  ops::Weight vector(const std::string& name, const Shape& shape) override {
    return {nullptr, checked(name, shape), true};
  }
  bool has(const std::string& name) const override {
    return ckpt_.has(name) || compressed_weight(ckpt_, name).has_value();
  }
  Shape shape_of(const std::string& name) const override {
    if (!ckpt_.has(name)) {
      if (std::optional<SourceWeight> sw = compressed_weight(ckpt_, name)) return sw->shape;
    }
    return ckpt_.entry(name).shape;
  }

 private:
  const Shape& checked(const std::string& name, const Shape& shape) const {
    STRATA_CHECK(ckpt_.has(name), ckpt_.dir(), ": tensor '", name,
                 "' is missing; the checkpoint does not match its config.json");
    STRATA_CHECK(ckpt_.entry(name).shape == shape, ckpt_.dir(), ": tensor '", name, "' has shape ",
                 shape_str(ckpt_.entry(name).shape), " but config.json implies ", shape_str(shape));
    return shape;
  }
  const Checkpoint& ckpt_;
};

std::string layer_prefix(const std::string& model_prefix, int64_t l) {
  return model_prefix + "layers." + std::to_string(l) + ".";
}

ops::Tokens sizing_tokens(int64_t n) {
  ops::Tokens t;
  t.tokens = n;
  t.seq_bounds = {0, n};
  return t;
}

// What running every layer on the sizing backend finds: the largest working set per token and
// the most observed inputs of a layer.
struct Survey {
  uint64_t bytes_per_token = 0;
  int64_t max_slots = 0;
  uint64_t expert_slot = 0;  // CudaBackend::expert_slot_bytes of the largest routed expert
};
Survey survey_layers(const ModelConfig& c, const Checkpoint& ckpt, const model::Family& family,
                     const std::string& model_prefix, GpuForwardOptions options,
                     Serving serving = {}) {
  // Every layer's sizing run, on the start-up threads (a sizing backend each: a Kimi-K2's 61
  // layers took about 0.3 s in a row, twice a run); the survey is their maxima, whatever the
  // order, and a refusal the first layer's in order (core/parallel.h).
  Survey s;
  std::mutex mu;
  const ops::Tokens t = sizing_tokens(kSizingTokens);
  parallel_chunks(
      static_cast<size_t>(std::max<int64_t>(c.num_hidden_layers, 0)), startup_threads(), 1,
      [&](size_t begin, size_t end) {
        auto be = ops::CudaBackend::sizing(options);
        Survey part;
        for (size_t i = begin; i < end; ++i) {
          const int64_t l = static_cast<int64_t>(i);
          auto layer = family.make_layer(c, l, layer_prefix(model_prefix, l));
          ShapeBinder binder(ckpt);
          // The serving simulation's quantized copies count in the sizing runs'
          // scratch.
          model::ServedBinder served(binder, ckpt, serving.activations, serving.kv_cache);
          layer->bind(served);
          be->clear_slots();
          be->reset_high_water();
          layer->forward(*be, t, nullptr);
          part.bytes_per_token = std::max(part.bytes_per_token,
                                          (be->high_water() + kSizingTokens - 1) / kSizingTokens);
          part.max_slots =
              std::max<int64_t>(part.max_slots, static_cast<int64_t>(be->slot_count()));
        }
        const std::lock_guard<std::mutex> lock(mu);
        s.bytes_per_token = std::max(s.bytes_per_token, part.bytes_per_token);
        s.max_slots = std::max(s.max_slots, part.max_slots);
        s.expert_slot = std::max(s.expert_slot, be->expert_slot_high());
      });
  return s;
}

}  // namespace

struct GpuForward::Impl {
  const ModelConfig& c;
  const Checkpoint& ckpt;
  DeviceBudget& budget;
  const Stream& stream;
  GpuForwardOptions opt;
  Serving serving;
  const model::Family& family;
  std::string model_prefix;
  Survey survey;
  std::unique_ptr<ops::CudaBackend> be;
  DeviceBuffer converted;
  std::map<std::string, ops::StoredWeight> decompressed;  // the current layer's, in `converted`
  std::unique_ptr<model::Layer> layer;
  int64_t max_tokens = 0, max_longest = 0;
  bool defer_experts = false;  // set_expert_slice

  Impl(const ModelConfig& config, const Checkpoint& ck, DeviceBudget& b, const Stream& s,
       GpuForwardOptions o, Serving sv)
      : c(config),
        ckpt(ck),
        budget(b),
        stream(s),
        opt(o),
        serving(sv),
        family(model::family_of(config)),
        model_prefix(model::find_prefixes(config, ck).model) {
    survey = survey_layers(c, ckpt, family, model_prefix, opt, serving);
    be = std::make_unique<ops::CudaBackend>(budget, stream, opt, survey.max_slots,
                                            std::max<int64_t>(c.num_experts, 0));
  }
  // Layer l as a new model::Layer bound to `blob`: with `base` (the blob on the device) its
  // weights converted into `converted` and its decompressed ones recorded; without, only sized.
  // Returns the converted bytes it needs.
  uint64_t bind_layer(std::unique_ptr<model::Layer>& to, int64_t l, const LayerBlob& blob,
                      const uint8_t* base, DeviceBuffer* into,
                      std::map<std::string, ops::StoredWeight>* recorded, bool defer,
                      uint64_t* largest_deferred) const {
    to = family.make_layer(c, l, layer_prefix(model_prefix, l));
    BlobBinder binder(ckpt, blob, base, into, opt.gemm_bf16, stream, recorded);
    binder.hold_experts_of(opt.expert_rank, opt.expert_ranks);
    binder.defer_routed_experts(defer);
    model::ServedBinder served(binder, ckpt, serving.activations, serving.kv_cache);
    to->bind(served);
    if (largest_deferred) *largest_deferred = binder.largest_deferred();
    return binder.used();
  }
  // The forward's own layer (set_layer).
  uint64_t bind(int64_t l, const LayerBlob& blob, const uint8_t* base, bool defer) {
    if (base) decompressed.clear();
    return bind_layer(layer, l, blob, base, &converted, base ? &decompressed : nullptr, defer,
                      nullptr);
  }
};

std::string GpuForward::unsupported(const ModelConfig& config, const Checkpoint& ckpt,
                                    Serving serving) {
  // The first layer tensor in name order whose dtype the device cannot read (on the start-up
  // threads: a Kimi-K2 has 208k tensors).
  const std::vector<std::string> names = ckpt.tensor_names();
  std::atomic<size_t> first_bad{names.size()};
  parallel_chunks(names.size(), startup_threads(), 4096, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end && i < first_bad.load(); ++i) {
      const std::string& n = names[i];
      if (n.find(".layers.") == std::string::npos) continue;
      const DType t = ckpt.entry(n).dtype;
      if (t == DType::kF32 || t == DType::kF16 || t == DType::kBF16) continue;
      // Compressed sources (DeepSeek FP8 blocks, INT4 pack-quantized, MXFP4), their values and
      // companions: decompressed on the device (ops/cuda/convert.h).
      if (compressed_module_of(ckpt, n) || is_compressed_aux(ckpt, n)) continue;
      if (export_tensor(ckpt, n)) continue;  // a ModelOpt export's (strata compare)
      size_t seen = first_bad.load();
      while (i < seen && !first_bad.compare_exchange_weak(seen, i)) {
      }
      return;
    }
  });
  if (first_bad < names.size()) {
    const std::string& n = names[first_bad];
    return str("tensor '", n, "' has dtype ", dtype_name(ckpt.entry(n).dtype),
               " (the GPU forward reads F32, F16 and BF16 weights, DeepSeek FP8 blocks, INT4 "
               "pack-quantized and MXFP4 weights)");
  }
  // Every layer on the sizing backend: the kernels' limits (head sizes, experts per token,
  // router groups) are checked there.
  try {
    const model::Family& family = model::family_of(config);
    survey_layers(config, ckpt, family, model::find_prefixes(config, ckpt).model, {}, serving);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

GpuForward::GpuForward(const ModelConfig& config, const Checkpoint& ckpt, DeviceBudget& budget,
                       const Stream& stream, GpuForwardOptions options, Serving serving)
    : impl_(std::make_unique<Impl>(config, ckpt, budget, stream, options, serving)) {}
GpuForward::~GpuForward() = default;

std::vector<std::vector<std::string>> GpuForward::observed_inputs(const ModelConfig& config,
                                                                  const Checkpoint& ckpt, int64_t l,
                                                                  GpuForwardOptions options) {
  const model::Family& family = model::family_of(config);
  auto layer =
      family.make_layer(config, l, layer_prefix(model::find_prefixes(config, ckpt).model, l));
  ShapeBinder binder(ckpt);
  layer->bind(binder);
  auto be = ops::CudaBackend::sizing(options);
  layer->forward(*be, sizing_tokens(1), nullptr);
  return be->slot_names();
}

std::vector<std::vector<std::string>> GpuForward::layer_tensors(const ModelConfig& config,
                                                                const Checkpoint& ckpt,
                                                                int64_t first, int64_t last) {
  const std::string model_prefix = model::find_prefixes(config, ckpt).model;
  std::vector<std::vector<std::string>> out;
  for (int64_t l = first; l < last; ++l)
    out.push_back(ckpt.tensor_names_with_prefix(layer_prefix(model_prefix, l)));
  return out;
}

std::vector<std::string> GpuForward::layer_tensors(int64_t l) const {
  return impl_->ckpt.tensor_names_with_prefix(layer_prefix(impl_->model_prefix, l));
}

uint64_t GpuForward::bytes_per_token(int64_t longest) const {
  // The survey's one sequence of kSizingTokens counted a keep mask that short; the whole mask
  // for `longest` on top of it is an upper bound.
  const uint64_t keep = impl_->family.keep_mask
                            ? static_cast<uint64_t>((std::max<int64_t>(longest, 0) + 31) / 32) * 4
                            : 0;
  return impl_->survey.bytes_per_token + keep;
}

uint64_t GpuForward::converted_bytes(int64_t l, const LayerBlob& blob, bool defer_experts,
                                     uint64_t* largest_deferred) const {
  // A layer of its own (the forward's is set_layer's), so that layers can be sized on several
  // threads.
  std::unique_ptr<model::Layer> layer;
  return impl_->bind_layer(layer, l, blob, nullptr, nullptr, nullptr,
                           defer_experts && impl_->opt.expert_ranks <= 1, largest_deferred);
}

uint64_t GpuForward::expert_slot_bytes() const {
  return impl_->survey.expert_slot;
}

void GpuForward::set_expert_slice(int64_t experts) {
  Impl& im = *impl_;
  im.defer_experts = experts > 0 && experts < im.c.num_experts && im.opt.expert_ranks <= 1;
  im.be->reserve_expert_slice(im.defer_experts ? experts : 0, im.survey.expert_slot);
}

uint64_t GpuForward::attention_bytes(int64_t longest, uint64_t cap) const {
  if (impl_->opt.warp_attention) return 0;
  return ops::CudaBackend::attention_bytes(impl_->c.num_attention_heads, longest, cap);
}

void GpuForward::reserve(int64_t tokens, int64_t longest, uint64_t attention_cap) {
  Impl& im = *impl_;
  if (attention_bytes(longest, attention_cap) > 0)
    im.be->reserve_attention(im.c.num_attention_heads, longest, attention_cap);
  // A family with a keep mask needs more per token with longer sequences (bytes_per_token).
  if (tokens <= im.max_tokens && (!im.family.keep_mask || longest <= im.max_longest)) return;
  im.max_tokens = std::max(im.max_tokens, tokens);
  im.max_longest = std::max(im.max_longest, longest);
  im.be->reserve_scratch(bytes_per_token(im.max_longest) * static_cast<uint64_t>(im.max_tokens) +
                         (1ull << 20));
}

const ops::StoredWeight* GpuForward::decompressed_weight(const std::string& name) const {
  auto it = impl_->decompressed.find(name);
  return it == impl_->decompressed.end() ? nullptr : &it->second;
}

void GpuForward::set_layer(int64_t l, const LayerBlob& blob, const void* weights) {
  Impl& im = *impl_;
  const uint64_t need = im.bind(l, blob, nullptr, im.defer_experts);
  if (need > im.converted.bytes()) {
    im.stream.synchronize();
    im.converted = DeviceBuffer();
    im.converted = DeviceBuffer(im.budget, need, "converted layer weights");
  }
  im.bind(l, blob, static_cast<const uint8_t*>(weights), im.defer_experts);
  // The layer's observers, every one of them (an expert no token reaches is reported too).
  im.be->clear_slots();
  im.be->begin_sizing();
  im.layer->forward(*im.be, sizing_tokens(1), nullptr);
  im.be->end_sizing();
}

void GpuForward::forward(const GpuChunk& chunk, float* x, bool round_bf16) {
  Impl& im = *impl_;
  STRATA_ASSERT(im.layer && chunk.tokens <= im.max_tokens, "GPU forward: chunk of ", chunk.tokens,
                " tokens, reserved ", im.max_tokens);
  im.layer->forward(*im.be, chunk, x);
  if (round_bf16) im.be->round_bf16(x, chunk.tokens * im.c.hidden_size);
  im.be->phase(ops::Phase::kNorms);
}

void GpuForward::set_expert_exchange(DeviceExpertExchange* exchange) {
  impl_->be->set_expert_exchange(exchange);
}

std::vector<AmaxStat> GpuForward::take_stats() {
  return impl_->be->take_stats();
}

void GpuForward::set_routing_observer(Observer* routing) {
  impl_->be->set_routing_observer(routing);
}

std::vector<SequenceStats> GpuForward::take_sequence_stats() {
  return impl_->be->take_sequence_stats();
}

void GpuForward::track_hessians(std::set<std::string, std::less<>> names) {
  impl_->be->track_hessians(std::move(names));
}

std::vector<HessianStats> GpuForward::take_hessians() {
  return impl_->be->take_hessians();
}

}  // namespace strata::gpu
