// The one interface a decoder layer's forward is written against (docs/DESIGN.md "One backend").
//
// A family's layer (model/<family>.cpp) calls these ops on buffers that live where the backend
// computes: host memory for the CPU backend (ops/cpu_backend.h, built on the scalar-referenced
// ops of ops/ops.h), device memory for the CUDA backend (ops/cuda/cuda_backend.h, built on the
// kernels of ops/cuda/). The engine picks the backend from where the layer's weights and hidden
// states live; the layer code is the same for both.
//
// Conventions:
// - Activations are row-major fp32 buffers with one row per token, [rows, cols], in backend
//   memory. Shapes are given in comments as [rows, cols].
// - Weights are opaque Weight handles made by the backend's binder (model/layer.h) in the
//   checkpoint's layout W[out, in]: the CPU holds them in fp32; the CUDA backend holds GEMM
//   weights in the GEMM dtype (bf16, or fp32 in the exact-GEMM mode) and vectors in fp32.
// - Observers: observe() reports the amax of an input under one or more hub names
//   (model/forward.h); a fused input (q/k/v, gate/up) is observed once under all its names.
// - Scratch: take() hands out buffers that stay valid until release() of an earlier mark().
// - Each backend states its numerics: the CPU computes GEMMs in fp32 with fp32 weights; the CUDA
//   backend rounds GEMM inputs to bf16 (gemm_bf16) and accumulates in fp32. Within one backend
//   the results do not depend on the batch composition, the thread count or the rank count.
// - Precision (set_bf16_ops; --calib_precision, docs/FORWARD.md "Calibration precision"): by
//   default every op computes and keeps fp32 (fp32_layers: the engine rounds to bf16 only between
//   layers). Under bf16_ops every op rounds its results to bf16 where transformers' bf16 model
//   rounds them, so that the observed amaxes are those of the bf16 PyTorch model that ModelOpt
//   calibrates; each op's comment says where ("bf16_ops: ..."). Ops keep computing in fp32
//   between those points, as PyTorch's bf16 kernels do (fp32 accumulation, fp32 internals of
//   norms, softmax and the delta rule). A family whose source computes a chain of ops in fp32
//   and casts once says so with an Fp32Ops scope and round_ops.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "quant/quantized.h"
#include "quant/recipe.h"

namespace strata {

// How a KV-cache input's channels are laid out, for its per-channel statistics: `heads` heads of
// head_dim channels; with pairs_from >= 0, channels [pairs_from, head_dim) of each head hold RoPE
// pairs interleaved (x0 y0 x1 y1 ...: MLA's rope part where the checkpoint rotates pairs), which
// transformers holds de-interleaved (x0 x1 ... y0 y1 ...) when ModelOpt sees K: the affine KV
// cache's bias is exported in that order (calib/max_calib.h kv_affine).
struct KvLayout {
  int64_t heads = 0, head_dim = 0;
  int64_t pairs_from = -1;
  int64_t channels() const { return heads * head_dim; }
};

// What the CPU backend reports observations to (the calibrator, tests): the hub names of
// model/forward.h.
class Observer {
 public:
  virtual ~Observer() = default;
  // x is [rows, cols] fp32, row-major.
  virtual void observe(std::string_view name, const float* x, int64_t rows, int64_t cols) = 0;
  // x observed under several names at once (one input read by several modules: q/k/v, gate/up);
  // by default each name on its own.
  virtual void observe_shared(std::span<const std::string> names, const float* x, int64_t rows,
                              int64_t cols) {
    for (const std::string& n : names)
      observe(n, x, rows, cols);
  }
  // A MoE layer's routing, under its router's module name ("model.layers.3.mlp.gate"): chosen
  // [tokens, k], the experts each token was sent to (strata compare; the CPU backend reports it).
  virtual void observe_routing(std::string_view /*router*/, const int32_t* /*chosen*/,
                               int64_t /*tokens*/, int64_t /*k*/) {}
  // The per-sequence, per-channel statistics of a KV-cache input (Backend::observe_sequences):
  // sequence seq_ids[s] of the calibration set spans rows [seq_bounds[s], seq_bounds[s+1]) of
  // x[rows, layout.channels()]. Only an observer that keeps them (the affine KV cache's
  // calibrator) needs them.
  virtual void observe_sequences(std::string_view /*name*/, const float* /*x*/,
                                 std::span<const int64_t> /*seq_bounds*/,
                                 std::span<const int64_t> /*seq_ids*/, const KvLayout& /*layout*/) {
  }
};

// Expert parallelism (docs/SCALEOUT.md "Expert parallel"): the routed experts of every MoE layer
// are split over `ranks()` processes in contiguous ranges (expert_owner); each process loads only
// its range. In a MoE layer every process sends each token's hidden state to the processes owning
// its top-k experts, computes its experts on the rows it receives and sends the results back; the
// weighted sum is then formed where the token lives. Every process must run the MoE layers the
// same number of times, in the same order (an empty Batch where it has none): the exchanges are
// collective.
class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual int rank() const = 0;
  virtual int ranks() const = 0;
  // Rows of `row_bytes` bytes: send_counts[r] rows go to rank r, taken in rank order from `send`;
  // returns the rows received, in rank order, and their counts per source rank.
  virtual std::vector<uint8_t> alltoallv_rows(const std::vector<uint8_t>& send,
                                              const std::vector<int64_t>& send_counts,
                                              size_t row_bytes,
                                              std::vector<int64_t>* recv_counts) = 0;
};

// Expert parallelism on GPU ranks (docs/SCALEOUT.md "Expert parallel on GPU ranks"): the same
// split of the routed experts, with the rows exchanged between the ranks' GPUs (NCCL in the
// engine, engine/nccl_comm.h) and the counts over the host communicator. Both calls are
// collective: every rank makes them in the same order.
class DeviceExpertExchange {
 public:
  virtual ~DeviceExpertExchange() = default;
  virtual int rank() const = 0;
  virtual int ranks() const = 0;
  // Host values: send_counts[r] values of `send` (in rank order) go to rank r; returns the values
  // received in rank order, recv_counts[r] of them from rank r.
  virtual std::vector<int64_t> exchange_counts(const std::vector<int64_t>& send,
                                               const std::vector<int64_t>& send_counts,
                                               std::vector<int64_t>* recv_counts) = 0;
  // Device rows of `row_bytes` bytes, queued on `stream` (a cudaStream_t): send_counts[r] rows
  // of `send` (in rank order) go to rank r, recv_counts[r] rows from rank r land in `recv` in rank
  // order. The counts must agree with the peers' (exchange_counts first).
  virtual void alltoallv_rows(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                              const std::vector<int64_t>& recv_counts, size_t row_bytes,
                              void* stream) = 0;
};

// The rank holding routed expert e of `experts` over `ranks` ranks: rank r holds the contiguous
// range [experts·r / ranks, experts·(r+1) / ranks) (rounded down; empty when experts < ranks).
int expert_owner(int64_t e, int64_t experts, int ranks);

}  // namespace strata

namespace strata::ops {

// A compressed weight whose decompression the backend defers to where it is used: its stored
// bytes in backend memory and what the decompression needs (ops/cuda/convert.h dequant_*, the
// same bits as io/source_weights.h decompresses). Only the CUDA backend holds one: the routed
// experts of a compressed source when the memory plan slices them (docs/CUDA.md "Memory"); the
// CPU backend's binder decompresses on load and the CPU backend asserts it never gets one.
struct Compressed {
  // kNvfp4, kFp8, kMxfp8: a ModelOpt export's weights (spec/format.md §1, §2, §7), which strata
  // compare's GPU forward reads (an export's MXFP4 weight is kMxfp4's layout).
  enum class Kind : uint8_t { kNone, kInt4Pack, kMxfp4, kFp8Block, kNvfp4, kFp8, kMxfp8 };
  Kind kind = Kind::kNone;
  // kInt4Pack: int32 words [out, ceil(in / 8)], 8 nibbles each; kMxfp4: blocks U8 [out, groups,
  // 16]; kFp8Block: F8_E4M3 [out, in]; kNvfp4: packed E2M1 U8 [out, in / 2]; kFp8, kMxfp8:
  // F8_E4M3 [out, in].
  const void* values = nullptr;
  // kInt4Pack: [out, ceil(in / group)]; kMxfp4: E8M0 [out, groups]; kFp8Block: scale_inv
  // [ceil(out / group), ceil(in / group)]; kNvfp4: F8_E4M3 [out, in / group]; kFp8: F32, one
  // (group 0) or [ceil(out / 128), ceil(in / 128)] (group 128, fp8_pb_wo); kMxfp8: E8M0 [out,
  // in / 32].
  const void* scales = nullptr;
  DType scale_dtype = DType::kBF16;    // kInt4Pack, kFp8Block: F32, F16 or BF16
  int64_t group = 0;                   // kInt4Pack: the group size; kFp8Block: the block edge
  int64_t stored_cols = 0;             // kMxfp4: groups a row (the blocks' second dimension)
  const void* global_scale = nullptr;  // kNvfp4: weight_scale_2, one F32
  bool defined() const { return kind != Kind::kNone; }
};

// A weight as the backend holds it. `data` is backend memory (null while only sizing, or when
// `compressed` defers its decompression).
struct Weight {
  const void* data = nullptr;
  Shape shape;       // the checkpoint's shape, e.g. [out, in]
  bool f32 = false;  // held in fp32 and multiplied in fp32 (routers, gates, norms, biases)
  // A norm weight stored zero-centred (Qwen3-Next, Qwen3.5: RMSNorm multiplies by 1 + w): rms_norm
  // uses offset + w. Only rms_norm reads it; the family sets it after binding.
  float offset = 0.0f;
  // How a server quantizes this linear's input before its GEMM (strata compare's simulation of a
  // served export, set by the binder from the export's input scales; none: the input as is).
  // Both backends' linears, mlp and moe apply it to a copy of the input (bit-identical quantizers,
  // ops/cuda/fake_quant.h); the CUDA backend's moe() takes one per layer for all routed experts.
  ActQuant input_quant{};
  // bf16_ops: rms_norm multiplies by this weight in fp32 and rounds once (gpt-oss's RMSNorm; always
  // with an offset), instead of rounding x / rms(x) to bf16 first and then its product with the
  // bf16 weight (LlamaRMSNorm and most others). Only rms_norm reads it; the family sets it.
  bool norm_fp32 = false;
  // The CUDA backend's deferred decompression (Compressed); data is then null.
  Compressed compressed{};
  bool defined() const { return !shape.empty(); }
  bool deferred() const { return compressed.defined(); }
  int64_t rows() const { return shape.empty() ? 0 : shape[0]; }
  int64_t cols() const { return shape.size() < 2 ? 0 : shape.back(); }
};

// A SwiGLU MLP: down(silu(gate x) * up x), with the hub names its inputs are observed under.
// gpt-oss's experts instead: gate and up interleaved in one weight with a bias, the clamped
// activation, and a bias on down:
//   gu = gate_up x + gate_up_bias;  h = ops::swiglu_clamped(gu; alpha, limit);  down h + down_bias
struct Mlp {
  Weight gate, up, down;  // [I, H], [I, H], [H, I]; undefined for a routed expert not held here
  Weight gate_up;         // [2I, H] (gate row 2i, up row 2i + 1): gpt-oss, gate and up undefined
  Weight gate_up_bias, down_bias;    // [2I], [H] fp32; undefined when absent
  bool interleaved = false;          // gpt-oss's form (gate_up, biases, swiglu_clamped)
  float alpha = 0.0f, limit = 0.0f;  // swiglu_clamped's
  int64_t hidden = 0, inter = 0;
  std::vector<std::string> gate_up_names;  // {gate module, up module}, or {gate_up module}
  std::vector<std::string> down_names;     // {down module}
  bool held() const { return gate.defined() || gate_up.defined(); }
};

// gpt-oss's attention variants (ops::attention_causal): keys within a sliding window of
// `window` tokens, the query's own included (0: the whole causal prefix), and one sink logit per
// head (null: none). DeepSeek-V3.2's sparse attention: `keep` [tokens, keep_words] (backend
// memory, as Backend::index_topk writes it) lets token t see only the keys of its sequence whose
// bit is set in its row (bit j: the key at position j of the sequence).
// `eager`: under bf16_ops, round as transformers' eager attention (gpt-oss, the one family whose
// sinks need it) rather than as the fused sdpa kernels (see Backend::attention).
struct AttentionVariant {
  int64_t window = 0;
  const Weight* sinks = nullptr;  // [n_heads] fp32
  const int32_t* keep = nullptr;
  int64_t keep_words = 0;
  bool eager = false;
};

// The tokens of a ragged batch: whole sequences, concatenated, no padding.
struct Tokens {
  int64_t tokens = 0;
  const int64_t* positions = nullptr;  // backend memory [tokens]: position within its sequence
  std::vector<int64_t> seq_bounds;     // host: sequence s spans [seq_bounds[s], seq_bounds[s+1])
  // host: sequence s's index in the calibration set (Batch::seq_ids); empty where no observer
  // needs it (sizing runs, strata compare): then 0, 1, ...
  std::vector<int64_t> seq_ids;
  // The CUDA backend's copies (device memory): each token's chunk-relative sequence start
  // [tokens], and seq_bounds [n_seqs + 1].
  const int64_t* seq_start = nullptr;
  const int64_t* seq_bounds_dev = nullptr;
  int64_t n_seqs() const { return static_cast<int64_t>(seq_bounds.size()) - 1; }
};

// A weight as the checkpoint stores it (BF16, F16 or F32, row-major [rows, cols]), where the
// backend's memory is: the input of weight quantization. Or, with `compressed` defined (data
// null, dtype BF16), a compressed weight that the CUDA backend decompresses to bf16 into a buffer
// of its own before it quantizes it (CudaBackend::reserve_decompression), as the CPU
// decompresses it to bf16.
struct StoredWeight {
  const void* data = nullptr;
  DType dtype = DType::kBF16;
  int64_t rows = 0, cols = 0;
  Compressed compressed{};
  // FP8: quantized as ModelOpt 0.47 exports a 3-D stacked expert weight (gpt-oss's fused experts):
  // it divides by the scale unsqueezed to one dimension, which promotes a bf16 weight to fp32, so
  // the quotient is fp32 (not rounded to the weight's dtype) and the divisor the fp32 scale itself.
  // A 2-D weight divides by the 0-dim scale in its own dtype (the default, format.md §2).
  bool fp32_quotient = false;
};

// An NVFP4 weight's scale search (Backend::quantize_weight): the recipe's algorithm (mse or
// fp8_scale_sweep), and for local_hessian the module's BlockHessian::normalized() (empty: the
// squared error, as for a module no calibration token reached). FP8's mse search spans a group
// and stays the exporter's (export/modelopt.h).
struct WeightSearch {
  WeightCalib calib;
  std::span<const double> hessian;
};

// One weight of Backend::quantize_weights: quantize_weight's arguments.
struct WeightJob {
  StoredWeight weight;
  QFormat format = QFormat::kNone;
  float amax = 0.0f;
  std::string_view name;
  const WeightSearch* search = nullptr;
};

// Names the part of a layer that the ops issued since the previous mark belong to (the CUDA
// backend's device-time profile, --gpu_profile; the CPU ignores it).
enum class Phase { kStart, kNorms, kMixer, kFfn };

class Backend {
 public:
  virtual ~Backend() = default;

  // ---- precision (see the header comment) ----------------------------------------------------
  bool bf16_ops() const { return bf16_ops_; }
  void set_bf16_ops(bool on) { bf16_ops_ = on; }
  // Under bf16_ops, x[n] rounded to bf16 (the cast that ends a chain the source computes in fp32,
  // run inside an Fp32Ops scope); otherwise nothing.
  void round_ops(float* x, int64_t n) {
    if (bf16_ops_) round_bf16(x, n);
  }

  // ---- scratch -------------------------------------------------------------------------------
  virtual float* take(int64_t n) = 0;  // fp32 [n], zeroed on the CPU
  virtual int32_t* take_i32(int64_t n) = 0;
  virtual uint64_t mark() const = 0;
  virtual void release(uint64_t mark) = 0;
  virtual void phase(Phase) {}

  // ---- observers -----------------------------------------------------------------------------
  // max |x| of x[rows, cols] under each of `names` (rows counted too).
  virtual void observe(const std::vector<std::string>& names, const float* x, int64_t rows,
                       int64_t cols) = 0;
  // A KV-cache input x[t.tokens, layout.channels()] (model/forward.h's k_cache / v_cache): each
  // sequence's per-channel sum, max and min (ops::column_stats), for the affine KV cache's
  // biases (calib/max_calib.h). The CPU hands x to the Observer (Observer::observe_sequences);
  // the CUDA backend reduces it on the device when CudaBackendOptions::sequence_stats is on.
  virtual void observe_sequences(const std::string& name, const float* x, const Tokens& t,
                                 const KvLayout& layout) = 0;

  // MoE routing under the router's module name (Observer::observe_routing); the CUDA backend
  // reports it only to an observer set for it (CudaBackend::set_routing_observer).
  virtual void observe_routing(const std::string& /*router*/, const int32_t* /*chosen*/,
                               int64_t /*tokens*/, int64_t /*k*/) {}

  // ---- serving simulation (strata compare) ---------------------------------------------------
  // x[rows, cols] fake-quantized in place as `q` says (quant/quantized.h fake_quantize): the KV
  // cache as a server stores it. `name` names the tensor in errors. Bit-identical on both
  // backends.
  virtual void fake_quantize(float* x, int64_t rows, int64_t cols, const ActQuant& q,
                             std::string_view name) = 0;

  // ---- GEMMs ---------------------------------------------------------------------------------
  // One input, several weights: y_i[m, n_i] = x[m, k] · W_i[n_i, k]^T (+ bias_i[n_i]); x as W_i's
  // input_quant says (each weight its own).
  // bf16_ops: y_i rounded once, bias included (torch's addmm), unless W_i is held in fp32
  // (Weight::f32: routers and gates, whose consumers round the result where the source does).
  struct Out {
    const Weight* w;
    float* y;
    const Weight* bias = nullptr;
  };
  virtual void linears(const float* x, int64_t m, std::initializer_list<Out> outs) = 0;
  void linear(const float* x, int64_t m, const Weight& w, float* y, const Weight* bias = nullptr) {
    linears(x, m, {Out{&w, y, bias}});
  }

  // ---- element-wise and row-wise (ops/ops.h has the CPU reference of each) -------------------
  // Per row of x[rows, dim]: x / sqrt(mean(x^2) + eps) * (w.offset + w). y may equal x.
  // bf16_ops: x / rms(x) rounded, then its product with w rounded (LlamaRMSNorm); with an offset
  // or Weight::norm_fp32, the product in fp32, rounded once.
  virtual void rms_norm(const float* x, int64_t rows, int64_t dim, const Weight& w, float eps,
                        float* y) = 0;
  // Per row of x[rows, dim]: torch.nn.LayerNorm, (x - mean) / sqrt(var + eps) * w + b. y may
  // equal x. bf16_ops: y rounded.
  virtual void layer_norm(const float* x, int64_t rows, int64_t dim, const Weight& w,
                          const Weight& b, float eps, float* y) = 0;
  virtual void add(float* y, const float* x, int64_t n) = 0;  // y += x (bf16_ops: rounded)
  virtual void round_bf16(float* x, int64_t n) = 0;
  // h = silu(gate) * up. bf16_ops: silu(gate) rounded, then the product (act_fn(gate) * up).
  virtual void swiglu(const float* gate, const float* up, int64_t n, float* h) = 0;
  // y[r, c] += sigmoid(g[r]) * s[r, c] for y, s [rows, cols], g [rows] (a shared expert's gate).
  // bf16_ops: g is the output of a bf16 linear in the source (rounded first); sigmoid(g), its
  // product with s and the sum each rounded.
  virtual void add_sigmoid_gated(float* y, const float* s, const float* g, int64_t rows,
                                 int64_t cols) = 0;
  // x[i] *= sigmoid(g[i]); x[i] = sigmoid(x[i]). bf16_ops: sigmoid(g) rounded, then the product;
  // sigmoid(x) rounded.
  virtual void mul_sigmoid(float* x, const float* g, int64_t n) = 0;
  virtual void sigmoid(float* x, int64_t n) = 0;
  // dst[r, 0:cols] = src[r, 0:cols], row strides in elements.
  virtual void copy_cols(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                         int64_t rows, int64_t cols) = 0;

  // ---- a SwiGLU MLP --------------------------------------------------------------------------
  // y[rows, H] = w(x[rows, H]); observes x under w.gate_up_names and the SwiGLU output under
  // w.down_names (before any input_quant of the weights applies). bf16_ops: as linears and
  // swiglu; gpt-oss's interleaved form as GptOssExperts runs it: each GEMM rounded, then its bias
  // added and rounded, and every step of ops::swiglu_clamped rounded (ops/ops.h).
  virtual void mlp(const Mlp& w, const float* x, int64_t rows, float* y) = 0;

  // ---- attention -----------------------------------------------------------------------------
  // ops::rope on x[T, n_heads, stride], columns [offset, offset + rot_dim) of each head, at the
  // tokens' positions. bf16_ops: cos and sin rounded, then each product and each sum
  // (transformers' apply_rotary_pos_emb in bf16).
  virtual void rope(float* x, const Tokens& t, int64_t n_heads, int64_t stride, int64_t offset,
                    int64_t rot_dim, const std::vector<double>& inv_freq, double attention_factor,
                    bool interleaved) = 0;
  // Causal attention within each sequence: q[T, nH, dq], k[T, nKV, dq], v[T, nKV, dv] with row
  // strides; out[T, nH, dv] contiguous. Query head h reads kv head h / (nH / nKV). `variant`:
  // gpt-oss's window and sinks (default: neither). bf16_ops: as torch's fused sdpa kernels (scores
  // and softmax in fp32, exp(s - max) rounded to bf16 before it multiplies V, the output divided
  // by the fp32 sum and rounded), or with variant.eager as transformers' eager attention (ops.h
  // Bf16Attention).
  virtual void attention(const Tokens& t, const float* q, int64_t q_stride, const float* k,
                         int64_t k_stride, const float* v, int64_t v_stride, int64_t n_heads,
                         int64_t n_kv, int64_t dq, int64_t dv, float scale, float* out,
                         const AttentionVariant& variant) = 0;
  // DeepSeek-V3.2's lightning indexer (ops::index_topk) on each sequence: q[T, nH, d], k[T, d],
  // w[T, nH]; keep[T, words] (words >= ceil(longest sequence / 32)), row t's bits over the
  // positions of t's sequence, for AttentionVariant::keep. bf16_ops: w (weights_proj's output, a
  // bf16 linear in the source) rounded first; the scores in fp32.
  virtual void index_topk(const Tokens& t, const float* q, const float* k, const float* w,
                          int64_t n_heads, int64_t d, float scale, float w_scale, int64_t top_k,
                          int32_t* keep, int64_t words) = 0;
  // MLA's per-head K and V: k[T, nH, dn + dr] = [kv[t, h, :dn] | kr[t, :]], v[T, nH, dv] =
  // kv[t, h, dn:], from kv[T, nH, dn + dv] and kr[T, dr].
  virtual void mla_kv(const float* kv, const float* kr, int64_t T, int64_t n_heads, int64_t dn,
                      int64_t dr, int64_t dv, float* k, float* v) = 0;

  // ---- linear attention (Kimi Delta Attention, Gated DeltaNet) ------------------------------
  // y[T, C] = silu(causal_conv1d(x[T, C]; w [C, 1, K])) within each sequence. bf16_ops: the
  // convolution rounded, then silu.
  virtual void conv_silu(const Tokens& t, const float* x, int64_t C, const Weight& w, int64_t K,
                         float* y) = 0;
  // Per row of x[rows, dim], in place: x / sqrt(sum(x^2) + eps) * scale. (fp32 under bf16_ops too:
  // the delta-rule kernels normalise after their cast to fp32.)
  virtual void l2_norm_scale(float* x, int64_t rows, int64_t dim, float eps, float scale) = 0;
  // g[T, nH, d] = -exp(a_log[h]) * softplus(g + dt_bias[h, i]) (softplus(z) = z for z > 20).
  // (fp32 under bf16_ops too, as the source computes it.)
  virtual void kda_forget_gate(float* g, int64_t T, int64_t n_heads, int64_t d, const Weight& a_log,
                               const Weight& dt_bias) = 0;
  // ops::gated_delta_rule on each sequence: q, k [T, nH, dk], v [T, nH, dv], beta [T, nH]; the
  // log decay g [T, nH, dk] (KDA), or [T, nH] when head_decay (Gated DeltaNet). bf16_ops: out
  // rounded (the recurrence in fp32).
  virtual void gated_delta_rule(const Tokens& t, const float* q, const float* k, const float* v,
                                const float* g, const float* beta, int64_t n_heads, int64_t dk,
                                int64_t dv, float* out, bool head_decay) = 0;

  // ---- mixture of experts --------------------------------------------------------------------
  // Softmax routing (Qwen MoE, Mixtral, gpt-oss): p = softmax(logits[t]) in fp32; chosen = top-K
  // of p (ties to the lower expert); weight = p_chosen (/ their sum when renormalize). logits
  // [T, E] may be overwritten; chosen int32 [T, K], weight [T, K]. bf16_ops: the logits are a bf16
  // linear's in the source (rounded first); the weights rounded when bf16_weights (Qwen MoE and
  // gpt-oss cast them to bf16, Mixtral keeps them fp32).
  struct SoftmaxRouting {
    bool renormalize = false;
    bool bf16_weights = false;
  };
  virtual void route_softmax(float* logits, int64_t T, int64_t E, int64_t K,
                             const SoftmaxRouting& r, int32_t* chosen, float* weight) = 0;
  // Sigmoid routing with group-limited selection (DeepSeek-V3 noaux_tc): s = sigmoid(logits);
  // choice = s + bias (bias [E] or undefined); the topk_group groups with the largest sums of
  // their top-2 choices; top-K of choice among them; weight = s_chosen (/ (their sum + 1e-20)
  // when renormalize) * scaling. bf16_ops: the logits rounded first when bf16_logits (MiniMax-M2's
  // router is a bf16 linear; DeepSeek's, GLM-4.5's and Kimi-Linear's run in fp32); the weights
  // stay fp32.
  struct SigmoidRouting {
    const Weight* bias = nullptr;
    int64_t n_group = 1, topk_group = 1;
    bool renormalize = false;
    float scaling = 1.0f;
    bool bf16_logits = false;
  };
  virtual void route_sigmoid(float* logits, int64_t T, int64_t E, int64_t K,
                             const SigmoidRouting& r, int32_t* chosen, float* weight) = 0;
  // y[t] = Σ_j weight[t, j] · experts[chosen[t, j]](n[t]) in j order; each expert runs on (and
  // observes) exactly the rows routed to it, in token order. The last route_* call must have
  // produced chosen/weight. bf16_ops: as transformers' expert loop, y[t] starts at zero and, in
  // increasing expert order, each expert's output times its weight is rounded and added, the sum
  // rounded (index_add_ into a bf16 tensor).
  virtual void moe(const float* n, int64_t T, int64_t H, int64_t K, const int32_t* chosen,
                   const float* weight, std::span<const Mlp> experts, float* y) = 0;

  // ---- weight quantization (quant/: one encoder per format, bit-identical on both backends) --
  // out[g] = max |w| over every weight of groups[g] (NaN when any element is NaN): an NVFP4
  // fused group's shared weight amax, or one FP8 module's own.
  virtual void weight_amaxes(const std::vector<std::vector<StoredWeight>>& groups, float* out) = 0;
  // `w` encoded in `format` (kNvfp4 / kW4A16Nvfp4 / kW4A16Nvfp4Bs32 with its group's amax, kFp8
  // with its own, kMxfp8 and kMxfp4 need none; the CUDA backend has no encoder for the last two
  // weight-only formats, which engine/weight_quantizer.h leaves to the CPU exporter) as host
  // tensors; throws strata::Error naming `name` as the encoders do. Both are synchronous and safe
  // to call from another thread than the forward's only on a backend of their own (the CUDA one
  // then uses its own stream).
  // search: NVFP4 block scales chosen by a weight scale search (quant/scale_search.h) instead of
  // each block's own amax, with the same bytes on both backends; nullptr: max calibration.
  virtual QuantizedWeight quantize_weight(const StoredWeight& w, QFormat format, float amax,
                                          std::string_view name,
                                          const WeightSearch* search = nullptr) = 0;
  // quantize_weight of each job, in order, the first failing job's error thrown. The CUDA
  // backend queues NVFP4 encoders back to back and brings their outputs back in one
  // synchronization for as many as its pinned stage holds (a Kimi-K2 layer's 1152 expert weights
  // in a handful instead of one each); the CPU's encodes one after another.
  virtual std::vector<QuantizedWeight> quantize_weights(std::span<const WeightJob> jobs) {
    std::vector<QuantizedWeight> out;
    out.reserve(jobs.size());
    for (const WeightJob& j : jobs)
      out.push_back(quantize_weight(j.weight, j.format, j.amax, j.name, j.search));
    return out;
  }

 protected:
  bool bf16_ops_ = false;
};

// Suspends bf16_ops rounding inside a scope: for a chain of ops that the source model computes in
// fp32 and casts to bf16 once at its end, which the family then rounds with Backend::round_ops
// (after the scope). Without bf16_ops it changes nothing.
class Fp32Ops {
 public:
  explicit Fp32Ops(Backend& be) : be_(be), was_(be.bf16_ops()) { be.set_bf16_ops(false); }
  ~Fp32Ops() { be_.set_bf16_ops(was_); }
  Fp32Ops(const Fp32Ops&) = delete;
  Fp32Ops& operator=(const Fp32Ops&) = delete;

 private:
  Backend& be_;
  bool was_;
};

// Restores the scratch taken inside a scope when it ends.
class ScratchScope {
 public:
  explicit ScratchScope(Backend& be) : be_(be), mark_(be.mark()) {}
  ~ScratchScope() { be_.release(mark_); }
  ScratchScope(const ScratchScope&) = delete;
  ScratchScope& operator=(const ScratchScope&) = delete;

 private:
  Backend& be_;
  uint64_t mark_;
};

}  // namespace strata::ops
