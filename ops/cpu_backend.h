// The CPU implementation of the backend (ops/backend.h): host memory, fp32 throughout (under
// bf16_ops rounded to bf16 where ops/backend.h says), built on the ops of ops/ops.h (each with its
// scalar reference). Observations go to an Observer; with an
// ExpertExchange the routed experts are spread over ranks (docs/SCALEOUT.md "Expert parallel").
#pragma once

#include <deque>
#include <vector>

#include "ops/backend.h"

namespace strata::ops {

class CpuBackend final : public Backend {
 public:
  CpuBackend(Observer* observer, ExpertExchange* exchange)
      : observer_(observer), exchange_(exchange) {}

  float* take(int64_t n) override;
  int32_t* take_i32(int64_t n) override;
  uint64_t mark() const override { return buffers_.size(); }
  void release(uint64_t mark) override;

  void observe(const std::vector<std::string>& names, const float* x, int64_t rows,
               int64_t cols) override;
  void observe_routing(const std::string& router, const int32_t* chosen, int64_t tokens,
                       int64_t k) override;
  void observe_sequences(const std::string& name, const float* x, const Tokens& t,
                         const KvLayout& layout) override;
  void fake_quantize(float* x, int64_t rows, int64_t cols, const ActQuant& q,
                     std::string_view name) override;
  void linears(const float* x, int64_t m, std::initializer_list<Out> outs) override;
  void rms_norm(const float* x, int64_t rows, int64_t dim, const Weight& w, float eps,
                float* y) override;
  void layer_norm(const float* x, int64_t rows, int64_t dim, const Weight& w, const Weight& b,
                  float eps, float* y) override;
  void add(float* y, const float* x, int64_t n) override;
  void round_bf16(float* x, int64_t n) override;
  void swiglu(const float* gate, const float* up, int64_t n, float* h) override;
  void add_sigmoid_gated(float* y, const float* s, const float* g, int64_t rows,
                         int64_t cols) override;
  void mul_sigmoid(float* x, const float* g, int64_t n) override;
  void sigmoid(float* x, int64_t n) override;
  void copy_cols(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
                 int64_t cols) override;
  void mlp(const Mlp& w, const float* x, int64_t rows, float* y) override;
  void rope(float* x, const Tokens& t, int64_t n_heads, int64_t stride, int64_t offset,
            int64_t rot_dim, const std::vector<double>& inv_freq, double attention_factor,
            bool interleaved) override;
  void attention(const Tokens& t, const float* q, int64_t q_stride, const float* k,
                 int64_t k_stride, const float* v, int64_t v_stride, int64_t n_heads, int64_t n_kv,
                 int64_t dq, int64_t dv, float scale, float* out,
                 const AttentionVariant& variant) override;
  void index_topk(const Tokens& t, const float* q, const float* k, const float* w, int64_t n_heads,
                  int64_t d, float scale, float w_scale, int64_t top_k, int32_t* keep,
                  int64_t words) override;
  void mla_kv(const float* kv, const float* kr, int64_t T, int64_t n_heads, int64_t dn, int64_t dr,
              int64_t dv, float* k, float* v) override;
  void conv_silu(const Tokens& t, const float* x, int64_t C, const Weight& w, int64_t K,
                 float* y) override;
  void l2_norm_scale(float* x, int64_t rows, int64_t dim, float eps, float scale) override;
  void kda_forget_gate(float* g, int64_t T, int64_t n_heads, int64_t d, const Weight& a_log,
                       const Weight& dt_bias) override;
  void gated_delta_rule(const Tokens& t, const float* q, const float* k, const float* v,
                        const float* g, const float* beta, int64_t n_heads, int64_t dk, int64_t dv,
                        float* out, bool head_decay) override;
  void route_softmax(float* logits, int64_t T, int64_t E, int64_t K, const SoftmaxRouting& r,
                     int32_t* chosen, float* weight) override;
  void route_sigmoid(float* logits, int64_t T, int64_t E, int64_t K, const SigmoidRouting& r,
                     int32_t* chosen, float* weight) override;
  void moe(const float* n, int64_t T, int64_t H, int64_t K, const int32_t* chosen,
           const float* weight, std::span<const Mlp> experts, float* y) override;
  void weight_amaxes(const std::vector<std::vector<StoredWeight>>& groups, float* out) override;
  QuantizedWeight quantize_weight(const StoredWeight& w, QFormat format, float amax,
                                  std::string_view name,
                                  const WeightSearch* search = nullptr) override;

 private:
  Observer* observer_;
  ExpertExchange* exchange_;
  struct Buffer {
    std::vector<float> f;
    std::vector<int32_t> i;
  };
  std::deque<Buffer> buffers_;  // scratch, released in reverse order
};

}  // namespace strata::ops
