// Qwen3-Next and Qwen3.5-MoE families (spec/architectures.md §5): qwen3_next (transformers'
// Qwen3NextForCausalLM), qwen3_5_moe_text (Qwen3_5MoeForCausalLM) and its multimodal wrapper
// qwen3_5_moe (Qwen3_5MoeForConditionalGeneration: the language model under
// model.language_model., the vision tower under model.visual., copied untouched).
//
// Every layer is x += mixer(RMSNorm(x)); x += ffn(RMSNorm(x)). Every RMSNorm of the model but the
// Gated DeltaNet's output norm (input, post-attention, q/k norms, the final norm) stores its weight
// zero-centred: y = x / rms(x) · (1 + w) (ops::Weight::offset 1). The mixer, by layer_types (else
// every full_attention_interval-th layer, 4 by default, is full attention):
//   full attention: GQA whose q_proj gives each head its query and then an output gate g; per-head
//     q/k norm, RoPE on the first int(head_dim · partial_rotary_factor) dims (0.25 when the config
//     has none, as the config classes set it); out = o_proj(attention · σ(g)).
//   linear attention (Gated DeltaNet), per sequence, on n = the normed input; HK key heads of dk,
//   HV = r · HK value heads of dv, C = 2 · HK · dk + HV · dv:
//     Qwen3-Next: in_proj_qkvz n, grouped per key head [q (dk) | k (dk) | v (r·dv) | z (r·dv)],
//                 and in_proj_ba n, per key head [b (r) | a (r)];
//     Qwen3.5:    in_proj_qkv n = [q (HK·dk) | k (HK·dk) | v (HV·dv)], in_proj_z, in_proj_b,
//                 in_proj_a;
//     [q | k | v] = silu(causal_conv1d([q | k | v]; conv1d [C, 1, K]))        [T, C]
//     q, k        -> HV heads (value head h reads key head h / r); per-head L2 norm (eps 1e-6),
//                    q · dk^-1/2                                               [T, HV, dk]
//     g           = -exp(A_log) · softplus(a + dt_bias), one decay per head   [T, HV]
//     beta        = σ(b)                                                       [T, HV]
//     o           = gated delta rule (ops::gated_delta_rule, head_decay), fp32, zero state
//     y           = RMSNorm_eps(o_h; norm.weight) · silu(z_h) per head          [T, HV, dv]
//     out         = out_proj y
// FFN: the Qwen MoE block (model/blocks.h SoftmaxMoe): softmax over num_experts, top-k, weights
// renormalised (Qwen3-Next: when norm_topk_prob, true by default; Qwen3.5: always), plus
// σ(shared_expert_gate · n) · shared_expert(n). Qwen3-Next's layers in mlp_only_layers or off
// the decoder_sparse_step have a dense mlp instead; every Qwen3.5 layer is MoE.
// Observers: the GQA's (model/blocks.h); a Gated DeltaNet layer reports its input once under all
// its input projections, and out_proj's input; no KV cache.
#include <cmath>
#include <string>

#include "core/error.h"
#include "model/blocks.h"
#include "model/common.h"
#include "model/layer.h"

namespace strata::model {
namespace {

// A positive integer setting, or transformers' default when the config has none.
int64_t positive_int(const ModelConfig& c, const char* key, int64_t fallback) {
  const Json& t = c.text;
  if (!has_key(t, key)) return fallback;
  STRATA_CHECK(t[key].is_number_integer() && t[key].get<int64_t>() > 0, c.path, ": '", key,
               "' must be a positive integer, got ", t[key].dump());
  return t[key].get<int64_t>();
}

// Qwen3NextConfig and Qwen3_5MoeTextConfig set partial_rotary_factor 0.25 when the config gives
// none (at the top level, in rope_parameters or rope_scaling).
double partial_rotary_factor(const ModelConfig& c) {
  const Json& t = c.text;
  const bool given =
      has_key(t, "partial_rotary_factor") ||
      (has_key(t, "rope_parameters") && has_key(t["rope_parameters"], "partial_rotary_factor")) ||
      (has_key(t, "rope_scaling") && has_key(t["rope_scaling"], "partial_rotary_factor"));
  return given ? c.rope.partial_rotary_factor : 0.25;
}

// The Gated DeltaNet's shape, with Qwen3NextConfig's defaults.
struct GdnShape {
  int64_t HK = 0, HV = 0, dk = 0, dv = 0, K = 0;
};

GdnShape gdn_shape(const ModelConfig& c) {
  GdnShape s;
  s.HK = positive_int(c, "linear_num_key_heads", 16);
  s.HV = positive_int(c, "linear_num_value_heads", 32);
  s.dk = positive_int(c, "linear_key_head_dim", 128);
  s.dv = positive_int(c, "linear_value_head_dim", 128);
  s.K = positive_int(c, "linear_conv_kernel_dim", 4);
  STRATA_CHECK(s.HV % s.HK == 0, c.path, ": linear_num_value_heads (", s.HV,
               ") must be a multiple of linear_num_key_heads (", s.HK, ")");
  return s;
}

struct GatedDeltaNet {
  bool split = false;  // Qwen3.5's in_proj_qkv / z / b / a instead of in_proj_qkvz / ba
  int64_t H = 0, HK = 0, HV = 0, dk = 0, dv = 0, K = 0, r = 0, C = 0;
  float eps = 0.0f;
  ops::Weight w_qkvz, w_ba;          // [2·HK·dk + 2·HV·dv, H], [2·HV, H]
  ops::Weight w_qkv, w_z, w_b, w_a;  // [C, H], [HV·dv, H], [HV, H], [HV, H]
  ops::Weight conv, a_log, dt_bias;  // [C, 1, K], [HV], [HV]
  ops::Weight norm, wo;              // [dv], [H, HV·dv]
  std::vector<std::string> in_names, o_names;

  void bind(Binder& b, const ModelConfig& c, const std::string& p, bool split_inputs) {
    split = split_inputs;
    H = c.hidden_size;
    const GdnShape s = gdn_shape(c);
    HK = s.HK;
    HV = s.HV;
    dk = s.dk;
    dv = s.dv;
    K = s.K;
    r = HV / HK;
    C = 2 * HK * dk + HV * dv;
    eps = static_cast<float>(c.rms_norm_eps);
    if (split) {
      w_qkv = b.matrix(p + "in_proj_qkv.weight", {C, H});
      w_z = b.matrix(p + "in_proj_z.weight", {HV * dv, H});
      w_b = b.matrix(p + "in_proj_b.weight", {HV, H});
      w_a = b.matrix(p + "in_proj_a.weight", {HV, H});
      in_names = {p + "in_proj_qkv", p + "in_proj_z", p + "in_proj_b", p + "in_proj_a"};
    } else {
      w_qkvz = b.matrix(p + "in_proj_qkvz.weight", {C + HV * dv, H});
      w_ba = b.matrix(p + "in_proj_ba.weight", {2 * HV, H});
      in_names = {p + "in_proj_qkvz", p + "in_proj_ba"};
    }
    conv = b.vector(p + "conv1d.weight", {C, 1, K});
    a_log = b.vector(p + "A_log", {HV});
    dt_bias = b.vector(p + "dt_bias", {HV});
    norm = b.vector(p + "norm.weight", {dv});
    wo = b.matrix(p + "out_proj.weight", {H, HV * dv});
    o_names = {p + "out_proj"};
  }

  void forward(ops::Backend& be, const ops::Tokens& t, const float* x, float* out) const {
    const int64_t T = t.tokens, Dk = HK * dk, Dv = HV * dv;
    // An expert-parallel rank can hold no tokens of a batch: nothing to compute, and the column
    // offsets below must not be applied to empty (null) scratch.
    if (T == 0) return;
    be.observe(in_names, x, T, H);
    float* mixed = be.take(T * C);  // [T, C]: q (HK·dk) | k (HK·dk) | v (HV·dv), before the conv
    float* z = be.take(T * Dv);     // [T, HV, dv] the output gate
    float* beta = be.take(T * HV);  // [T, HV]
    float* g = be.take(T * HV);     // [T, HV] a, then the log decay
    if (split) {
      be.linears(x, T, {{&w_qkv, mixed}, {&w_z, z}, {&w_b, beta}, {&w_a, g}});
    } else {
      const int64_t W = 2 * dk + 2 * r * dv;  // one key head's columns of in_proj_qkvz
      float* qkvz = be.take(T * HK * W);      // [T, HK, W]
      float* ba = be.take(T * 2 * HV);        // [T, HK, 2r]
      be.linears(x, T, {{&w_qkvz, qkvz}, {&w_ba, ba}});
      for (int64_t h = 0; h < HK; ++h) {
        const float* src = qkvz + h * W;
        be.copy_cols(src, HK * W, mixed + h * dk, C, T, dk);
        be.copy_cols(src + dk, HK * W, mixed + Dk + h * dk, C, T, dk);
        be.copy_cols(src + 2 * dk, HK * W, mixed + 2 * Dk + h * r * dv, C, T, r * dv);
      }
      // Rows (token, key head): z's r·dv, b's r and a's r land contiguous, key head after key
      // head, which is the value heads' order.
      be.copy_cols(qkvz + 2 * dk + r * dv, W, z, r * dv, T * HK, r * dv);
      be.copy_cols(ba, 2 * r, beta, r, T * HK, r);
      be.copy_cols(ba + r, 2 * r, g, r, T * HK, r);
    }
    float* y = be.take(T * C);  // [T, C] after the conv and SiLU
    be.conv_silu(t, mixed, C, conv, K, y);
    float* q = be.take(T * HV * dk);  // [T, HV, dk]
    float* k = be.take(T * HV * dk);  // [T, HV, dk]
    float* v = be.take(T * Dv);       // [T, HV, dv]
    float* o = be.take(T * Dv);       // [T, HV, dv]
    if (r == 1) {
      be.copy_cols(y, C, q, Dk, T, Dk);
      be.copy_cols(y + Dk, C, k, Dk, T, Dk);
    } else {
      for (int64_t h = 0; h < HV; ++h) {  // value head h reads key head h / r
        be.copy_cols(y + (h / r) * dk, C, q + h * dk, HV * dk, T, dk);
        be.copy_cols(y + Dk + (h / r) * dk, C, k + h * dk, HV * dk, T, dk);
      }
    }
    be.copy_cols(y + 2 * Dk, C, v, Dv, T, Dv);
    be.l2_norm_scale(q, T * HV, dk, 1e-6f, 1.0f / std::sqrt(static_cast<float>(dk)));
    be.l2_norm_scale(k, T * HV, dk, 1e-6f, 1.0f);
    be.kda_forget_gate(g, T, HV, 1, a_log, dt_bias);  // one decay per head: d = 1
    be.sigmoid(beta, T * HV);
    be.gated_delta_rule(t, q, k, v, g, beta, HV, dk, dv, o, /*head_decay=*/true);
    // Gated RMSNorm per head (norm.weight shared by the heads, not zero-centred), times silu(z).
    be.rms_norm(o, T * HV, dv, norm, eps, o);
    {
      ops::Fp32Ops fp32(be);  // transformers multiplies by silu(z) in fp32, then casts once
      be.swiglu(z, o, T * Dv, o);
    }
    be.round_ops(o, T * Dv);
    be.observe(o_names, o, T, Dv);
    be.linear(o, T, wo, out);
  }
};

class Qwen3NextLayer : public Layer {
 public:
  Qwen3NextLayer(const ModelConfig& c, int64_t index, std::string prefix)
      : c_(c), p_(std::move(prefix)) {
    const ArchInfo arch = resolve_arch(c_);
    qwen35_ = arch.family == ArchFamily::kQwen35Moe;
    linear_ = layer_is_linear_attention(arch, c_, index);
    moe_ = layer_is_moe(arch, c_, index);
  }

  void bind(Binder& b) override {
    const int64_t H = c_.hidden_size;
    res_.bind(b, c_, p_);
    res_.in_norm.offset = 1.0f;
    res_.post_norm.offset = 1.0f;
    if (linear_) {
      gdn_.bind(b, c_, p_ + "linear_attn.", qwen35_);
    } else {
      const std::string a = p_ + "self_attn.";
      // transformers builds the biases from attention_bias alone and the q/k norms always.
      STRATA_CHECK(b.has(a + "q_proj.bias") == c_.attention_bias, c_.path, ": attention_bias is ",
                   c_.attention_bias ? "true" : "false", " but '", a, "q_proj.bias' is ",
                   c_.attention_bias ? "missing" : "present",
                   "; the checkpoint does not match its config");
      STRATA_CHECK(b.has(a + "q_norm.weight"), c_.path, ": '", a, "q_norm.weight' is missing; ",
                   c_.text_model_type, " normalises q and k per head");
      GqaOptions opt;
      opt.partial_rotary_factor = partial_rotary_factor(c_);
      opt.output_gate = true;
      attn_.bind(b, c_, a, opt);
      attn_.q_norm.offset = 1.0f;
      attn_.k_norm.offset = 1.0f;
    }
    const std::string m = p_ + "mlp.";
    if (!moe_) {
      dense_ = bind_mlp(b, m, H, c_.intermediate_size);
      return;
    }
    // Qwen3-Next renormalises when norm_topk_prob (its default true); Qwen3.5 always.
    const Json& t = c_.text;
    const bool renorm = qwen35_ || !has_key(t, "norm_topk_prob") || c_.norm_topk_prob;
    STRATA_CHECK(b.has(m + "shared_expert.gate_proj.weight"), c_.path, ": '", m,
                 "shared_expert.gate_proj.weight' is missing; every ", c_.text_model_type,
                 " MoE layer has a shared expert");
    experts_.bind(b, m, H, c_.num_experts, c_.num_experts_per_tok, c_.moe_intermediate_size, renorm,
                  {}, c_.path);
  }

  void forward(ops::Backend& be, const ops::Tokens& t, float* x) override {
    res_.forward(
        be, t.tokens, x,
        [&](const float* n, float* y) {
          if (linear_) {
            gdn_.forward(be, t, n, y);
          } else {
            attn_.forward(be, t, n, y);
          }
        },
        [&](const float* n, float* y) {
          moe_or_dense(be, moe_, experts_, dense_, n, t.tokens, y);
        });
  }

 private:
  const ModelConfig& c_;
  std::string p_;
  bool qwen35_ = false, linear_ = false, moe_ = false;
  Residual res_;
  GatedDeltaNet gdn_;
  GqaAttention attn_;
  ops::Mlp dense_;
  SoftmaxMoe experts_;
};

}  // namespace

void check_qwen3_next_config(const ModelConfig& c) {
  const Json& t = c.text;
  if (has_key(t, "hidden_act")) {
    STRATA_CHECK(t["hidden_act"] == "silu", c.path, ": hidden_act ", t["hidden_act"].dump(),
                 " is not supported by the ", c.text_model_type, " forward (only silu)");
  }
  const ArchInfo arch = resolve_arch(c);
  if (arch.family == ArchFamily::kQwen35Moe) {
    STRATA_CHECK(c.num_experts > 0, c.path, ": num_experts must be positive for ",
                 c.text_model_type, " (every layer is MoE)");
  }
  gdn_shape(c);
  // Resolves every layer's kind now, so that a bad layer list stops before any work.
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    layer_is_linear_attention(arch, c, l);
    layer_is_moe(arch, c, l);
  }
}

std::unique_ptr<Layer> make_qwen3_next_layer(const ModelConfig& c, int64_t index,
                                             const std::string& prefix) {
  return std::make_unique<Qwen3NextLayer>(c, index, prefix);
}

}  // namespace strata::model
