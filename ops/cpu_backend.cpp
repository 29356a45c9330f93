#include "ops/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>

#include "core/error.h"
#include "ops/ops.h"
#include "quant/fp8.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"
#include "quant/scale_search.h"

namespace strata {

int expert_owner(int64_t e, int64_t experts, int ranks) {
  STRATA_ASSERT(e >= 0 && e < experts && ranks >= 1, "expert ", e, " of ", experts);
  int r = 0;
  while (experts * (r + 1) / ranks <= e)
    ++r;
  return r;
}

}  // namespace strata

namespace strata::ops {
namespace {

const float* f32(const Weight& w) {
  // The CPU's binder decompresses on load: a deferred decompression is the CUDA backend's alone.
  STRATA_ASSERT(!w.deferred(), "the CPU backend got a weight with deferred decompression");
  return static_cast<const float*>(w.data);
}

// The input of linear `w` as a server computes on it: x itself, or x[rows, w.cols()] quantized
// as w.input_quant says into `buf` (kept when `buf_quant` says it already holds that).
const float* linear_input(const Weight& w, const float* x, int64_t rows, std::vector<float>& buf,
                          ActQuant& buf_quant) {
  if (!w.input_quant.on()) return x;
  if (buf_quant == w.input_quant) return buf.data();
  const int64_t n = rows * w.cols();
  buf.assign(x, x + n);
  fake_quantize(w.input_quant, buf.data(), rows, w.cols(), "a linear's input");
  buf_quant = w.input_quant;
  return buf.data();
}

}  // namespace

float* CpuBackend::take(int64_t n) {
  buffers_.emplace_back();
  buffers_.back().f.assign(static_cast<size_t>(n), 0.0f);
  return buffers_.back().f.data();
}

int32_t* CpuBackend::take_i32(int64_t n) {
  buffers_.emplace_back();
  buffers_.back().i.assign(static_cast<size_t>(n), 0);
  return buffers_.back().i.data();
}

void CpuBackend::release(uint64_t mark) {
  STRATA_ASSERT(mark <= buffers_.size(), "scratch released past its mark");
  buffers_.resize(mark);
}

void CpuBackend::observe(const std::vector<std::string>& names, const float* x, int64_t rows,
                         int64_t cols) {
  if (!observer_) return;
  observer_->observe_shared(names, x, rows, cols);
}

void CpuBackend::observe_sequences(const std::string& name, const float* x, const Tokens& t,
                                   const KvLayout& layout) {
  if (!observer_) return;
  std::vector<int64_t> ids = t.seq_ids;
  if (ids.empty()) {
    ids.resize(static_cast<size_t>(t.n_seqs()));
    std::iota(ids.begin(), ids.end(), int64_t{0});
  }
  STRATA_ASSERT(static_cast<int64_t>(ids.size()) == t.n_seqs(), "sequence ids of a batch");
  observer_->observe_sequences(name, x, t.seq_bounds, ids, layout);
}

void CpuBackend::observe_routing(const std::string& router, const int32_t* chosen, int64_t tokens,
                                 int64_t k) {
  if (observer_) observer_->observe_routing(router, chosen, tokens, k);
}

void CpuBackend::fake_quantize(float* x, int64_t rows, int64_t cols, const ActQuant& q,
                               std::string_view name) {
  strata::fake_quantize(q, x, rows, cols, name);
}

void CpuBackend::linears(const float* x, int64_t m, std::initializer_list<Out> outs) {
  std::vector<float> quantized;  // the input as the weights' input_quant says, when set
  ActQuant held;
  for (const Out& o : outs) {
    const float* in = linear_input(*o.w, x, m, quantized, held);
    ops::linear(in, m, o.w->cols(), f32(*o.w), o.w->rows(), o.y, o.bias ? f32(*o.bias) : nullptr);
    if (bf16_ops_ && !o.w->f32) ops::round_bf16(o.y, m * o.w->rows());
  }
}

void CpuBackend::rms_norm(const float* x, int64_t rows, int64_t dim, const Weight& w, float eps,
                          float* y) {
  if (!bf16_ops_ || w.offset != 0.0f || w.norm_fp32) {
    ops::rms_norm(x, rows, dim, f32(w), eps, y, w.offset);
    round_ops(y, rows * dim);
    return;
  }
  // LlamaRMSNorm: x / rms(x) cast to bf16, then times the bf16 weight.
  ops::rms_norm(x, rows, dim, nullptr, eps, y);
  const float* wf = f32(w);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < dim; ++i) {
      float& v = y[r * dim + i];
      v = ops::bf16(wf[i] * ops::bf16(v));
    }
  }
}

void CpuBackend::layer_norm(const float* x, int64_t rows, int64_t dim, const Weight& w,
                            const Weight& b, float eps, float* y) {
  ops::layer_norm(x, rows, dim, w.defined() ? f32(w) : nullptr, b.defined() ? f32(b) : nullptr, eps,
                  y);
  round_ops(y, rows * dim);
}

void CpuBackend::add(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    y[i] += x[i];
  round_ops(y, n);
}

void CpuBackend::round_bf16(float* x, int64_t n) {
  ops::round_bf16(x, n);
}

void CpuBackend::swiglu(const float* gate, const float* up, int64_t n, float* h) {
  ops::swiglu(gate, up, n, h, bf16_ops_);
}

void CpuBackend::add_sigmoid_gated(float* y, const float* s, const float* g, int64_t rows,
                                   int64_t cols) {
  if (bf16_ops_) {  // sigmoid(shared_expert_gate(x)) * shared_expert(x), added, in bf16
    for (int64_t t = 0; t < rows; ++t) {
      const float w = ops::bf16(ops::sigmoid(ops::bf16(g[t])));
      for (int64_t c = 0; c < cols; ++c)
        y[t * cols + c] = ops::bf16(y[t * cols + c] + ops::bf16(w * s[t * cols + c]));
    }
    return;
  }
  for (int64_t t = 0; t < rows; ++t) {
    const float w = ops::sigmoid(g[t]);
    for (int64_t c = 0; c < cols; ++c)
      y[t * cols + c] += w * s[t * cols + c];
  }
}

void CpuBackend::mul_sigmoid(float* x, const float* g, int64_t n) {
  if (bf16_ops_) {
    for (int64_t i = 0; i < n; ++i)
      x[i] = ops::bf16(x[i] * ops::bf16(ops::sigmoid(g[i])));
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    x[i] *= ops::sigmoid(g[i]);
}

void CpuBackend::sigmoid(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    x[i] = ops::sigmoid(x[i]);
  round_ops(x, n);
}

void CpuBackend::copy_cols(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                           int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    std::copy_n(src + r * src_stride, cols, dst + r * dst_stride);
}

namespace {

// y[m, n] = x[m, k] · W^T, then + bias: under bf16_ops the GEMM's output and the sum each rounded
// (GptOssExperts adds its biases after the GEMM, not inside it).
void linear_then_bias(const float* x, int64_t m, const Weight& w, const Weight& bias, float* y,
                      bool rounded) {
  const float* b = bias.defined() ? f32(bias) : nullptr;
  ops::linear(x, m, w.cols(), f32(w), w.rows(), y, rounded ? nullptr : b);
  if (!rounded) return;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < w.rows(); ++c) {
      float& v = y[r * w.rows() + c];
      v = ops::bf16(ops::bf16(v) + (b ? b[c] : 0.0f));
    }
  }
}

}  // namespace

void CpuBackend::mlp(const Mlp& w, const float* x, int64_t rows, float* y) {
  const int64_t H = w.hidden;
  observe(w.gate_up_names, x, rows, H);
  std::vector<float> quantized;  // an input as the weights' input_quant says, when set
  ActQuant held;
  if (w.interleaved) {  // gpt-oss
    std::vector<float> gu(static_cast<size_t>(rows * 2 * w.inter)),
        h(static_cast<size_t>(rows * w.inter));
    linear_then_bias(linear_input(w.gate_up, x, rows, quantized, held), rows, w.gate_up,
                     w.gate_up_bias, gu.data(), bf16_ops_);
    ops::swiglu_clamped(gu.data(), rows * w.inter, w.alpha, w.limit, h.data(), bf16_ops_);
    observe(w.down_names, h.data(), rows, w.inter);
    held = {};
    linear_then_bias(linear_input(w.down, h.data(), rows, quantized, held), rows, w.down,
                     w.down_bias, y, bf16_ops_);
    return;
  }
  std::vector<float> g(static_cast<size_t>(rows * w.inter)), u(g.size());
  ops::linear(linear_input(w.gate, x, rows, quantized, held), rows, H, f32(w.gate), w.inter,
              g.data());
  ops::linear(linear_input(w.up, x, rows, quantized, held), rows, H, f32(w.up), w.inter, u.data());
  round_ops(g.data(), rows * w.inter);
  round_ops(u.data(), rows * w.inter);
  ops::swiglu(g.data(), u.data(), rows * w.inter, g.data(), bf16_ops_);
  observe(w.down_names, g.data(), rows, w.inter);
  held = {};
  ops::linear(linear_input(w.down, g.data(), rows, quantized, held), rows, w.inter, f32(w.down), H,
              y);
  round_ops(y, rows * H);
}

void CpuBackend::rope(float* x, const Tokens& t, int64_t n_heads, int64_t stride, int64_t offset,
                      int64_t rot_dim, const std::vector<double>& inv_freq, double attention_factor,
                      bool interleaved) {
  ops::rope(x, t.tokens, n_heads, stride, offset, rot_dim, t.positions, inv_freq, attention_factor,
            interleaved, bf16_ops_);
}

void CpuBackend::attention(const Tokens& t, const float* q, int64_t qs, const float* k, int64_t ks,
                           const float* v, int64_t vs, int64_t n_heads, int64_t n_kv, int64_t dq,
                           int64_t dv, float scale, float* out, const AttentionVariant& variant) {
  const float* sinks = variant.sinks ? f32(*variant.sinks) : nullptr;
  const ops::Bf16Attention rounding = !bf16_ops_      ? ops::Bf16Attention::kNone
                                      : variant.eager ? ops::Bf16Attention::kEager
                                                      : ops::Bf16Attention::kFlash;
  for (int64_t s = 0; s < t.n_seqs(); ++s) {
    const int64_t b = t.seq_bounds[s], len = t.seq_bounds[s + 1] - b;
    const uint32_t* keep =
        variant.keep ? reinterpret_cast<const uint32_t*>(variant.keep) + b * variant.keep_words
                     : nullptr;
    ops::attention_causal(q + b * qs, qs, k + b * ks, ks, v + b * vs, vs, len, n_heads, n_kv, dq,
                          dv, scale, out + b * n_heads * dv, sinks, variant.window, keep,
                          variant.keep_words, rounding);
  }
}

void CpuBackend::index_topk(const Tokens& t, const float* q, const float* k, const float* w_in,
                            int64_t n_heads, int64_t d, float scale, float w_scale, int64_t top_k,
                            int32_t* keep, int64_t words) {
  std::vector<float> rounded;
  const float* w = w_in;
  if (bf16_ops_) {  // weights_proj is a bf16 linear in the source
    rounded.assign(w_in, w_in + t.tokens * n_heads);
    ops::round_bf16(rounded.data(), t.tokens * n_heads);
    w = rounded.data();
  }
  for (int64_t s = 0; s < t.n_seqs(); ++s) {
    const int64_t b = t.seq_bounds[s], len = t.seq_bounds[s + 1] - b;
    ops::index_topk(q + b * n_heads * d, k + b * d, w + b * n_heads, len, n_heads, d, scale,
                    w_scale, top_k, reinterpret_cast<uint32_t*>(keep) + b * words, words);
  }
}

void CpuBackend::mla_kv(const float* kv, const float* kr, int64_t T, int64_t nH, int64_t dn,
                        int64_t dr, int64_t dv, float* k, float* v) {
  const int64_t dq = dn + dr;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < nH; ++h) {
      const float* src = &kv[(t * nH + h) * (dn + dv)];
      std::copy_n(src, dn, &k[(t * nH + h) * dq]);
      std::copy_n(&kr[t * dr], dr, &k[(t * nH + h) * dq + dn]);
      std::copy_n(src + dn, dv, &v[(t * nH + h) * dv]);
    }
  }
}

void CpuBackend::conv_silu(const Tokens& t, const float* x, int64_t C, const Weight& w, int64_t K,
                           float* y) {
  for (int64_t s = 0; s < t.n_seqs(); ++s) {
    const int64_t b = t.seq_bounds[s], len = t.seq_bounds[s + 1] - b;
    ops::causal_conv1d(x + b * C, C, len, C, f32(w), K, y + b * C);
  }
  round_ops(y, t.tokens * C);
  for (int64_t i = 0; i < t.tokens * C; ++i)
    y[i] = ops::silu(y[i]);
  round_ops(y, t.tokens * C);
}

void CpuBackend::l2_norm_scale(float* x, int64_t rows, int64_t dim, float eps, float scale) {
  ops::l2_norm(x, rows, dim, eps);
  if (scale == 1.0f) return;
  for (int64_t i = 0; i < rows * dim; ++i)
    x[i] *= scale;
}

void CpuBackend::kda_forget_gate(float* g, int64_t T, int64_t nH, int64_t d, const Weight& a_log,
                                 const Weight& dt_bias) {
  const float* al = f32(a_log);
  const float* db = f32(dt_bias);
  const int64_t D = nH * d;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < nH; ++h) {
      const float rate = std::exp(al[h]);
      for (int64_t i = 0; i < d; ++i) {
        float& z = g[t * D + h * d + i];
        const float zb = z + db[h * d + i];
        const float softplus = zb > 20.0f ? zb : std::log(1.0f + std::exp(zb));
        z = -rate * softplus;
      }
    }
  }
}

void CpuBackend::gated_delta_rule(const Tokens& t, const float* q, const float* k, const float* v,
                                  const float* g, const float* beta, int64_t nH, int64_t dk,
                                  int64_t dv, float* out, bool head_decay) {
  const int64_t g_row = head_decay ? nH : nH * dk;
  for (int64_t s = 0; s < t.n_seqs(); ++s) {
    const int64_t b = t.seq_bounds[s], len = t.seq_bounds[s + 1] - b;
    ops::gated_delta_rule(q + b * nH * dk, k + b * nH * dk, v + b * nH * dv, g + b * g_row,
                          beta + b * nH, len, nH, dk, dv, out + b * nH * dv, head_decay);
  }
  round_ops(out, t.tokens * nH * dv);
}

void CpuBackend::route_softmax(float* probs, int64_t T, int64_t E, int64_t K,
                               const SoftmaxRouting& r, int32_t* chosen, float* weight) {
  const bool renormalize = r.renormalize;
  round_ops(probs, T * E);  // the router's logits
  ops::softmax(probs, T, E);
  for (int64_t t = 0; t < T; ++t) {
    auto idx = ops::top_k(&probs[t * E], E, K);
    float sum = 0.0f;
    for (int64_t j = 0; j < K; ++j)
      sum += probs[t * E + idx[j]];
    for (int64_t j = 0; j < K; ++j) {
      chosen[t * K + j] = idx[j];
      weight[t * K + j] = probs[t * E + idx[j]] / (renormalize ? sum : 1.0f);
    }
  }
  if (r.bf16_weights) round_ops(weight, T * K);
}

void CpuBackend::route_sigmoid(float* s, int64_t T, int64_t E, int64_t K, const SigmoidRouting& r,
                               int32_t* chosen_all, float* weight_all) {
  if (r.bf16_logits) round_ops(s, T * E);
  for (int64_t i = 0; i < T * E; ++i)
    s[i] = ops::sigmoid(s[i]);
  const std::vector<float> zeros(r.bias ? 0 : static_cast<size_t>(E), 0.0f);
  const float* bias = r.bias ? f32(*r.bias) : zeros.data();
  const int64_t n_group = r.n_group, per = E / n_group;
  std::vector<float> choice(E), group_score(n_group), masked(E);
  for (int64_t t = 0; t < T; ++t) {
    const float* st = &s[t * E];
    int32_t* chosen = &chosen_all[t * K];
    float* weight = &weight_all[t * K];
    for (int64_t e = 0; e < E; ++e)
      choice[e] = st[e] + bias[e];
    for (int64_t g = 0; g < n_group; ++g) {
      auto top = ops::top_k(&choice[g * per], per, std::min<int64_t>(2, per));
      float sum = 0.0f;
      for (int32_t i : top)
        sum += choice[g * per + i];
      group_score[g] = sum;
    }
    auto keep = ops::top_k(group_score.data(), n_group, r.topk_group);
    std::fill(masked.begin(), masked.end(), -INFINITY);
    for (int32_t g : keep)
      std::copy_n(&choice[g * per], per, &masked[g * per]);
    auto idx = ops::top_k(masked.data(), E, K);
    float sum = 0.0f;
    for (int64_t j = 0; j < K; ++j)
      sum += st[idx[j]];
    for (int64_t j = 0; j < K; ++j) {
      chosen[j] = idx[j];
      float w = st[idx[j]];
      if (r.renormalize) w /= (sum + 1e-20f);
      weight[j] = w * r.scaling;
    }
  }
}

namespace {

// Routed expert e on in[count, H] into out[count, H].
void run_expert(CpuBackend& be, const Mlp& expert, const float* in, int64_t count, float* out) {
  STRATA_ASSERT(count == 0 || expert.held(), "expert ", expert.gate_up_names[0],
                " is not held by this rank");
  be.mlp(expert, in, count, out);
}

// slot_out [T*K, H] = the output of expert chosen[s] on row s / K of n, for every slot s; each
// expert runs on the slots routed to it in increasing order.
void experts_local(CpuBackend& be, std::span<const Mlp> experts, const float* n, int64_t T,
                   int64_t H, int64_t K, const int32_t* chosen, float* slot_out) {
  for (int64_t e = 0; e < static_cast<int64_t>(experts.size()); ++e) {
    std::vector<int64_t> slots;  // t*K + j routed to e
    for (int64_t s = 0; s < T * K; ++s) {
      if (chosen[s] == e) slots.push_back(s);
    }
    const int64_t rows = static_cast<int64_t>(slots.size());
    std::vector<float> in(rows * H), out(rows * H);  // [rows, H]
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(n + (slots[r] / K) * H, H, &in[r * H]);
    run_expert(be, experts[e], in.data(), rows, out.data());
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(&out[r * H], H, &slot_out[slots[r] * H]);
  }
}

// The same with the experts spread over ranks. Dispatch rows are [i32 expert | H x f32]; each
// rank sends, in rank order, its slots grouped by expert (ascending: the owners' ranges are
// contiguous) and in increasing slot order within an expert. The owner runs each of its experts
// once per source rank on that rank's rows, then returns [H x f32] rows in the order received.
// The results, and so the output bytes, do not depend on the rank count.
void experts_exchanged(CpuBackend& be, std::span<const Mlp> experts, const float* n, int64_t T,
                       int64_t H, int64_t K, const int32_t* chosen, float* slot_out,
                       ExpertExchange& exchange) {
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
      run_expert(be, experts[e], in.data(), rows, out.data());
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

// y[T, H] from slot_out [T, K, H] as transformers' expert loop in bf16: per token, its slots in
// increasing expert order, each output times its weight rounded and added to the bf16 sum
// (index_add_), which starts at zero.
void combine_bf16(const float* slot_out, int64_t T, int64_t H, int64_t K, const int32_t* chosen,
                  const float* weight, float* y) {
  std::vector<int64_t> order(static_cast<size_t>(K));
  for (int64_t t = 0; t < T; ++t) {
    std::iota(order.begin(), order.end(), int64_t{0});
    std::sort(order.begin(), order.end(),
              [&](int64_t a, int64_t b) { return chosen[t * K + a] < chosen[t * K + b]; });
    float* yt = y + t * H;
    std::fill(yt, yt + H, 0.0f);
    for (int64_t j : order) {
      const float w = weight[t * K + j];
      const float* o = slot_out + (t * K + j) * H;
      for (int64_t c = 0; c < H; ++c)
        yt[c] = ops::bf16(yt[c] + ops::bf16(w * o[c]));
    }
  }
}

}  // namespace

void CpuBackend::moe(const float* n, int64_t T, int64_t H, int64_t K, const int32_t* chosen,
                     const float* weight, std::span<const Mlp> experts, float* y) {
  std::vector<float> slot_out(T * K * H);  // [T, K, H]
  if (exchange_ && exchange_->ranks() > 1) {
    experts_exchanged(*this, experts, n, T, H, K, chosen, slot_out.data(), *exchange_);
  } else {
    experts_local(*this, experts, n, T, H, K, chosen, slot_out.data());
  }
  if (bf16_ops_) {
    combine_bf16(slot_out.data(), T, H, K, chosen, weight, y);
    return;
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

// The weight as a tensor the encoders take (a view: the caller keeps the memory).
static Tensor stored_tensor(const StoredWeight& w) {
  STRATA_ASSERT(!w.compressed.defined(), "the CPU backend got a compressed weight to quantize");
  const size_t bytes = static_cast<size_t>(w.rows * w.cols * dtype_bits(w.dtype) / 8);
  return Tensor::view(w.dtype, {w.rows, w.cols}, w.data, bytes,
                      std::shared_ptr<const void>(w.data, [](const void*) {}));
}

void CpuBackend::weight_amaxes(const std::vector<std::vector<StoredWeight>>& groups, float* out) {
  for (size_t g = 0; g < groups.size(); ++g) {
    float a = 0.0f;
    for (const StoredWeight& sw : groups[g]) {
      const Tensor t = stored_tensor(sw);
      float x = 0.0f;
      for (int64_t i = 0; i < t.numel(); ++i) {
        const float v = std::fabs(t.item_f32(i));
        if (std::isnan(v)) {
          x = NAN;
          break;
        }
        x = std::max(x, v);
      }
      a = std::isnan(x) || std::isnan(a) ? NAN : std::max(a, x);
    }
    out[g] = a;
  }
}

QuantizedWeight CpuBackend::quantize_weight(const StoredWeight& w, QFormat format, float amax,
                                            std::string_view name, const WeightSearch* search) {
  const Tensor t = stored_tensor(w);
  STRATA_ASSERT(search == nullptr || format == QFormat::kNvfp4 || format == QFormat::kW4A16Nvfp4,
                "a scale search for ", name, " in ", qformat_name(format));
  QuantizedWeight q;
  switch (format) {
    case QFormat::kNvfp4:
    case QFormat::kW4A16Nvfp4:
      q.nvfp4 =
          search
              ? nvfp4_quantize_with_scales(
                    t, amax,
                    nvfp4_search_block_scales(t, amax, search->calib, search->hessian, name), name)
              : nvfp4_quantize(t, amax, name);
      break;
    case QFormat::kFp8:
      // fp32_quotient: the same values in fp32, whose quotient nothing rounds (fp8.h).
      q.fp8 = fp8_quantize(w.fp32_quotient ? t.to_f32() : t, amax, name);
      break;
    case QFormat::kMxfp8:
      q.mxfp8 = mxfp8_quantize(t, name);
      break;
    case QFormat::kW4A16Nvfp4Bs32:
      q.nvfp4 = nvfp4_quantize(t, amax, name, kNvfp4Bs32BlockSize);
      break;
    case QFormat::kMxfp4:
      q.mxfp4 = mxfp4_quantize(t, name);
      break;
    case QFormat::kFp8PbWo:
      q.fp8 = fp8_pb_quantize(t, name, amax);
      break;
    case QFormat::kNone:
      STRATA_ASSERT(false, "quantize_weight of ", name, " in no format");
  }
  return q;
}

}  // namespace strata::ops
