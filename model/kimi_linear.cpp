// Kimi-Linear family: kimi_linear (spec/architectures.md §4).
//
// Every layer is x += mixer(RMSNorm(x)); x += ffn(RMSNorm(x)). The mixer is KDA on the layers
// layer_is_linear_attention() names and NoPE MLA (MlaAttention of model/blocks.h, no rotation,
// scale (d_n + d_r)^-1/2) on the others; the ffn is a dense SwiGLU on the dense layers and the
// sigmoid-routed MoE with shared experts (DeepSeek's noaux_tc) on the others.
//
// KDA (Kimi Delta Attention), per sequence, on n = the layer's normed input; D = nH · d:
//   q, k, v  = silu(causal_conv1d(q_proj n)), ... (each stream its own depthwise conv, K taps)
//   q, k     = per-head L2 norm (eps 1e-6); q /= sqrt(d)                          [T, nH, d]
//   g        = -exp(A_log[h]) · softplus(f_b_proj(f_a_proj n) + dt_bias)           [T, nH, d]
//   beta     = sigmoid(b_proj n), applied here once (the recurrence takes it as is) [T, nH]
//   o        = gated delta rule (ops::gated_delta_rule), fp32, zero initial state  [T, nH, d]
//   y_h      = RMSNorm_eps(o_h; o_norm) · sigmoid(g_b_proj(g_a_proj n))_h           [T, nH, d]
//   out      = o_proj y
// Observers see the inputs of q/k/v_proj, f_a/f_b_proj, b_proj, g_a/g_b_proj and o_proj; a KDA
// layer has no KV cache and reports no k_cache / v_cache.
#include <cmath>
#include <optional>
#include <string>

#include "core/error.h"
#include "model/blocks.h"
#include "model/common.h"

namespace strata::model {
namespace {

// An integer setting spelled `flat` (transformers 5.x) or linear_attn_config.`nested` (the remote
// code); both present must agree, neither is an error.
int64_t linear_attn_int(const ModelConfig& c, const char* flat, const char* nested) {
  const Json& t = c.text;
  std::optional<int64_t> a, b;
  if (has_key(t, flat)) {
    STRATA_CHECK(t[flat].is_number_integer(), c.path, ": '", flat, "' must be an integer");
    a = t[flat].get<int64_t>();
  }
  if (has_key(t, "linear_attn_config") && has_key(t["linear_attn_config"], nested)) {
    const Json& v = t["linear_attn_config"][nested];
    STRATA_CHECK(v.is_number_integer(), c.path, ": 'linear_attn_config.", nested,
                 "' must be an integer");
    b = v.get<int64_t>();
  }
  STRATA_CHECK(a || b, c.path, ": neither '", flat, "' nor 'linear_attn_config.", nested,
               "' is set; the KDA layers' shape is unknown");
  STRATA_CHECK(!a || !b || *a == *b, c.path, ": '", flat, "' is ", *a, " but 'linear_attn_config.",
               nested, "' is ", *b, "; they must agree");
  const int64_t v = a ? *a : *b;
  STRATA_CHECK(v > 0, c.path, ": '", flat, "' must be positive, got ", v);
  return v;
}

// The KDA layers' shape: n_heads heads of head_dim key (= value) channels, short convolutions of
// conv_kernel taps. Each is spelled flat (transformers 5.x) or under linear_attn_config.
struct KdaShape {
  int64_t n_heads = 0, head_dim = 0, conv_kernel = 0;
};

KdaShape kda_shape(const ModelConfig& c) {
  KdaShape s;
  s.n_heads = linear_attn_int(c, "linear_num_heads", "num_heads");
  s.head_dim = linear_attn_int(c, "linear_head_dim", "head_dim");
  s.conv_kernel = linear_attn_int(c, "linear_conv_kernel_dim", "short_conv_kernel_size");
  return s;
}

SigmoidMoeConfig kimi_linear_moe_config(const ModelConfig& c) {
  const Json& t = c.text;
  SigmoidMoeConfig mc;
  mc.experts = c.num_experts;
  mc.top_k = c.num_experts_per_tok;
  mc.n_group = static_cast<int64_t>(number_or(t, "num_expert_group", number_or(t, "n_group", 1)));
  mc.topk_group = static_cast<int64_t>(number_or(t, "topk_group", 1));
  if (has_key(t, "use_grouped_topk") && t["use_grouped_topk"].is_boolean() &&
      !t["use_grouped_topk"].get<bool>()) {
    // A plain top-k over all experts is grouped routing with one group; with several groups
    // configured, which of the two the remote code runs is not verified: refused.
    STRATA_CHECK(mc.n_group == 1, c.path, ": use_grouped_topk false with num_expert_group ",
                 mc.n_group, " is ambiguous; strata supports it with one group only");
  }
  mc.routed_scaling = static_cast<float>(number_or(t, "routed_scaling_factor", 1.0));
  mc.renormalize = c.norm_topk_prob;
  mc.inter = c.moe_intermediate_size;
  mc.n_shared = c.n_shared_experts;
  return mc;
}

struct KdaAttention {
  int64_t H = 0, nH = 0, d = 0, D = 0, K = 0;
  float eps = 0.0f;                    // o_norm's, rms_norm_eps
  ops::Weight wq, wk, wv, wo;          // [D, H] x3, [H, D]
  ops::Weight conv_q, conv_k, conv_v;  // [D, 1, K] each
  ops::Weight wfa, wfb, wga, wgb;      // [d, H], [D, d], [d, H], [D, d]
  ops::Weight wb;                      // [nH, H]
  ops::Weight a_log, dt_bias, o_norm;  // [1, 1, nH, 1], [D], [d]
  std::vector<std::string> in_names, fb_names, gb_names, o_names;

  void bind(Binder& b, const ModelConfig& c, const std::string& p) {
    H = c.hidden_size;
    const KdaShape shape = kda_shape(c);
    nH = shape.n_heads;
    d = shape.head_dim;
    K = shape.conv_kernel;
    D = nH * d;
    eps = static_cast<float>(c.rms_norm_eps);
    wq = b.matrix(p + "q_proj.weight", {D, H});
    wk = b.matrix(p + "k_proj.weight", {D, H});
    wv = b.matrix(p + "v_proj.weight", {D, H});
    wo = b.matrix(p + "o_proj.weight", {H, D});
    conv_q = b.vector(p + "q_conv1d.weight", {D, 1, K});
    conv_k = b.vector(p + "k_conv1d.weight", {D, 1, K});
    conv_v = b.vector(p + "v_conv1d.weight", {D, 1, K});
    wfa = b.matrix(p + "f_a_proj.weight", {d, H});
    wfb = b.matrix(p + "f_b_proj.weight", {D, d});
    wga = b.matrix(p + "g_a_proj.weight", {d, H});
    wgb = b.matrix(p + "g_b_proj.weight", {D, d});
    wb = b.matrix(p + "b_proj.weight", {nH, H});
    a_log = b.vector(p + "A_log", {1, 1, nH, 1});
    dt_bias = b.vector(p + "dt_bias", {D});
    o_norm = b.vector(p + "o_norm.weight", {d});
    in_names = {p + "q_proj",   p + "k_proj", p + "v_proj",
                p + "f_a_proj", p + "b_proj", p + "g_a_proj"};
    fb_names = {p + "f_b_proj"};
    gb_names = {p + "g_b_proj"};
    o_names = {p + "o_proj"};
  }

  void forward(ops::Backend& be, const ops::Tokens& t, const float* x, float* out) const {
    const int64_t T = t.tokens;
    be.observe(in_names, x, T, H);
    float* q = be.take(T * D);      // [T, nH, d] after the conv, the L2 norm and the scale
    float* k = be.take(T * D);      // [T, nH, d]
    float* v = be.take(T * D);      // [T, nH, d]
    float* g = be.take(T * D);      // [T, nH, d] the log decay
    float* o = be.take(T * D);      // [T, nH, d] the recurrence's output, then gated
    float* raw = be.take(T * D);    // [T, D] a projection before its conv; the output gate
    float* fa = be.take(T * d);     // [T, d]
    float* ga = be.take(T * d);     // [T, d]
    float* beta = be.take(T * nH);  // [T, nH]
    // q, k, v: projection, causal depthwise conv within each sequence, SiLU.
    be.linear(x, T, wq, raw);
    be.conv_silu(t, raw, D, conv_q, K, q);
    be.linear(x, T, wk, raw);
    be.conv_silu(t, raw, D, conv_k, K, k);
    be.linear(x, T, wv, raw);
    be.conv_silu(t, raw, D, conv_v, K, v);
    be.linears(x, T, {{&wfa, fa}, {&wga, ga}, {&wb, beta}});
    // [T, nH, d]: per-head L2 norm of q and k; q scaled by d^-1/2.
    be.l2_norm_scale(q, T * nH, d, 1e-6f, 1.0f / std::sqrt(static_cast<float>(d)));
    be.l2_norm_scale(k, T * nH, d, 1e-6f, 1.0f);
    // Forget gate g = -exp(A_log) softplus(f_b_proj(f_a_proj n) + dt_bias); beta = sigmoid(b).
    be.observe(fb_names, fa, T, d);
    be.linear(fa, T, wfb, g);
    be.kda_forget_gate(g, T, nH, d, a_log, dt_bias);
    be.sigmoid(beta, T * nH);
    be.gated_delta_rule(t, q, k, v, g, beta, nH, d, d, o, /*head_decay=*/false);
    // Output: RMSNorm per head (o_norm shared by the heads) times sigmoid(g_b_proj(g_a_proj n)).
    be.observe(gb_names, ga, T, d);
    be.linear(ga, T, wgb, raw);
    {
      ops::Fp32Ops fp32(be);  // transformers' gated norm: all in fp32, one cast at the end
      be.rms_norm(o, T * nH, d, o_norm, eps, o);
      be.mul_sigmoid(o, raw, T * D);
    }
    be.round_ops(o, T * D);
    be.observe(o_names, o, T, D);
    be.linear(o, T, wo, out);
  }
};

class KimiLinearLayer : public Layer {
 public:
  KimiLinearLayer(const ModelConfig& c, int64_t index, std::string prefix)
      : c_(c), p_(std::move(prefix)) {
    const ArchInfo arch = resolve_arch(c_);
    kda_ = layer_is_linear_attention(arch, c_, index);
    moe_ = layer_is_moe(arch, c_, index);
  }

  void bind(Binder& b) override {
    const int64_t H = c_.hidden_size;
    res_.bind(b, c_, p_);
    if (kda_) {
      kda_attn_.bind(b, c_, p_ + "self_attn.");
    } else {
      mla_.bind(b, c_, p_ + "self_attn.", /*nope=*/true);
    }
    if (moe_) {
      experts_.bind(b, p_ + "block_sparse_moe.", {"w1", "w3", "w2"}, H, kimi_linear_moe_config(c_),
                    c_.path);
      return;
    }
    // The hub keeps the dense layers under mlp.; transformers 5.x save_pretrained writes them
    // under block_sparse_moe. (it renames every mlp. of the model).
    std::string m = p_ + "mlp.";
    if (!b.has(m + "gate_proj.weight") && b.has(p_ + "block_sparse_moe.gate_proj.weight"))
      m = p_ + "block_sparse_moe.";
    dense_ = bind_mlp(b, m, H, c_.intermediate_size);
  }

  void forward(ops::Backend& be, const ops::Tokens& t, float* x) override {
    res_.forward(
        be, t.tokens, x,
        [&](const float* n, float* y) {
          if (kda_) {
            kda_attn_.forward(be, t, n, y);
          } else {
            mla_.forward(be, t, n, y);
          }
        },
        [&](const float* n, float* y) {
          moe_or_dense(be, moe_, experts_, dense_, n, t.tokens, y);
        });
  }

 private:
  const ModelConfig& c_;
  std::string p_;
  bool kda_ = false, moe_ = false;
  Residual res_;
  KdaAttention kda_attn_;
  MlaAttention mla_;
  ops::Mlp dense_;
  SigmoidMoe experts_;
};

}  // namespace

void check_kimi_linear_config(const ModelConfig& c) {
  const Json& t = c.text;
  auto string_is = [&](const Json& j, const std::string& where, const char* key,
                       std::initializer_list<const char*> allowed) {
    if (!has_key(j, key)) return;
    STRATA_CHECK(j[key].is_string(), c.path, ": '", where, key, "' must be a string");
    const std::string v = j[key].get<std::string>();
    for (const char* a : allowed) {
      if (v == a) return;
    }
    fail(c.path, ": ", where, key, " '", v, "' is not supported by the kimi_linear forward");
  };
  string_is(t, "", "hidden_act", {"silu"});
  string_is(t, "", "moe_router_activation_func", {"sigmoid"});
  string_is(t, "", "scoring_func", {"sigmoid"});
  string_is(t, "", "topk_method", {"noaux_tc"});
  // Newer variants of the architecture (K3-style) that change the math: refused, not guessed.
  auto refuse = [&](const Json& j, const std::string& where, const char* key) {
    if (!has_key(j, key)) return;
    if (j[key].is_boolean() && !j[key].get<bool>()) return;
    fail(c.path, ": '", where, key, "' (", j[key].dump(),
         ") belongs to a Kimi-Linear variant strata does not implement");
  };
  for (const char* key : {"mla_use_output_gate", "routed_expert_hidden_size", "latent_moe_use_norm",
                          "attn_res_block_size"})
    refuse(t, "", key);
  if (has_key(t, "linear_attn_config")) {
    STRATA_CHECK(t["linear_attn_config"].is_object(), c.path,
                 ": 'linear_attn_config' must be an object");
    for (const char* key : {"gate_lower_bound", "use_full_rank_gate"})
      refuse(t["linear_attn_config"], "linear_attn_config.", key);
  }
  STRATA_CHECK(!has_key(t, "mla_use_nope") || !t["mla_use_nope"].is_boolean() ||
                   t["mla_use_nope"].get<bool>(),
               c.path, ": mla_use_nope false (rotary MLA layers) is not supported for kimi_linear");
  STRATA_CHECK(c.kv_lora_rank > 0, c.path, ": kv_lora_rank must be set for the MLA layers");
  STRATA_CHECK(!c.attention_bias, c.path,
               ": attention_bias true is not supported for kimi_linear (its projections have no "
               "biases in the remote code)");
  // Resolves every layer's kind now, so that a bad layer list stops before any work.
  const ArchInfo arch = resolve_arch(c);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    layer_is_linear_attention(arch, c, l);
    layer_is_moe(arch, c, l);
  }
}

std::unique_ptr<Layer> make_kimi_linear_layer(const ModelConfig& c, int64_t index,
                                              const std::string& prefix) {
  return std::make_unique<KimiLinearLayer>(c, index, prefix);
}

}  // namespace strata::model
