// Pieces every family's forward shares: weight loading with shape checks, embedding, the final
// norm and lm_head, the SwiGLU MLP, RoPE parameters from the config.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "model/forward.h"
#include "ops/ops.h"

namespace strata::model {

// Reads `name` as fp32, checking its shape; a missing tensor or another shape is a
// strata::Error naming the tensor.
std::vector<float> load_weight(const Checkpoint& ckpt, const std::string& name, const Shape& shape);
bool has_tensor(const Checkpoint& ckpt, const std::string& name);

// RoPE parameters from the config's normalised rope fields; an unknown rope type is an error.
ops::RopeParams rope_params(const ModelConfig& config);

// The prefix of the language model's tensors: "model." or "language_model.model." etc.,
// detected from where the embedding lives; and the lm_head name.
struct Prefixes {
  std::string model;    // "model."
  std::string lm_head;  // "lm_head.weight" (or the embedding, when tied)
};
Prefixes find_prefixes(const ModelConfig& config, const Checkpoint& ckpt);

// Embedding, final norm and lm_head: the steps outside the decoder layers.
class Ends {
 public:
  Ends(const ModelConfig& config, const Checkpoint& ckpt, const Prefixes& prefixes);
  void embed(const Batch& batch, float* hidden, bool round_bf16) const;
  void logits(const float* hidden, int64_t n_tokens, float* out) const;

 private:
  const Checkpoint& ckpt_;
  std::string embed_name_, norm_name_, head_name_;
  int64_t hidden_, vocab_;
  float eps_;
};

// SwiGLU MLP: down(silu(gate x) * up x), with observers on the inputs.
struct SwigluWeights {
  std::string prefix;  // e.g. "model.layers.0.mlp." ; module names are prefix + gate_proj etc.
  std::string gate_name, up_name, down_name;  // full module names
  std::vector<float> gate, up, down;          // [I, H], [I, H], [H, I]
  int64_t inter = 0;
};
SwigluWeights load_swiglu(const Checkpoint& ckpt, const std::string& gate, const std::string& up,
                          const std::string& down, int64_t hidden, int64_t inter);
// The module names only, no weights: a routed expert another rank holds (ExpertExchange).
SwigluWeights swiglu_names(const std::string& gate, const std::string& up, const std::string& down,
                           int64_t inter);
// Whether routed expert e of `experts` is loaded and computed here.
bool holds_expert(const ExpertExchange* exchange, int64_t e, int64_t experts);
// out[rows, H] = mlp(x[rows, H]).
void swiglu_mlp(const SwigluWeights& w, const float* x, int64_t rows, int64_t hidden, float* out,
                Observer* observer);

// The decoder layer every family shares, in place on x[T, H]:
//   x += mixer(RMSNorm(x; in_norm));  x += ffn(RMSNorm(x; post_norm))
// mixer and ffn read n[T, H] and write y[T, H].
using SubLayer = std::function<void(const float* n, float* y)>;
void residual_layer(int64_t T, int64_t H, float eps, const std::vector<float>& in_norm,
                    const std::vector<float>& post_norm, float* x, const SubLayer& mixer,
                    const SubLayer& ffn);

// Routed experts: token t goes to experts chosen[t*K + j] with weights weight[t*K + j]. Each
// expert runs on the rows routed to it (observers see exactly those rows); y[t] is the weighted
// sum over j in slot order (a fixed order, whatever the expert order).
// With an exchange (expert parallelism) `experts` holds weights only for this rank's range; the
// rows routed elsewhere are sent to their owners, which run each expert on each source rank's
// rows separately, exactly the rows (in the order) one process would run it on for this
// micro-batch. The results, and so the output bytes, do not depend on the rank count.
void moe_dispatch_combine(const std::vector<SwigluWeights>& experts, const float* n, int64_t T,
                          int64_t H, int64_t K, const std::vector<int32_t>& chosen,
                          const std::vector<float>& weight, float* y, Observer* observer,
                          ExpertExchange* exchange = nullptr);

}  // namespace strata::model

namespace strata::model {

// Grouped-query self-attention with optional q/k/v biases and per-head q/k RMSNorm (Qwen3),
// half-split RoPE over the whole head.
struct GqaAttention {
  std::string prefix;  // "model.layers.N.self_attn."
  int64_t hidden = 0, n_heads = 0, n_kv = 0, head_dim = 0;
  float qk_norm_eps = 0.0f;
  std::vector<float> wq, wk, wv, wo;  // [nH·d, H], [nKV·d, H], [nKV·d, H], [H, nH·d]
  std::vector<float> bq, bk, bv;      // empty when there are no biases
  std::vector<float> q_norm, k_norm;  // [d], empty when absent
  ops::RopeParams rope;
  std::vector<double> inv_freq;

  static GqaAttention load(const ModelConfig& config, const Checkpoint& ckpt,
                           const std::string& prefix);
  // out[T, H] = attention(x[T, H]) (x already normalised).
  void forward(const Batch& batch, const float* x, float* out, Observer* observer) const;
};

}  // namespace strata::model
