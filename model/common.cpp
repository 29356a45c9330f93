#include "model/common.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "core/parallel.h"
#include "io/source_weights.h"
#include "model/arch.h"
#include "quant/fp8.h"
#include "quant/mxfp4.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"

namespace strata::model {

bool has_key(const Json& j, const char* key) {
  return j.is_object() && j.contains(key) && !j[key].is_null();
}

double number_or(const Json& j, const char* key, double fallback) {
  if (!has_key(j, key)) return fallback;
  STRATA_CHECK(j[key].is_number(), "config.json: '", key, "' must be a number");
  return j[key].get<double>();
}

namespace {

// A ModelOpt-quantized weight (strata's own exports, spec/format.md §1, §2, §7), dequantized to
// fp32 [out, in]; an undefined tensor when `name` is not such a weight.
Tensor dequantize_modelopt(const Checkpoint& ckpt, const std::string& name, const Shape& shape) {
  if (!name.ends_with(".weight") || shape.size() != 2) return {};
  const std::string m = name.substr(0, name.size() - 7);
  const Tensor w = ckpt.tensor(name);
  if (!ckpt.has(m + ".weight_scale")) return {};
  const Tensor scale = ckpt.tensor(m + ".weight_scale");
  auto expect = [&](bool ok, const char* what) {
    STRATA_CHECK(ok, ckpt.dir(), ": '", m, "' looks ModelOpt-quantized but ", what,
                 "; the export is damaged");
  };
  if (w.dtype() == DType::kU8 && scale.dtype() == DType::kU8) {  // MXFP4: E2M1 + E8M0 per 32
    expect(w.shape() == Shape{shape[0], shape[1] / 2} &&
               scale.shape() == Shape{shape[0], shape[1] / kMxfp4BlockSize},
           "its MXFP4 tensors have unexpected shapes");
    return mxfp4_dequantize(Mxfp4Weight{w, scale});
  }
  if (w.dtype() == DType::kU8) {  // NVFP4: packed E2M1 + E4M3 block scales + fp32 global scale
    // Blocks of 16, or of 32 (nvfp4_bs32, the nvfp4_mlp_weight_only recipe).
    expect(w.shape() == Shape{shape[0], shape[1] / 2} && scale.dtype() == DType::kF8E4M3 &&
               (scale.shape() == Shape{shape[0], shape[1] / 16} ||
                scale.shape() == Shape{shape[0], shape[1] / 32}) &&
               ckpt.has(m + ".weight_scale_2"),
           "its NVFP4 tensors have unexpected shapes or dtypes");
    Nvfp4Weight q{w, scale, ckpt.tensor(m + ".weight_scale_2")};
    return nvfp4_dequantize(q);
  }
  if (w.dtype() == DType::kF8E4M3 && scale.dtype() == DType::kF32) {
    // FP8 per tensor, or per 128x128 block (fp8_pb_wo: [ceil(out/128), 1, ceil(in/128), 1];
    // a single block's 0-d scale reads as per tensor, which dequantizes alike).
    if (scale.numel() == 1) {
      expect(w.shape() == shape, "its FP8 tensors have unexpected shapes");
      return fp8_dequantize(Fp8Weight{w, scale});
    }
    const int64_t nr = (shape[0] + kFp8PbBlock - 1) / kFp8PbBlock;
    const int64_t nc = (shape[1] + kFp8PbBlock - 1) / kFp8PbBlock;
    expect(w.shape() == shape && scale.shape() == Shape{nr, 1, nc, 1},
           "its FP8 block tensors have unexpected shapes");
    return fp8_pb_dequantize(Fp8Weight{w, scale});
  }
  if (w.dtype() == DType::kF8E4M3 && scale.dtype() == DType::kU8) {  // MXFP8
    expect(w.shape() == shape && scale.shape() == Shape{shape[0], shape[1] / 32},
           "its MXFP8 tensors have unexpected shapes");
    return mxfp8_dequantize(Mxfp8Weight{w, scale});
  }
  return {};
}

}  // namespace

std::vector<float> load_weight(const Checkpoint& ckpt, const std::string& name,
                               const Shape& shape) {
  // A compressed source weight (io/source_weights.h) is decompressed here, one module at a time
  // as its layer is fetched: the same bf16 values the exporter quantizes.
  if (name.ends_with(".weight")) {
    const std::string m = name.substr(0, name.size() - 7);
    if (std::optional<SourceWeight> sw = find_source_weight(ckpt, m);
        sw && sw->compression != SourceCompression::kNone) {
      STRATA_CHECK(sw->shape == shape, ckpt.dir(), ": '", m, "' (",
                   source_compression_name(sw->compression), ") has shape ", shape_str(sw->shape),
                   " but config.json implies ", shape_str(shape));
      return ops::weight_f32(read_source_weight(ckpt, *sw));
    }
  }
  STRATA_CHECK(ckpt.has(name), ckpt.dir(), ": tensor '", name,
               "' is missing; the checkpoint does not match its config.json");
  if (Tensor dq = dequantize_modelopt(ckpt, name, shape); dq.defined()) {
    STRATA_ASSERT(dq.dtype() == DType::kF32 && dq.numel() == shape_numel(shape));
    return ops::weight_f32(dq);
  }
  Tensor t = ckpt.tensor(name);
  STRATA_CHECK(t.shape() == shape, ckpt.dir(), ": tensor '", name, "' has shape ",
               shape_str(t.shape()), " but config.json implies ", shape_str(shape));
  STRATA_CHECK(dtype_is_floating(t.dtype()) && t.dtype() != DType::kE2M1, ckpt.dir(), ": tensor '",
               name, "' has dtype ", dtype_name(t.dtype()),
               ", which the forward cannot read as a weight");
  return ops::weight_f32(t);
}

namespace {

// The F32 scalar `name` of the export, a positive finite number.
float export_scale(const Checkpoint& ckpt, const std::string& name) {
  const Tensor t = ckpt.tensor(name);
  STRATA_CHECK(t.dtype() == DType::kF32 && t.numel() == 1, ckpt.dir(), ": '", name,
               "' is not an F32 scalar; the export is damaged");
  const float v = t.item_f32();
  STRATA_CHECK(std::isfinite(v) && v > 0.0f, ckpt.dir(), ": '", name, "' is ", v,
               ", not a positive finite scale; the export is damaged");
  return v;
}

}  // namespace

ActQuant served_input_quant(const Checkpoint& ckpt, const std::string& weight_name) {
  if (!weight_name.ends_with(".weight")) return {};
  const std::string m = weight_name.substr(0, weight_name.size() - 7);
  if (!ckpt.has(weight_name) || !ckpt.has(m + ".weight_scale")) return {};
  const DType w = ckpt.entry(weight_name).dtype, s = ckpt.entry(m + ".weight_scale").dtype;
  if (w == DType::kF8E4M3 && s == DType::kU8) return {ActQuant::Kind::kMxfp8, 0.0f};
  if (!ckpt.has(m + ".input_scale")) return {};  // weight-only
  const float scale = export_scale(ckpt, m + ".input_scale");
  if (w == DType::kU8 && s == DType::kF8E4M3) return {ActQuant::Kind::kNvfp4, scale};
  if (w == DType::kF8E4M3 && s == DType::kF32) return {ActQuant::Kind::kFp8, scale};
  return {};
}

ops::Weight ServedBinder::matrix(const std::string& name, const Shape& shape) {
  ops::Weight w = inner_.matrix(name, shape);
  if (activations_) w.input_quant = served_input_quant(ckpt_, name);
  return w;
}

ActQuant served_kv_quant(const Checkpoint& ckpt, ActQuant::Kind kv, const std::string& cache) {
  if (kv == ActQuant::Kind::kNone) return {};
  STRATA_ASSERT(kv == ActQuant::Kind::kFp8 || kv == ActQuant::Kind::kNvfp4, "KV cache format");
  const bool k = cache.ends_with(".k_cache");
  STRATA_ASSERT(k || cache.ends_with(".v_cache"), "KV cache name ", cache);
  const std::string name =
      cache.substr(0, cache.size() - 7) + (k ? "k_proj.k_scale" : "v_proj.v_scale");
  const float scale = ckpt.has(name) ? export_scale(ckpt, name) : 1.0f;
  if (kv == ActQuant::Kind::kFp8) return {kv, scale};
  return {kv, nvfp4_input_scale(scale * 448.0f, name)};
}

ops::RopeParams rope_params(const ModelConfig& config) {
  const RopeConfig& r = config.rope;
  ops::RopeParams p;
  p.theta = r.theta;
  p.factor = r.factor;
  p.low_freq_factor = r.low_freq_factor;
  p.high_freq_factor = r.high_freq_factor;
  p.original_max_position = static_cast<double>(r.original_max_position_embeddings);
  p.beta_fast = r.beta_fast;
  p.beta_slow = r.beta_slow;
  p.truncate = r.truncate;
  if (r.type == "default") {
    p.kind = ops::RopeParams::Kind::kDefault;
  } else if (r.type == "linear") {
    p.kind = ops::RopeParams::Kind::kLinear;
  } else if (r.type == "llama3") {
    p.kind = ops::RopeParams::Kind::kLlama3;
    STRATA_CHECK(p.original_max_position > 0, config.path,
                 ": llama3 rope scaling needs original_max_position_embeddings");
  } else if (r.type == "yarn") {
    p.kind = ops::RopeParams::Kind::kYarn;
    STRATA_CHECK(p.original_max_position > 0, config.path,
                 ": yarn rope scaling needs original_max_position_embeddings");
    // cos/sin are scaled by attention_factor; by default 0.1·ln(s) + 1 (or the mscale ratio
    // for DeepSeek-style configs, which is 1 when mscale == mscale_all_dim).
    auto m = [](double s, double ms) { return s <= 1.0 ? 1.0 : 0.1 * ms * std::log(s) + 1.0; };
    if (r.attention_factor) {
      p.attention_factor = *r.attention_factor;
    } else if (r.mscale_all_dim > 0.0) {
      p.attention_factor = m(r.factor, r.mscale) / m(r.factor, r.mscale_all_dim);
    } else {
      p.attention_factor = m(r.factor, 1.0);
    }
  } else {
    fail(config.path, ": rope type '", r.type,
         "' is not supported (supported: default, linear, llama3, yarn); it changes the math, so "
         "strata stops");
  }
  return p;
}

Prefixes find_prefixes(const ModelConfig& config, const Checkpoint& ckpt) {
  ArchInfo arch = resolve_arch(config);
  if (arch.multimodal) {  // however deeply the wrapper nests it (model/arch.h)
    resolve_wrapper_prefixes(arch, ckpt.tensor_names(), ckpt.dir());
    Prefixes out;
    out.model = arch.lm_prefix;
    out.lm_head = arch.head_prefix + "lm_head.weight";
    if (!ckpt.has(out.lm_head)) {
      STRATA_CHECK(config.tie_word_embeddings, ckpt.dir(), ": no <prefix>lm_head.weight and ",
                   "tie_word_embeddings is false in config.json");
      out.lm_head = out.model + "embed_tokens.weight";
    }
    return out;
  }
  for (const char* p : {"model.", "language_model.model.", "model.language_model."}) {
    if (ckpt.has(std::string(p) + "embed_tokens.weight")) {
      Prefixes out;
      out.model = p;
      std::string head = std::string(p) == "model." ? "lm_head.weight"
                         : std::string(p) == "language_model.model."
                             ? "language_model.lm_head.weight"
                             : "lm_head.weight";
      if (!ckpt.has(head)) {
        STRATA_CHECK(config.tie_word_embeddings, ckpt.dir(), ": '", head,
                     "' is missing and tie_word_embeddings is false in config.json");
        head = out.model + "embed_tokens.weight";
      }
      out.lm_head = head;
      return out;
    }
  }
  fail(ckpt.dir(),
       ": no embed_tokens.weight found (looked for model., language_model.model., "
       "model.language_model.)");
}

Ends::Ends(const ModelConfig& config, const Checkpoint& ckpt, const Prefixes& prefixes,
           float norm_offset)
    : ckpt_(ckpt),
      embed_name_(prefixes.model + "embed_tokens.weight"),
      norm_name_(prefixes.model + "norm.weight"),
      head_name_(prefixes.lm_head),
      hidden_(config.hidden_size),
      vocab_(config.vocab_size),
      eps_(static_cast<float>(config.rms_norm_eps)),
      norm_offset_(norm_offset) {}

namespace {

// The embedding table, its shape checked against the config.
Tensor embedding_table(const Checkpoint& ckpt, const std::string& name, int64_t hidden) {
  Tensor e = ckpt.tensor(name);
  STRATA_CHECK(e.ndim() == 2 && e.dim(1) == hidden, ckpt.dir(), ": '", name, "' has shape ",
               shape_str(e.shape()), ", expected [vocab, ", hidden, "]");
  return e;
}

// Runs row(t) for every token of the batch on the start-up threads, after checking every id
// against the table's rows (the first bad id in token order is the one reported).
template <typename Row>
void each_token_row(const Batch& batch, const Tensor& e, const Row& row) {
  for (int64_t t = 0; t < batch.n_tokens(); ++t) {
    const int32_t id = batch.tokens[t];
    STRATA_CHECK(id >= 0 && id < e.dim(0), "token id ", id, " is outside the vocabulary [0, ",
                 e.dim(0), ")");
  }
  parallel_chunks(static_cast<size_t>(batch.n_tokens()), startup_threads(), 256,
                  [&](size_t begin, size_t end) {
                    for (size_t t = begin; t < end; ++t)
                      row(static_cast<int64_t>(t), static_cast<int64_t>(batch.tokens[t]));
                  });
}

}  // namespace

void Ends::embed(const Batch& batch, float* hidden, bool round) const {
  const Tensor e = embedding_table(ckpt_, embed_name_, hidden_);
  const uint16_t* bf16 = e.dtype() == DType::kBF16 ? e.data<uint16_t>() : nullptr;
  const int64_t H = hidden_;
  each_token_row(batch, e, [&](int64_t t, int64_t id) {
    float* row = hidden + t * H;
    if (bf16) {
      // The common case, bit by bit: a bf16 value widens exactly, and rounding it to bf16 again
      // changes only a NaN (to the canonical 0x7FC0, as ops::round_bf16 does).
      const uint16_t* src = bf16 + id * H;
      for (int64_t c = 0; c < H; ++c) {
        const uint16_t v = round && (src[c] & 0x7FFF) > 0x7F80 ? 0x7FC0 : src[c];
        const uint32_t bits = static_cast<uint32_t>(v) << 16;
        std::memcpy(row + c, &bits, 4);
      }
      return;
    }
    for (int64_t c = 0; c < H; ++c)
      row[c] = e.item_f32(id * H + c);
    if (round) ops::round_bf16(row, H);
  });
}

void Ends::embed_bf16(const Batch& batch, uint16_t* hidden) const {
  const Tensor e = embedding_table(ckpt_, embed_name_, hidden_);
  const uint16_t* bf16 = e.dtype() == DType::kBF16 ? e.data<uint16_t>() : nullptr;
  const int64_t H = hidden_;
  each_token_row(batch, e, [&](int64_t t, int64_t id) {
    uint16_t* row = hidden + t * H;
    if (bf16) {
      const uint16_t* src = bf16 + id * H;
      std::memcpy(row, src, static_cast<size_t>(H) * 2);
      for (int64_t c = 0; c < H; ++c)  // a NaN becomes the canonical one, as in embed()
        if ((row[c] & 0x7FFF) > 0x7F80) row[c] = 0x7FC0;
      return;
    }
    for (int64_t c = 0; c < H; ++c)
      row[c] = f32_to_bf16(e.item_f32(id * H + c));
  });
}

namespace {

class HeldHead final : public LogitsHead {
 public:
  HeldHead(std::vector<float> norm_w, std::vector<float> head, int64_t hidden, int64_t vocab,
           float eps, float norm_offset)
      : norm_w_(std::move(norm_w)),
        head_(std::move(head)),
        hidden_(hidden),
        vocab_(vocab),
        eps_(eps),
        norm_offset_(norm_offset) {}
  void logits(const float* hidden, int64_t n, float* out) const override {
    std::vector<float> xn(static_cast<size_t>(n * hidden_));
    ops::rms_norm(hidden, n, hidden_, norm_w_.data(), eps_, xn.data(), norm_offset_);
    ops::linear(xn.data(), n, hidden_, head_.data(), vocab_, out);
  }

 private:
  std::vector<float> norm_w_, head_;
  int64_t hidden_, vocab_;
  float eps_, norm_offset_;
};

}  // namespace

std::unique_ptr<LogitsHead> Ends::head() const {
  return std::make_unique<HeldHead>(load_weight(ckpt_, norm_name_, {hidden_}),
                                    load_weight(ckpt_, head_name_, {vocab_, hidden_}), hidden_,
                                    vocab_, eps_, norm_offset_);
}

void Ends::logits(const float* hidden, int64_t n_tokens, float* out) const {
  head()->logits(hidden, n_tokens, out);
}

}  // namespace strata::model
