#include "model/common.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "io/source_weights.h"
#include "model/arch.h"
#include "quant/fp8.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"

namespace strata::model {

bool has_tensor(const Checkpoint& ckpt, const std::string& name) {
  return ckpt.has(name);
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
  if (w.dtype() == DType::kU8) {  // NVFP4: packed E2M1 + E4M3 block scales + fp32 global scale
    expect(w.shape() == Shape{shape[0], shape[1] / 2} && scale.dtype() == DType::kF8E4M3 &&
               scale.shape() == Shape{shape[0], shape[1] / 16} && ckpt.has(m + ".weight_scale_2"),
           "its NVFP4 tensors have unexpected shapes or dtypes");
    Nvfp4Weight q{w, scale, ckpt.tensor(m + ".weight_scale_2")};
    return nvfp4_dequantize(q);
  }
  if (w.dtype() == DType::kF8E4M3 && scale.dtype() == DType::kF32) {  // FP8 per tensor
    expect(w.shape() == shape && scale.numel() == 1, "its FP8 tensors have unexpected shapes");
    return fp8_dequantize(Fp8Weight{w, scale});
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

Ends::Ends(const ModelConfig& config, const Checkpoint& ckpt, const Prefixes& prefixes)
    : ckpt_(ckpt),
      embed_name_(prefixes.model + "embed_tokens.weight"),
      norm_name_(prefixes.model + "norm.weight"),
      head_name_(prefixes.lm_head),
      hidden_(config.hidden_size),
      vocab_(config.vocab_size),
      eps_(static_cast<float>(config.rms_norm_eps)) {}

void Ends::embed(const Batch& batch, float* hidden, bool round) const {
  Tensor e = ckpt_.tensor(embed_name_);
  STRATA_CHECK(e.ndim() == 2 && e.dim(1) == hidden_, ckpt_.dir(), ": '", embed_name_,
               "' has shape ", shape_str(e.shape()), ", expected [vocab, ", hidden_, "]");
  const uint16_t* bf16 = e.dtype() == DType::kBF16 ? e.data<uint16_t>() : nullptr;
  for (int64_t t = 0; t < batch.n_tokens(); ++t) {
    const int32_t id = batch.tokens[t];
    STRATA_CHECK(id >= 0 && id < e.dim(0), "token id ", id, " is outside the vocabulary [0, ",
                 e.dim(0), ")");
    float* row = hidden + t * hidden_;
    if (bf16) {
      // The common case, bit by bit: a bf16 value widens exactly, and rounding it to bf16 again
      // changes only a NaN (to the canonical 0x7FC0, as ops::round_bf16 does).
      const uint16_t* src = bf16 + id * hidden_;
      for (int64_t c = 0; c < hidden_; ++c) {
        const uint16_t v = round && (src[c] & 0x7FFF) > 0x7F80 ? 0x7FC0 : src[c];
        const uint32_t bits = static_cast<uint32_t>(v) << 16;
        std::memcpy(row + c, &bits, 4);
      }
      continue;
    }
    for (int64_t c = 0; c < hidden_; ++c)
      row[c] = e.item_f32(id * hidden_ + c);
  }
  if (round && !bf16) ops::round_bf16(hidden, batch.n_tokens() * hidden_);
}

void Ends::logits(const float* hidden, int64_t n_tokens, float* out) const {
  std::vector<float> norm_w = load_weight(ckpt_, norm_name_, {hidden_});
  std::vector<float> head = load_weight(ckpt_, head_name_, {vocab_, hidden_});
  std::vector<float> xn(static_cast<size_t>(n_tokens * hidden_));
  ops::rms_norm(hidden, n_tokens, hidden_, norm_w.data(), eps_, xn.data());
  ops::linear(xn.data(), n_tokens, hidden_, head.data(), vocab_, out);
}

SwigluWeights swiglu_names(const std::string& gate, const std::string& up, const std::string& down,
                           int64_t inter) {
  SwigluWeights w;
  w.gate_name = gate;
  w.up_name = up;
  w.down_name = down;
  w.inter = inter;
  return w;
}

bool holds_expert(const ExpertExchange* exchange, int64_t e, int64_t experts) {
  return !exchange || expert_owner(e, experts, exchange->ranks()) == exchange->rank();
}

SwigluWeights load_swiglu(const Checkpoint& ckpt, const std::string& gate, const std::string& up,
                          const std::string& down, int64_t hidden, int64_t inter) {
  SwigluWeights w = swiglu_names(gate, up, down, inter);
  w.gate = load_weight(ckpt, gate + ".weight", {inter, hidden});
  w.up = load_weight(ckpt, up + ".weight", {inter, hidden});
  w.down = load_weight(ckpt, down + ".weight", {hidden, inter});
  return w;
}

void swiglu_mlp(const SwigluWeights& w, const float* x, int64_t rows, int64_t hidden, float* out,
                Observer* observer) {
  if (observer) {
    observer->observe(w.gate_name, x, rows, hidden);
    observer->observe(w.up_name, x, rows, hidden);
  }
  std::vector<float> g(static_cast<size_t>(rows * w.inter)), u(g.size());
  ops::linear(x, rows, hidden, w.gate.data(), w.inter, g.data());
  ops::linear(x, rows, hidden, w.up.data(), w.inter, u.data());
  ops::swiglu(g.data(), u.data(), rows * w.inter, g.data());
  if (observer) observer->observe(w.down_name, g.data(), rows, w.inter);
  ops::linear(g.data(), rows, w.inter, w.down.data(), hidden, out);
}

void residual_layer(int64_t T, int64_t H, float eps, const std::vector<float>& in_norm,
                    const std::vector<float>& post_norm, float* x, const SubLayer& mixer,
                    const SubLayer& ffn) {
  std::vector<float> n(T * H), y(T * H);  // [T, H]
  ops::rms_norm(x, T, H, in_norm.data(), eps, n.data());
  mixer(n.data(), y.data());
  for (int64_t i = 0; i < T * H; ++i)
    x[i] += y[i];
  ops::rms_norm(x, T, H, post_norm.data(), eps, n.data());
  ffn(n.data(), y.data());
  for (int64_t i = 0; i < T * H; ++i)
    x[i] += y[i];
}

namespace {

// Expert e on rows[0, count) of in [count, H] into out [count, H].
void run_expert(const SwigluWeights& expert, const float* in, int64_t count, int64_t H, float* out,
                Observer* observer) {
  STRATA_ASSERT(count == 0 || !expert.gate.empty(), "expert ", expert.gate_name,
                " is not held by this rank");
  swiglu_mlp(expert, in, count, H, out, observer);
}

// slot_out [T*K, H] = the output of expert chosen[s] on row s / K of n, for every slot s; each
// expert runs on the slots routed to it in increasing order.
void experts_local(const std::vector<SwigluWeights>& experts, const float* n, int64_t T, int64_t H,
                   int64_t K, const std::vector<int32_t>& chosen, float* slot_out,
                   Observer* observer) {
  for (int64_t e = 0; e < static_cast<int64_t>(experts.size()); ++e) {
    std::vector<int64_t> slots;  // t*K + j routed to e
    for (int64_t s = 0; s < T * K; ++s) {
      if (chosen[s] == e) slots.push_back(s);
    }
    const int64_t rows = static_cast<int64_t>(slots.size());
    std::vector<float> in(rows * H), out(rows * H);  // [rows, H]
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(n + (slots[r] / K) * H, H, &in[r * H]);
    run_expert(experts[e], in.data(), rows, H, out.data(), observer);
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(&out[r * H], H, &slot_out[slots[r] * H]);
  }
}

// The same with the experts spread over ranks. Dispatch rows are [i32 expert | H x f32]; each
// rank sends, in rank order, its slots grouped by expert (ascending: the owners' ranges are
// contiguous) and in increasing slot order within an expert. The owner runs each of its experts
// once per source rank on that rank's rows, then returns [H x f32] rows in the order received.
void experts_exchanged(const std::vector<SwigluWeights>& experts, const float* n, int64_t T,
                       int64_t H, int64_t K, const std::vector<int32_t>& chosen, float* slot_out,
                       Observer* observer, ExpertExchange& exchange) {
  const int ranks = exchange.ranks(), me = exchange.rank();
  const int64_t E = static_cast<int64_t>(experts.size());
  std::vector<int64_t> order;  // slots in send order
  std::vector<int64_t> send_counts(static_cast<size_t>(ranks), 0);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t s = 0; s < T * K; ++s) {
      if (chosen[s] != e) continue;
      order.push_back(s);
      ++send_counts[static_cast<size_t>(expert_owner(e, E, ranks))];
    }
  }
  const size_t in_bytes = sizeof(int32_t) + static_cast<size_t>(H) * sizeof(float);
  const size_t out_bytes = static_cast<size_t>(H) * sizeof(float);
  std::vector<uint8_t> send(order.size() * in_bytes);
  for (size_t i = 0; i < order.size(); ++i) {
    const int32_t e = chosen[static_cast<size_t>(order[i])];
    std::memcpy(&send[i * in_bytes], &e, sizeof e);
    std::memcpy(&send[i * in_bytes + sizeof e], n + (order[i] / K) * H, out_bytes);
  }
  std::vector<int64_t> recv_counts;
  const std::vector<uint8_t> recv =
      exchange.alltoallv_rows(send, send_counts, in_bytes, &recv_counts);
  const size_t received = recv.size() / in_bytes;
  std::vector<uint8_t> results(received * out_bytes);
  // Per source rank j, rows [first, first + recv_counts[j]), runs of one expert each.
  size_t first = 0;
  for (int j = 0; j < ranks; ++j) {
    const size_t end = first + static_cast<size_t>(recv_counts[static_cast<size_t>(j)]);
    size_t at = first;
    for (int64_t e = 0; e < E; ++e) {
      if (expert_owner(e, E, ranks) != me) continue;
      size_t stop = at;
      while (stop < end) {
        int32_t tag = 0;
        std::memcpy(&tag, &recv[stop * in_bytes], sizeof tag);
        if (tag != e) break;
        ++stop;
      }
      const int64_t rows = static_cast<int64_t>(stop - at);
      std::vector<float> in(rows * H), out(rows * H);  // [rows, H]
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(&in[r * H], &recv[(at + r) * in_bytes + sizeof(int32_t)], out_bytes);
      run_expert(experts[e], in.data(), rows, H, out.data(), observer);
      if (rows > 0) std::memcpy(&results[at * out_bytes], out.data(), rows * out_bytes);
      at = stop;
    }
    STRATA_ASSERT(at == end, "rank ", j, " sent rows for experts rank ", me, " does not hold");
    first = end;
  }
  std::vector<int64_t> back_counts;
  const std::vector<uint8_t> back =
      exchange.alltoallv_rows(results, recv_counts, out_bytes, &back_counts);
  STRATA_ASSERT(back_counts == send_counts, "expert results came back in other counts");
  for (size_t i = 0; i < order.size(); ++i)
    std::memcpy(&slot_out[order[i] * H], &back[i * out_bytes], out_bytes);
}

}  // namespace

void moe_dispatch_combine(const std::vector<SwigluWeights>& experts, const float* n, int64_t T,
                          int64_t H, int64_t K, const std::vector<int32_t>& chosen,
                          const std::vector<float>& weight, float* y, Observer* observer,
                          ExpertExchange* exchange) {
  std::vector<float> slot_out(T * K * H);  // [T, K, H]
  if (exchange && exchange->ranks() > 1) {
    experts_exchanged(experts, n, T, H, K, chosen, slot_out.data(), observer, *exchange);
  } else {
    experts_local(experts, n, T, H, K, chosen, slot_out.data(), observer);
  }
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < H; ++c) {
      float acc = 0.0f;
      for (int64_t j = 0; j < K; ++j)
        acc += weight[t * K + j] * slot_out[(t * K + j) * H + c];
      y[t * H + c] = acc;
    }
  }
}

}  // namespace strata::model

namespace strata::model {

GqaAttention GqaAttention::load(const ModelConfig& c, const Checkpoint& ckpt,
                                const std::string& prefix) {
  GqaAttention a;
  a.prefix = prefix;
  a.hidden = c.hidden_size;
  a.n_heads = c.num_attention_heads;
  a.n_kv = c.num_key_value_heads;
  a.head_dim = c.head_dim;
  STRATA_CHECK(a.n_kv > 0 && a.n_heads % a.n_kv == 0, c.path, ": num_attention_heads (", a.n_heads,
               ") must be a multiple of num_key_value_heads (", a.n_kv, ")");
  const int64_t qd = a.n_heads * a.head_dim, kd = a.n_kv * a.head_dim;
  a.wq = load_weight(ckpt, prefix + "q_proj.weight", {qd, a.hidden});
  a.wk = load_weight(ckpt, prefix + "k_proj.weight", {kd, a.hidden});
  a.wv = load_weight(ckpt, prefix + "v_proj.weight", {kd, a.hidden});
  a.wo = load_weight(ckpt, prefix + "o_proj.weight", {a.hidden, qd});
  if (ckpt.has(prefix + "q_proj.bias")) {
    a.bq = load_weight(ckpt, prefix + "q_proj.bias", {qd});
    a.bk = load_weight(ckpt, prefix + "k_proj.bias", {kd});
    a.bv = load_weight(ckpt, prefix + "v_proj.bias", {kd});
  }
  if (ckpt.has(prefix + "q_norm.weight")) {
    a.q_norm = load_weight(ckpt, prefix + "q_norm.weight", {a.head_dim});
    a.k_norm = load_weight(ckpt, prefix + "k_norm.weight", {a.head_dim});
    a.qk_norm_eps = static_cast<float>(c.rms_norm_eps);
  }
  a.rope = rope_params(c);
  a.inv_freq = ops::rope_inv_freq(a.rope, a.head_dim);
  return a;
}

void GqaAttention::forward(const Batch& batch, const float* x, float* out,
                           Observer* observer) const {
  const int64_t T = batch.n_tokens(), d = head_dim;
  const int64_t qd = n_heads * d, kd = n_kv * d;
  if (observer) {
    for (const char* m : {"q_proj", "k_proj", "v_proj"})
      observer->observe(prefix + m, x, T, hidden);
  }
  std::vector<float> q(T * qd), k(T * kd), v(T * kd);  // [T, nH, d], [T, nKV, d], [T, nKV, d]
  ops::linear(x, T, hidden, wq.data(), qd, q.data(), bq.empty() ? nullptr : bq.data());
  ops::linear(x, T, hidden, wk.data(), kd, k.data(), bk.empty() ? nullptr : bk.data());
  ops::linear(x, T, hidden, wv.data(), kd, v.data(), bv.empty() ? nullptr : bv.data());
  if (!q_norm.empty()) {  // per-head RMSNorm over d, before RoPE
    ops::rms_norm(q.data(), T * n_heads, d, q_norm.data(), qk_norm_eps, q.data());
    ops::rms_norm(k.data(), T * n_kv, d, k_norm.data(), qk_norm_eps, k.data());
  }
  ops::rope(q.data(), T, n_heads, d, 0, d, batch.positions.data(), inv_freq, rope.attention_factor,
            false);
  ops::rope(k.data(), T, n_kv, d, 0, d, batch.positions.data(), inv_freq, rope.attention_factor,
            false);
  const std::string layer_prefix = prefix;  // "model.layers.N.self_attn."
  if (observer) {
    observer->observe(layer_prefix + "k_cache", k.data(), T, kd);
    observer->observe(layer_prefix + "v_cache", v.data(), T, kd);
  }
  std::vector<float> attn(T * qd);  // [T, nH, d]
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t s = 0; s < batch.n_seqs(); ++s) {
    const int64_t b = batch.seq_offsets[s], len = batch.seq_offsets[s + 1] - b;
    ops::attention_causal(q.data() + b * qd, qd, k.data() + b * kd, kd, v.data() + b * kd, kd, len,
                          n_heads, n_kv, d, d, scale, attn.data() + b * qd);
  }
  if (observer) observer->observe(prefix + "o_proj", attn.data(), T, qd);
  ops::linear(attn.data(), T, qd, wo.data(), hidden, out);
}

}  // namespace strata::model
