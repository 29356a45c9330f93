// Kimi-Linear family: kimi_linear (spec/architectures.md §4).
//
// Every layer is x += mixer(RMSNorm(x)); x += ffn(RMSNorm(x)). The mixer is KDA on the layers
// layer_is_linear_attention() names and NoPE MLA (model/deepseek_v3.h, no rotation, scale
// (d_n + d_r)^-1/2) on the others; the ffn is a dense SwiGLU on the dense layers and the
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
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/arch.h"
#include "model/common.h"
#include "model/deepseek_v3.h"
#include "model/families.h"
#include "model/kimi_linear.h"

namespace strata::model {
namespace {

bool present(const Json& j, const char* key) {
  return j.contains(key) && !j[key].is_null();
}

// An integer setting spelled `flat` (transformers 5.x) or linear_attn_config.`nested` (the remote
// code); both present must agree, neither is an error.
int64_t linear_attn_int(const ModelConfig& c, const char* flat, const char* nested) {
  const Json& t = c.text;
  std::optional<int64_t> a, b;
  if (present(t, flat)) {
    STRATA_CHECK(t[flat].is_number_integer(), c.path, ": '", flat, "' must be an integer");
    a = t[flat].get<int64_t>();
  }
  if (present(t, "linear_attn_config") && present(t["linear_attn_config"], nested)) {
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

double number_or(const Json& j, const char* key, double fallback) {
  if (!present(j, key)) return fallback;
  STRATA_CHECK(j[key].is_number(), "config.json: '", key, "' must be a number");
  return j[key].get<double>();
}

struct KdaAttention {
  std::string prefix;  // "model.layers.N.self_attn."
  int64_t H = 0, nH = 0, d = 0, D = 0, K = 0;
  float eps = 0.0f;                           // o_norm's, rms_norm_eps
  std::vector<float> wq, wk, wv, wo;          // [D, H] x3, [H, D]
  std::vector<float> conv_q, conv_k, conv_v;  // [D, K] each (checkpoint [D, 1, K])
  std::vector<float> wfa, wfb, wga, wgb;      // [d, H], [D, d], [d, H], [D, d]
  std::vector<float> wb;                      // [nH, H]
  std::vector<float> a_log, dt_bias, o_norm;  // [nH] (checkpoint [1, 1, nH, 1]), [D], [d]

  void load(const ModelConfig& c, const Checkpoint& ckpt, const std::string& p) {
    prefix = p;
    H = c.hidden_size;
    const KdaShape shape = kda_shape(c);
    nH = shape.n_heads;
    d = shape.head_dim;
    K = shape.conv_kernel;
    D = nH * d;
    eps = static_cast<float>(c.rms_norm_eps);
    wq = load_weight(ckpt, p + "q_proj.weight", {D, H});
    wk = load_weight(ckpt, p + "k_proj.weight", {D, H});
    wv = load_weight(ckpt, p + "v_proj.weight", {D, H});
    wo = load_weight(ckpt, p + "o_proj.weight", {H, D});
    conv_q = load_weight(ckpt, p + "q_conv1d.weight", {D, 1, K});
    conv_k = load_weight(ckpt, p + "k_conv1d.weight", {D, 1, K});
    conv_v = load_weight(ckpt, p + "v_conv1d.weight", {D, 1, K});
    wfa = load_weight(ckpt, p + "f_a_proj.weight", {d, H});
    wfb = load_weight(ckpt, p + "f_b_proj.weight", {D, d});
    wga = load_weight(ckpt, p + "g_a_proj.weight", {d, H});
    wgb = load_weight(ckpt, p + "g_b_proj.weight", {D, d});
    wb = load_weight(ckpt, p + "b_proj.weight", {nH, H});
    a_log = load_weight(ckpt, p + "A_log", {1, 1, nH, 1});
    dt_bias = load_weight(ckpt, p + "dt_bias", {D});
    o_norm = load_weight(ckpt, p + "o_norm.weight", {d});
  }

  void forward(const Batch& batch, const float* x, float* out, Observer* obs) const {
    const int64_t T = batch.n_tokens();
    if (obs) {
      for (const char* m : {"q_proj", "k_proj", "v_proj", "f_a_proj", "b_proj", "g_a_proj"})
        obs->observe(prefix + m, x, T, H);
    }
    std::vector<float> q(T * D), k(T * D), v(T * D);  // [T, D] projections, then conv'd
    ops::linear(x, T, H, wq.data(), D, q.data());
    ops::linear(x, T, H, wk.data(), D, k.data());
    ops::linear(x, T, H, wv.data(), D, v.data());
    // Short convolutions, per sequence (nothing crosses a sequence boundary), then SiLU.
    std::vector<float> conv(T * D);  // [T, D]
    for (auto [buf, w] : {std::pair{&q, &conv_q}, std::pair{&k, &conv_k}, std::pair{&v, &conv_v}}) {
      for (int64_t s = 0; s < batch.n_seqs(); ++s) {
        const int64_t b = batch.seq_offsets[s], len = batch.seq_offsets[s + 1] - b;
        ops::causal_conv1d(buf->data() + b * D, D, len, D, w->data(), K, conv.data() + b * D);
      }
      for (int64_t i = 0; i < T * D; ++i)
        (*buf)[i] = ops::silu(conv[i]);
    }
    // [T, nH, d]: per-head L2 norm of q and k; q scaled by d^-1/2.
    ops::l2_norm(q.data(), T * nH, d, 1e-6f);
    ops::l2_norm(k.data(), T * nH, d, 1e-6f);
    const float q_scale = 1.0f / std::sqrt(static_cast<float>(d));
    for (float& e : q)
      e *= q_scale;

    // Forget gate, in fp32: g = -exp(A_log[h]) · softplus(f + dt_bias), softplus(z) = z for z > 20.
    std::vector<float> fa(T * d), g(T * D);  // [T, d], [T, nH, d]
    ops::linear(x, T, H, wfa.data(), d, fa.data());
    if (obs) obs->observe(prefix + "f_b_proj", fa.data(), T, d);
    ops::linear(fa.data(), T, d, wfb.data(), D, g.data());
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < nH; ++h) {
        const float rate = std::exp(a_log[h]);
        for (int64_t i = 0; i < d; ++i) {
          float& z = g[t * D + h * d + i];
          const float zb = z + dt_bias[h * d + i];
          const float softplus = zb > 20.0f ? zb : std::log(1.0f + std::exp(zb));
          z = -rate * softplus;
        }
      }
    }
    // beta = sigmoid(b_proj n): the one place the sigmoid is applied.
    std::vector<float> beta(T * nH);  // [T, nH]
    ops::linear(x, T, H, wb.data(), nH, beta.data());
    for (float& e : beta)
      e = ops::sigmoid(e);

    std::vector<float> o(T * D);  // [T, nH, d]
    for (int64_t s = 0; s < batch.n_seqs(); ++s) {
      const int64_t b = batch.seq_offsets[s], len = batch.seq_offsets[s + 1] - b;
      ops::gated_delta_rule(q.data() + b * D, k.data() + b * D, v.data() + b * D, g.data() + b * D,
                            beta.data() + b * nH, len, nH, d, d, o.data() + b * D);
    }

    // Output gate and norm: RMSNorm over each head (one weight shared by all heads) times
    // sigmoid of the low-rank gate.
    std::vector<float> ga(T * d), gate(T * D);  // [T, d], [T, nH, d]
    ops::linear(x, T, H, wga.data(), d, ga.data());
    if (obs) obs->observe(prefix + "g_b_proj", ga.data(), T, d);
    ops::linear(ga.data(), T, d, wgb.data(), D, gate.data());
    ops::rms_norm(o.data(), T * nH, d, o_norm.data(), eps, o.data());
    for (int64_t i = 0; i < T * D; ++i)
      o[i] *= ops::sigmoid(gate[i]);
    if (obs) obs->observe(prefix + "o_proj", o.data(), T, D);
    ops::linear(o.data(), T, D, wo.data(), H, out);
  }
};

class KimiLinearLayer : public DecoderLayer {
 public:
  explicit KimiLinearLayer(const LayerContext& ctx) : c_(ctx.config) {
    const int64_t H = c_.hidden_size;
    const ArchInfo arch = resolve_arch(c_);
    in_norm_ = load_weight(ctx.ckpt, ctx.prefix + "input_layernorm.weight", {H});
    post_norm_ = load_weight(ctx.ckpt, ctx.prefix + "post_attention_layernorm.weight", {H});
    kda_ = layer_is_linear_attention(arch, c_, ctx.index);
    if (kda_) {
      kda_attn_.load(c_, ctx.ckpt, ctx.prefix + "self_attn.");
    } else {
      mla_.load(c_, ctx.ckpt, ctx.prefix + "self_attn.", /*nope=*/true);
    }
    is_moe_ = layer_is_moe(arch, c_, ctx.index);
    if (!is_moe_) {
      // The hub keeps the dense layers under mlp.; transformers 5.x save_pretrained writes them
      // under block_sparse_moe. (it renames every mlp. of the model).
      const std::string m = kimi_linear_dense_prefix(ctx.ckpt, ctx.prefix);
      dense_ = load_swiglu(ctx.ckpt, m + "gate_proj", m + "up_proj", m + "down_proj", H,
                           c_.intermediate_size);
      return;
    }
    const SigmoidMoeConfig mc = kimi_linear_moe_config(c_);
    static constexpr const char* kLeaves[3] = {"w1", "w3", "w2"};  // gate, up, down
    moe_.load(ctx.ckpt, ctx.prefix + "block_sparse_moe.", kLeaves, H, mc, c_.path, ctx.experts);
  }

  void forward(const Batch& batch, float* x, Observer* obs) override {
    const int64_t T = batch.n_tokens(), H = c_.hidden_size;
    residual_layer(
        T, H, static_cast<float>(c_.rms_norm_eps), in_norm_, post_norm_, x,
        [&](const float* n, float* y) {
          if (kda_) {
            kda_attn_.forward(batch, n, y, obs);
          } else {
            mla_.forward(batch, n, y, obs);
          }
        },
        [&](const float* n, float* y) {
          if (is_moe_) {
            moe_.forward(n, T, y, obs);
          } else {
            swiglu_mlp(dense_, n, T, H, y, obs);
          }
        });
  }

 private:
  const ModelConfig& c_;
  std::vector<float> in_norm_, post_norm_;
  bool kda_ = false;
  KdaAttention kda_attn_;
  MlaAttention mla_;
  bool is_moe_ = false;
  SwigluWeights dense_;
  SigmoidMoe moe_;
};

}  // namespace

void check_kimi_linear_config(const ModelConfig& c) {
  const Json& t = c.text;
  auto string_is = [&](const Json& j, const std::string& where, const char* key,
                       std::initializer_list<const char*> allowed) {
    if (!present(j, key)) return;
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
    if (!present(j, key)) return;
    if (j[key].is_boolean() && !j[key].get<bool>()) return;
    fail(c.path, ": '", where, key, "' (", j[key].dump(),
         ") belongs to a Kimi-Linear variant strata does not implement");
  };
  for (const char* key : {"mla_use_output_gate", "routed_expert_hidden_size", "latent_moe_use_norm",
                          "attn_res_block_size"})
    refuse(t, "", key);
  if (present(t, "linear_attn_config")) {
    STRATA_CHECK(t["linear_attn_config"].is_object(), c.path,
                 ": 'linear_attn_config' must be an object");
    for (const char* key : {"gate_lower_bound", "use_full_rank_gate"})
      refuse(t["linear_attn_config"], "linear_attn_config.", key);
  }
  STRATA_CHECK(!present(t, "mla_use_nope") || !t["mla_use_nope"].is_boolean() ||
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
  if (present(t, "use_grouped_topk") && t["use_grouped_topk"].is_boolean() &&
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

std::string kimi_linear_dense_prefix(const Checkpoint& ckpt, const std::string& layer_prefix) {
  const std::string m = layer_prefix + "mlp.";
  if (!ckpt.has(m + "gate_proj.weight") &&
      ckpt.has(layer_prefix + "block_sparse_moe.gate_proj.weight"))
    return layer_prefix + "block_sparse_moe.";
  return m;
}

std::unique_ptr<DecoderLayer> make_kimi_linear_layer(const LayerContext& ctx) {
  return std::make_unique<KimiLinearLayer>(ctx);
}

}  // namespace strata::model
