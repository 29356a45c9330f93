#include "model/blocks.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/common.h"

namespace strata::model {
namespace {

int64_t int_or(const Json& j, const char* key, int64_t fallback, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  STRATA_CHECK(j[key].is_number_integer(), path, ": '", key, "' must be an integer");
  return j[key].get<int64_t>();
}

int64_t longest_sequence(const ops::Tokens& t) {
  int64_t n = 0;
  for (int64_t s = 0; s < t.n_seqs(); ++s)
    n = std::max(n, t.seq_bounds[s + 1] - t.seq_bounds[s]);
  return n;
}

}  // namespace

ops::Mlp bind_mlp(Binder& b, const std::string& prefix, int64_t hidden, int64_t inter,
                  MlpLeaves leaves, bool held) {
  ops::Mlp m;
  m.hidden = hidden;
  m.inter = inter;
  const std::string gate = prefix + leaves.gate, up = prefix + leaves.up,
                    down = prefix + leaves.down;
  m.gate_up_names = {gate, up};
  m.down_names = {down};
  if (!held) return m;
  m.gate = b.matrix(gate + ".weight", {inter, hidden});
  m.up = b.matrix(up + ".weight", {inter, hidden});
  m.down = b.matrix(down + ".weight", {hidden, inter});
  return m;
}

void Residual::bind(Binder& b, const ModelConfig& c, const std::string& p) {
  H = c.hidden_size;
  eps = static_cast<float>(c.rms_norm_eps);
  in_norm = b.vector(p + "input_layernorm.weight", {H});
  post_norm = b.vector(p + "post_attention_layernorm.weight", {H});
}

// ---- GQA ---------------------------------------------------------------------------------------

void GqaAttention::bind(Binder& b, const ModelConfig& c, const std::string& p, GqaOptions options) {
  H = c.hidden_size;
  n_heads = c.num_attention_heads;
  n_kv = c.num_key_value_heads;
  head_dim = c.head_dim;
  STRATA_CHECK(n_kv > 0 && n_heads % n_kv == 0, c.path, ": num_attention_heads (", n_heads,
               ") must be a multiple of num_key_value_heads (", n_kv, ")");
  const double factor = options.partial_rotary_factor < 0 ? c.rope.partial_rotary_factor
                                                          : options.partial_rotary_factor;
  rot_dim = static_cast<int64_t>(static_cast<double>(head_dim) * factor);
  STRATA_CHECK(rot_dim >= 2 && rot_dim % 2 == 0 && rot_dim <= head_dim, c.path,
               ": partial_rotary_factor ", factor, " rotates ", rot_dim, " of head_dim ", head_dim,
               " dims; RoPE needs an even number of them, at least 2");
  qk_norm_all_heads = options.qk_norm_all_heads;
  output_gate = options.output_gate;
  const int64_t qd = n_heads * head_dim, kd = n_kv * head_dim, qgd = output_gate ? 2 * qd : qd;
  wq = b.matrix(p + "q_proj.weight", {qgd, H});
  wk = b.matrix(p + "k_proj.weight", {kd, H});
  wv = b.matrix(p + "v_proj.weight", {kd, H});
  wo = b.matrix(p + "o_proj.weight", {H, qd});
  if (b.has(p + "q_proj.bias")) {
    bq = b.vector(p + "q_proj.bias", {qgd});
    bk = b.vector(p + "k_proj.bias", {kd});
    bv = b.vector(p + "v_proj.bias", {kd});
  }
  if (b.has(p + "o_proj.bias")) bo = b.vector(p + "o_proj.bias", {H});
  if (b.has(p + "q_norm.weight")) {
    q_norm = b.vector(p + "q_norm.weight", {qk_norm_all_heads ? qd : head_dim});
    k_norm = b.vector(p + "k_norm.weight", {qk_norm_all_heads ? kd : head_dim});
    qk_norm_eps = static_cast<float>(c.rms_norm_eps);
  }
  const ops::RopeParams rope = rope_params(c);
  attention_factor = rope.attention_factor;
  inv_freq = ops::rope_inv_freq(rope, rot_dim);
  qkv_names = {p + "q_proj", p + "k_proj", p + "v_proj"};
  k_cache = {p + "k_cache"};
  v_cache = {p + "v_cache"};
  o_names = {p + "o_proj"};
  k_quant = b.kv_quant(k_cache[0]);
  v_quant = b.kv_quant(v_cache[0]);
}

void GqaAttention::forward(ops::Backend& be, const ops::Tokens& t, const float* x,
                           float* out) const {
  const int64_t T = t.tokens, d = head_dim, qd = n_heads * d, kd = n_kv * d;
  be.observe(qkv_names, x, T, H);
  float* q = be.take(T * qd);                             // [T, nH, d]
  float* k = be.take(T * kd);                             // [T, nKV, d]
  float* v = be.take(T * kd);                             // [T, nKV, d]
  float* att = be.take(T * qd);                           // [T, nH, d]
  float* qg = output_gate ? be.take(2 * T * qd) : q;      // [T, nH, 2d]: query | gate per head
  float* gate = output_gate ? be.take(T * qd) : nullptr;  // [T, nH, d]
  auto bias = [](const ops::Weight& w) { return w.defined() ? &w : nullptr; };
  be.linears(x, T, {{&wq, qg, bias(bq)}, {&wk, k, bias(bk)}, {&wv, v, bias(bv)}});
  if (output_gate && T > 0) {  // rows (token, head) of 2d: the query's d, then the gate's d
    // (no tokens on an expert-parallel rank: no offsets into empty, null scratch)
    be.copy_cols(qg, 2 * d, q, d, T * n_heads, d);
    be.copy_cols(qg + d, 2 * d, gate, d, T * n_heads, d);
  }
  if (q_norm.defined() && qk_norm_all_heads) {  // RMSNorm over each token's nH·d (nKV·d)
    be.rms_norm(q, T, qd, q_norm, qk_norm_eps, q);
    be.rms_norm(k, T, kd, k_norm, qk_norm_eps, k);
  } else if (q_norm.defined()) {  // per-head RMSNorm over d, before RoPE
    be.rms_norm(q, T * n_heads, d, q_norm, qk_norm_eps, q);
    be.rms_norm(k, T * n_kv, d, k_norm, qk_norm_eps, k);
  }
  be.rope(q, t, n_heads, d, 0, rot_dim, inv_freq, attention_factor, false);
  be.rope(k, t, n_kv, d, 0, rot_dim, inv_freq, attention_factor, false);
  be.observe(k_cache, k, T, kd);
  be.observe(v_cache, v, T, kd);
  be.observe_sequences(k_cache[0], k, t, {n_kv, d});  // the affine KV cache's biases
  be.observe_sequences(v_cache[0], v, t, {n_kv, d});
  if (k_quant.on()) be.fake_quantize(k, T * n_kv, d, k_quant, k_cache[0]);  // per head [T·nKV, d]
  if (v_quant.on()) be.fake_quantize(v, T * n_kv, d, v_quant, v_cache[0]);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  ops::AttentionVariant variant;
  variant.window = window;
  variant.sinks = sinks.defined() ? &sinks : nullptr;
  variant.eager = eager;
  be.attention(t, q, qd, k, kd, v, kd, n_heads, n_kv, d, d, scale, att, variant);
  if (output_gate) be.mul_sigmoid(att, gate, T * qd);
  be.observe(o_names, att, T, qd);
  be.linear(att, T, wo, out, bo.defined() ? &bo : nullptr);
}

// ---- MLA ---------------------------------------------------------------------------------------

MlaParams mla_params(const ModelConfig& c, bool nope) {
  MlaParams m;
  m.nope = nope;
  m.H = c.hidden_size;
  m.nH = c.num_attention_heads;
  m.q_rank = c.q_lora_rank;
  m.kv_rank = c.kv_lora_rank;
  m.dn = c.qk_nope_head_dim;
  m.dr = c.qk_rope_head_dim;
  m.dv = c.v_head_dim;
  STRATA_CHECK(m.kv_rank > 0 && m.dr > 0 && m.dr % 2 == 0 && m.dv > 0, c.path,
               ": MLA needs kv_lora_rank, an even qk_rope_head_dim and v_head_dim");
  double s = 1.0 / std::sqrt(static_cast<double>(m.dn + m.dr));
  if (nope) {
    m.scale = static_cast<float>(s);
    return m;
  }
  ops::RopeParams rp = rope_params(c);
  m.inv_freq = ops::rope_inv_freq(rp, m.dr);
  m.attention_factor = rp.attention_factor;
  const Json& t = c.text;
  m.interleaved = !t.contains("rope_interleave") || t["rope_interleave"].is_null() ||
                  t["rope_interleave"].get<bool>();
  if (c.rope.type == "yarn" && c.rope.mscale_all_dim > 0.0 && c.rope.factor > 1.0) {
    const double ms = 0.1 * c.rope.mscale_all_dim * std::log(c.rope.factor) + 1.0;
    s *= ms * ms;
  }
  m.scale = static_cast<float>(s);
  return m;
}

void LightningIndexer::bind(Binder& b, const ModelConfig& c, const std::string& p,
                            const MlaParams& mla) {
  // DeepseekV32Config's defaults where the config is silent.
  H = mla.H;
  q_rank = mla.q_rank;
  n_heads = int_or(c.text, "index_n_heads", 64, c.path);
  head_dim = int_or(c.text, "index_head_dim", 128, c.path);
  top_k = int_or(c.text, "index_topk", 2048, c.path);
  rope_dim = mla.dr;
  STRATA_CHECK(q_rank > 0, c.path, ": the lightning indexer reads q_a_proj's output; q_lora_rank ",
               "must be set");
  STRATA_CHECK(n_heads >= 1 && top_k >= 1, c.path,
               ": index_n_heads and index_topk must be positive");
  STRATA_CHECK(head_dim >= rope_dim, c.path, ": index_head_dim (", head_dim,
               ") must hold the qk_rope_head_dim (", rope_dim, ") dims RoPE rotates");
  STRATA_CHECK(!mla.nope, c.path, ": the lightning indexer needs RoPE");
  inv_freq = mla.inv_freq;
  attention_factor = mla.attention_factor;
  wq_b = b.matrix(p + "wq_b.weight", {n_heads * head_dim, q_rank});
  wk = b.matrix(p + "wk.weight", {head_dim, H});
  k_norm = b.vector(p + "k_norm.weight", {head_dim});
  k_norm_bias = b.vector(p + "k_norm.bias", {head_dim});
  weights_proj = b.vector(p + "weights_proj.weight", {n_heads, H});
  q_names = {p + "wq_b"};
  x_names = {p + "wk", p + "weights_proj"};
}

bool LightningIndexer::forward(ops::Backend& be, const ops::Tokens& t, const float* x,
                               const float* cq, int32_t* keep, int64_t words) const {
  const int64_t T = t.tokens, d = head_dim;
  be.observe(x_names, x, T, H);
  be.observe(q_names, cq, T, q_rank);
  ops::ScratchScope scope(be);
  // Taken even when unused, so that the GPU's sizing run (one short sequence) counts them.
  float* q = be.take(T * n_heads * d);  // [T, nI, d]
  float* k = be.take(T * d);            // [T, d]
  float* w = be.take(T * n_heads);      // [T, nI]
  // A query with at most top_k causal keys keeps them all: nothing to select.
  if (longest_sequence(t) <= top_k) return false;
  be.linear(cq, T, wq_b, q);
  be.linears(x, T, {{&wk, k}, {&weights_proj, w}});
  be.layer_norm(k, T, d, k_norm, k_norm_bias, 1e-6f, k);
  be.rope(q, t, n_heads, d, 0, rope_dim, inv_freq, attention_factor, false);
  be.rope(k, t, 1, d, 0, rope_dim, inv_freq, attention_factor, false);
  // transformers multiplies by Python floats: head_dim ** -0.5 and n_heads ** -0.5, in fp32.
  const float scale = static_cast<float>(std::pow(static_cast<double>(d), -0.5));
  const float w_scale = static_cast<float>(std::pow(static_cast<double>(n_heads), -0.5));
  be.index_topk(t, q, k, w, n_heads, d, scale, w_scale, top_k, keep, words);
  return true;
}

void MlaAttention::bind(Binder& b, const ModelConfig& c, const std::string& p, bool no_rope,
                        bool with_indexer) {
  static_cast<MlaParams&>(*this) = mla_params(c, no_rope);
  indexed = with_indexer;
  if (indexed) indexer.bind(b, c, p + "indexer.", *this);
  const int64_t dq = dn + dr;
  if (q_rank > 0) {
    wqa = b.matrix(p + "q_a_proj.weight", {q_rank, H});
    q_a_norm = b.vector(p + "q_a_layernorm.weight", {q_rank});
    wqb = b.matrix(p + "q_b_proj.weight", {nH * dq, q_rank});
  } else {
    wq = b.matrix(p + "q_proj.weight", {nH * dq, H});
  }
  wkva = b.matrix(p + "kv_a_proj_with_mqa.weight", {kv_rank + dr, H});
  kv_a_norm = b.vector(p + "kv_a_layernorm.weight", {kv_rank});
  wkvb = b.matrix(p + "kv_b_proj.weight", {nH * (dn + dv), kv_rank});
  wo = b.matrix(p + "o_proj.weight", {H, nH * dv});
  in_names = {p + (q_rank > 0 ? "q_a_proj" : "q_proj"), p + "kv_a_proj_with_mqa"};
  qb_names = {p + "q_b_proj"};
  kvb_names = {p + "kv_b_proj"};
  k_cache = {p + "k_cache"};
  v_cache = {p + "v_cache"};
  o_names = {p + "o_proj"};
  k_quant = b.kv_quant(k_cache[0]);
  v_quant = b.kv_quant(v_cache[0]);
}

void MlaAttention::forward(ops::Backend& be, const ops::Tokens& t, const float* x,
                           float* out) const {
  const int64_t T = t.tokens, dq = dn + dr, dkv = kv_rank + dr;
  // An expert-parallel rank can hold no tokens of a batch: nothing to compute, and the column
  // offsets below must not be applied to empty (null) scratch.
  if (T == 0) return;
  be.observe(in_names, x, T, H);
  float* q = be.take(T * nH * dq);                        // [T, nH, dn + dr]
  float* ckr = be.take(T * dkv);                          // [T, r_kv + dr]
  float* kv = be.take(T * nH * (dn + dv));                // [T, nH, dn + dv]
  float* k = be.take(T * nH * dq);                        // [T, nH, dn + dr]
  float* v = be.take(T * nH * dv);                        // [T, nH, dv]
  float* att = be.take(T * nH * dv);                      // [T, nH, dv]
  float* cq = be.take(T * std::max<int64_t>(q_rank, 1));  // [T, r_q]
  float* c = be.take(T * kv_rank);                        // [T, r_kv]
  float* kr = be.take(T * dr);                            // [T, dr]
  if (q_rank > 0) {
    be.linears(x, T, {{&wqa, cq}, {&wkva, ckr}});
    be.rms_norm(cq, T, q_rank, q_a_norm, 1e-6f, cq);
    be.observe(qb_names, cq, T, q_rank);
    be.linear(cq, T, wqb, q);
  } else {
    be.linears(x, T, {{&wq, q}, {&wkva, ckr}});
  }
  be.copy_cols(ckr, dkv, c, kv_rank, T, kv_rank);
  be.copy_cols(ckr + kv_rank, dkv, kr, dr, T, dr);
  be.rms_norm(c, T, kv_rank, kv_a_norm, 1e-6f, c);
  be.observe(kvb_names, c, T, kv_rank);
  be.linear(c, T, wkvb, kv);
  if (!nope) {
    be.rope(q, t, nH, dq, dn, dr, inv_freq, attention_factor, interleaved);
    be.rope(kr, t, 1, dr, 0, dr, inv_freq, attention_factor, interleaved);
  }
  be.mla_kv(kv, kr, T, nH, dn, dr, dv, k, v);
  be.observe(k_cache, k, T, nH * dq);
  be.observe(v_cache, v, T, nH * dv);
  // The affine KV cache's biases; K's rope part as transformers holds it (de-interleaved).
  be.observe_sequences(k_cache[0], k, t, {nH, dq, interleaved && !nope ? dn : -1});
  be.observe_sequences(v_cache[0], v, t, {nH, dv});
  if (k_quant.on()) be.fake_quantize(k, T * nH, dq, k_quant, k_cache[0]);  // per head [T·nH, dq]
  if (v_quant.on()) be.fake_quantize(v, T * nH, dv, v_quant, v_cache[0]);
  ops::AttentionVariant sparse;
  if (indexed) {
    const int64_t words = (longest_sequence(t) + 31) / 32;
    int32_t* keep = be.take_i32(T * words);  // [T, words]
    if (indexer.forward(be, t, x, cq, keep, words)) {
      sparse.keep = keep;
      sparse.keep_words = words;
    }
  }
  be.attention(t, q, nH * dq, k, nH * dq, v, nH * dv, nH, nH, dq, dv, scale, att, sparse);
  be.observe(o_names, att, T, nH * dv);
  be.linear(att, T, wo, out);
}

// ---- MoE ---------------------------------------------------------------------------------------

void SoftmaxMoe::bind(Binder& b, const std::string& block, int64_t hidden, int64_t n_experts,
                      int64_t top_k, int64_t inter, bool renorm, MlpLeaves leaves,
                      const std::string& config_path) {
  H = hidden;
  E = n_experts;
  K = top_k;
  renormalize = renorm;
  STRATA_CHECK(K > 0 && K <= E, config_path, ": num_experts_per_tok (", K,
               ") must be in [1, num_experts = ", E, "]");
  router = b.vector(block + "gate.weight", {E, H});
  router_name = block + "gate";
  experts.clear();
  experts.reserve(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    experts.push_back(bind_mlp(b, block + "experts." + std::to_string(e) + ".", H, inter, leaves,
                               b.holds_expert(e, E)));
  if (b.has(block + "shared_expert.gate_proj.weight")) {
    const int64_t is = b.shape_of(block + "shared_expert.gate_proj.weight")[0];
    shared = bind_mlp(b, block + "shared_expert.", H, is);
    shared_gate = b.vector(block + "shared_expert_gate.weight", {1, H});
  }
}

void SoftmaxMoe::forward(ops::Backend& be, const float* n, int64_t T, float* y) const {
  float* logits = be.take(T * E);  // [T, E]
  float* weight = be.take(T * K);  // [T, K]
  int32_t* chosen = be.take_i32(T * K);
  be.linear(n, T, router, logits);
  be.route_softmax(logits, T, E, K, {renormalize, bf16_weights}, chosen, weight);
  be.observe_routing(router_name, chosen, T, K);
  be.moe(n, T, H, K, chosen, weight, experts, y);
  if (shared.inter == 0) return;
  float* s = be.take(T * H);  // [T, H]
  be.mlp(shared, n, T, s);
  if (shared_gate.defined()) {
    float* g = be.take(T);  // [T, 1]
    be.linear(n, T, shared_gate, g);
    be.add_sigmoid_gated(y, s, g, T, H);
  } else {
    be.add(y, s, T * H);
  }
}

SigmoidMoeConfig deepseek_moe_config(const ModelConfig& c) {
  const Json& t = c.text;
  SigmoidMoeConfig mc;
  mc.experts = c.num_experts;
  mc.top_k = c.num_experts_per_tok;
  mc.n_group = static_cast<int64_t>(number_or(t, "n_group", 1));
  mc.topk_group = static_cast<int64_t>(number_or(t, "topk_group", 1));
  mc.routed_scaling = static_cast<float>(number_or(t, "routed_scaling_factor", 1.0));
  mc.renormalize = c.norm_topk_prob;
  mc.inter = c.moe_intermediate_size;
  mc.n_shared = c.n_shared_experts;
  return mc;
}

void SigmoidMoe::bind(Binder& b, const std::string& block, MlpLeaves leaves, int64_t hidden,
                      const SigmoidMoeConfig& config, const std::string& config_path,
                      const std::string& bias_leaf, bool bias_required) {
  cfg = config;
  H = hidden;
  const int64_t E = cfg.experts, K = cfg.top_k;
  STRATA_CHECK(cfg.n_group > 0 && E % cfg.n_group == 0 && cfg.topk_group >= 1 &&
                   cfg.topk_group <= cfg.n_group,
               config_path, ": n_group (", cfg.n_group, ") must divide the routed experts (", E,
               ") and topk_group (", cfg.topk_group, ") must be in [1, n_group]");
  STRATA_CHECK(K >= 1 && K <= cfg.topk_group * (E / cfg.n_group), config_path,
               ": num_experts_per_tok (", K, ") exceeds the experts in topk_group groups");
  router = b.vector(block + "gate.weight", {E, H});
  router_name = block + "gate";
  bias = {};
  if (bias_required || b.has(block + bias_leaf)) bias = b.vector(block + bias_leaf, {E});
  experts.clear();
  experts.reserve(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    experts.push_back(bind_mlp(b, block + "experts." + std::to_string(e) + ".", H, cfg.inter,
                               leaves, b.holds_expert(e, E)));
  shared = {};
  if (cfg.n_shared > 0)
    shared = bind_mlp(b, block + "shared_experts.", H, cfg.inter * cfg.n_shared);
}

void SigmoidMoe::forward(ops::Backend& be, const float* n, int64_t T, float* y) const {
  const int64_t E = cfg.experts, K = cfg.top_k;
  float* logits = be.take(T * E);  // [T, E]
  float* weight = be.take(T * K);  // [T, K]
  int32_t* chosen = be.take_i32(T * K);
  be.linear(n, T, router, logits);
  ops::Backend::SigmoidRouting r;
  r.bias = bias.defined() ? &bias : nullptr;
  r.n_group = cfg.n_group;
  r.topk_group = cfg.topk_group;
  r.renormalize = cfg.renormalize;
  r.scaling = cfg.routed_scaling;
  r.bf16_logits = cfg.bf16_logits;
  be.route_sigmoid(logits, T, E, K, r, chosen, weight);
  be.observe_routing(router_name, chosen, T, K);
  be.moe(n, T, H, K, chosen, weight, experts, y);
  if (cfg.n_shared == 0) return;
  float* s = be.take(T * H);  // [T, H]
  be.mlp(shared, n, T, s);
  be.add(y, s, T * H);
}

}  // namespace strata::model
