// The CUDA implementation of the backend (ops/backend.h): buffers in device memory, the kernels
// of ops/cuda/ and cuBLAS GEMMs, queued on one stream (docs/CUDA.md "The engine on the GPU").
// Host-only header.
//
// Numerics: GEMM inputs are rounded to bf16 and accumulated in fp32 (gemm_bf16, the source
// model's bf16 inference), or pedantic fp32 (no TF32) when gemm_bf16 is false, which matches the
// CPU backend to summation order; weights held in fp32 (Weight::f32: routers, gates) are always
// multiplied in fp32, so that expert choices match the CPU's. With bf16_ops every op's results are
// also rounded where ops/backend.h says, as on the CPU (the kernels take the rounding as a flag).
// Attention: per group of equal-length sequences, S = QK^T and O = PV as batched cuBLAS GEMMs
// around a causal softmax kernel, or a warp-per-query kernel when the scores do not fit.
// Observers: amaxes reduced on the device into one slot per observed input, read back once per
// layer (take_stats).
//
// Sizing: a backend made without a stream (CudaBackend::sizing()) launches nothing; it counts the
// scratch the ops take and registers the observers' slots, so that running a layer's forward on
// it gives the layer's device working set, with no device needed.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/device.h"
#include "core/gpu_memory.h"
#include "ops/backend.h"
#include "ops/cuda/attention.h"

namespace strata::ops {

struct CudaBackendOptions {
  bool gemm_bf16 = true;        // GEMM inputs in bf16 (fp32 accumulation); false: fp32
  bool profile = false;         // device time per part of the forward, logged at destruction
  bool warp_attention = false;  // attention always in the warp-per-query kernel
  // Every op rounds as transformers' bf16 model (Backend::set_bf16_ops; --calib_precision
  // bf16_ops), the sizing runs included (a bf16_ops op may take scratch).
  bool bf16_ops = false;
  // Expert parallelism (docs/SCALEOUT.md "Expert parallel on GPU ranks"): rank expert_rank of
  // expert_ranks holds the routed experts expert_owner gives it (the forward's binder binds only
  // those) and, with an exchange set (set_expert_exchange), runs them on the rows every rank
  // sends it. The sizing runs count the exchange's buffers as if each rank received as many rows
  // as it sends.
  int expert_rank = 0, expert_ranks = 1;
  // observe_sequences reduces each sequence's K/V statistics (the affine KV cache's calibration,
  // calib/max_calib.h); off: it does nothing.
  bool sequence_stats = false;
  // local_hessian (quant/scale_search.h BlockHessian): device bytes for the per-16-block input
  // second moments of one layer's tracked inputs (track_hessians); 0: none kept. Each tracked
  // observed input takes 16 x its width doubles (a routed expert's: the layer's experts' each).
  uint64_t hessian_bytes = 0;
  // nvfp4_act_headroom (calib/max_calib.h): every observed input also counts its per-16-block
  // amax histogram on the device (ops/cuda/amax.h block_histogram), read back with its amax;
  // these are the bins' thresholds (calib/max_calib.h headroom_thresholds: cuda::kHistogramBins
  // - 1 of them). Empty: no histograms.
  std::vector<float> histogram_thresholds;
};

struct AmaxStat {
  std::string name;
  float amax = 0.0f;
  int64_t rows = 0;
  std::vector<int64_t> hist;  // cuda::kHistogramBins counts with block histograms on, else empty
};

// One sequence's per-channel statistics of a KV-cache input (ops::column_stats), read back from
// the device (Backend::observe_sequences).
struct SequenceStats {
  std::string name;
  int64_t seq_id = 0, tokens = 0;
  KvLayout layout;
  std::vector<double> sum;
  std::vector<float> max, min;
};

// One observed input's local_hessian sums (BlockHessian::sums, [cols/16][16][16]) over `rows`
// rows, under each of its tracked names (Backend::track_hessians).
struct HessianStats {
  std::vector<std::string> names;
  int64_t cols = 0, rows = 0;
  std::vector<double> sums;
};

// A deferred weight's decompression (Weight::compressed) of [rows, cols] into dst, bf16 bits
// (to_bf16) or fp32 values of bf16, on `stream` (a cudaStream_t): ops/cuda/convert.h's dequant_*
// for its kind, the bits io/source_weights.h gives.
void decompress_weight(const Compressed& c, int64_t rows, int64_t cols, void* dst, bool to_bf16,
                       void* stream);
// Several deferred weights of one kind, shape and scale layout as `c` (its pointers unused) in
// one launch: weight i's stored values, scales and output at ptrs[i], ptrs[stride + i] and
// ptrs[2 * stride + i], i < count (a device array; convert.h WeightTable), each as
// decompress_weight decompresses it.
void decompress_weights(const Compressed& c, int64_t rows, int64_t cols, const void* const* ptrs,
                        int64_t stride, int64_t count, bool to_bf16, void* stream);

class CudaBackend final : public Backend {
 public:
  // A backend that runs on `stream`, with device memory from `budget`. max_slots: observed
  // inputs per layer; max_experts: routed experts per MoE layer (0: none).
  CudaBackend(gpu::DeviceBudget& budget, const gpu::Stream& stream, CudaBackendOptions options,
              int64_t max_slots, int64_t max_experts);
  // A backend that only sizes (see the header comment).
  static std::unique_ptr<CudaBackend> sizing(CudaBackendOptions options);
  ~CudaBackend() override;

  bool dry() const { return stream_ == nullptr || sizing_; }
  // Runs what follows as the sizing backend does (registering slots, launching nothing), until
  // end_sizing(); the scratch taken meanwhile is given back.
  void begin_sizing();
  void end_sizing();
  const CudaBackendOptions& options() const { return opt_; }

  // Scratch for forwards taking up to `bytes` (device), and the attention scores buffer for
  // sequences of up to `longest` tokens when one sequence's scores for `n_heads` heads take at
  // most `cap` bytes (0 from attention_bytes: the warp kernel instead).
  void reserve_scratch(uint64_t bytes);
  static uint64_t attention_bytes(int64_t n_heads, int64_t longest, uint64_t cap);
  void reserve_attention(int64_t n_heads, int64_t longest, uint64_t cap);
  // Routed experts in slices (docs/CUDA.md "Memory"): when the experts' weights are deferred
  // (Weight::compressed), moe() decompresses `experts` experts' gate/up weights at a time into
  // one slot each of a buffer reserved here, runs their GEMMs, and after the activation the same
  // for down. A slot holds one expert's gate and up (or gate_up) weights in the GEMM dtype, which
  // down reuses: expert_slot_bytes. The sizing backend's moe() records the largest slot of the
  // layers it ran (expert_slot_high).
  void reserve_expert_slice(int64_t experts, uint64_t slot_bytes);
  static uint64_t expert_slot_bytes(const Mlp& m, bool gemm_bf16);
  uint64_t expert_slot_high() const { return expert_slot_high_; }
  uint64_t high_water() const { return high_water_; }
  void reset_high_water() { high_water_ = arena_at_; }

  size_t slot_count() const { return slot_names_.size(); }
  const std::vector<std::vector<std::string>>& slot_names() const { return slot_names_; }
  // Observers: forget the slots of the last layer (their statistics must have been taken).
  void clear_slots();
  // The statistics of every forward since the last take (synchronizes the stream).
  std::vector<AmaxStat> take_stats();
  // The sequence statistics of every forward since the last take (CudaBackendOptions::
  // sequence_stats).
  std::vector<SequenceStats> take_sequence_stats();
  // From the next layer's first observation on, the inputs observed under these names also
  // accumulate their local_hessian sums on the device (CudaBackendOptions::hessian_bytes), in the
  // order the CPU forward accumulates them: a dense input's rows in token order, a routed
  // expert's rows in token order too (not the dispatch's arrival order).
  void track_hessians(std::set<std::string, std::less<>> names);
  // The sums of the tracked inputs, read back by the last take_stats (which zeroes them).
  std::vector<HessianStats> take_hessians() { return std::move(hessians_taken_); }

  // Backend.
  float* take(int64_t n) override { return take_bytes<float>(n); }
  int32_t* take_i32(int64_t n) override { return take_bytes<int32_t>(n); }
  uint64_t mark() const override { return arena_at_; }
  void release(uint64_t mark) override { arena_at_ = mark; }
  void phase(Phase p) override;
  void observe(const std::vector<std::string>& names, const float* x, int64_t rows,
               int64_t cols) override;
  // With sequence_stats on: the sequences' statistics reduced on the device kSequenceGroup
  // sequences at a time into a buffer of its own (16 bytes x kSequenceGroup x channels, from the
  // budget, made at the first call and grown for wider inputs) and read back at once
  // (synchronizes the stream; two calls a layer and chunk).
  void observe_sequences(const std::string& name, const float* x, const Tokens& t,
                         const KvLayout& layout) override;
  static constexpr int64_t kSequenceGroup = 16;
  // strata compare's serving simulation (ops/cuda/fake_quant.h, bit-identical to the CPU's): the
  // KV cache here, a linear's input in linears() (into a copy in the scratch), the routed
  // experts' in moe() (once per layer: the experts of a layer must share their input scales, as
  // ModelOpt exports them; otherwise a one-line error).
  void fake_quantize(float* x, int64_t rows, int64_t cols, const ActQuant& q,
                     std::string_view name) override;
  // MoE routing, reported to `routing` when one is set (strata compare): chosen copied to the
  // host (synchronizes the stream). Without one, nothing.
  void set_routing_observer(Observer* routing) { routing_ = routing; }
  void observe_routing(const std::string& router, const int32_t* chosen, int64_t tokens,
                       int64_t k) override;
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
  // Expert parallelism: moe() dispatches each slot's row to its expert's rank through `x`
  // (null: every expert here). Every rank must then run the same number of MoE layers' forwards
  // (an empty chunk where it has none). The exchanges run on this backend's stream.
  void set_expert_exchange(DeviceExpertExchange* x) { exchange_ = x; }
  // Weight quantization runs on a stream of its own (made by use_for_quantization, on the
  // thread that owns this backend), so that a backend of its own quantizes a layer's weights
  // beside the forward: the amax slots are the observers' (max_slots), the encoders' outputs go
  // to the scratch (reserve_scratch: the largest module's).
  void use_for_quantization(int device);
  // The pinned host memory use_for_quantization took (the run's memory bound counts it).
  uint64_t staging_bytes() const;
  // The buffer a deferred weight (StoredWeight::compressed) is decompressed into, in bf16, before
  // weight_amaxes and quantize_weight read it: `bytes` for the largest such module.
  void reserve_decompression(uint64_t bytes);
  // The buffer a local_hessian search's input statistics (WeightSearch::hessian) are copied into:
  // `bytes` for the widest searched module's (16 doubles per input feature).
  void reserve_hessian(uint64_t bytes);
  void weight_amaxes(const std::vector<std::vector<StoredWeight>>& groups, float* out) override;
  QuantizedWeight quantize_weight(const StoredWeight& w, QFormat format, float amax,
                                  std::string_view name,
                                  const WeightSearch* search = nullptr) override;
  std::vector<QuantizedWeight> quantize_weights(std::span<const WeightJob> jobs) override;

 private:
  struct Profile;
  struct MixerOp;
  struct Attention;
  explicit CudaBackend(CudaBackendOptions options);
  template <typename T>
  T* take_bytes(int64_t n);
  void mm(const void* x, const void* w, float* y, int64_t M, int64_t N, int64_t K, bool bf16);
  const void* gin(const float* a, int64_t count);
  int slot(const std::vector<std::string>& names);
  int slot_range(std::span<const Mlp> experts, bool gate_up);
  const void* const* expert_tables(std::span<const Mlp> experts, int64_t first, int64_t count,
                                   int64_t repeat, bool* aligned);
  // Deferred experts [e0, e1) decompressed into their slots of the slice buffer in one launch:
  // gate and up (or gate_up), or down; `tables` as expert_tables returned them.
  void decompress_experts(std::span<const Mlp> experts, const void* const* tables, int64_t e0,
                          int64_t e1, bool gate_up);
  // Deferred experts (every one held, of one shape): their decompression tables appended to
  // expert_tables' arrays; nothing when they are not deferred.
  void deferred_tables(std::span<const Mlp> experts, std::vector<const void*>& tables) const;
  const void* expert_slot(int64_t e) const;
  // A deferred weight for the device's weight quantization: decompressed into decompressed_.
  StoredWeight decompressed_for_quantization(const StoredWeight& w);
  // The routed experts' input quantizations (the serving simulation; none: kNone).
  struct ExpertQuant {
    ActQuant gate_up, down;
  };
  void moe_exchanged(const float* n, int64_t T, int64_t H, int64_t K, const int32_t* chosen,
                     const float* weight, std::span<const Mlp> experts, float* y,
                     const ExpertQuant& quant);
  // x[rows, cols] copied into the scratch and fake-quantized as `q` says.
  const float* quantized_copy(const float* x, int64_t rows, int64_t cols, const ActQuant& q,
                              std::string_view name);
  // Device memory for the exchanged MoE's receiving side: from the scratch when it has room, else
  // from a buffer of its own grown under the budget (the rows a rank receives vary).
  uint8_t* take_received(uint64_t bytes);
  uint32_t* slot_ptr(int s);
  const float* rope_table(const std::vector<double>& inv_freq);
  void span(int part);
  // The profile's place in a layer: the last phase() and whether it opened the mixer.
  Phase last_phase_ = Phase::kStart;
  bool in_mixer_ = false;
  void attention_gemm(const Tokens& t, const float* q, int64_t qs, const float* k, int64_t ks,
                      const float* v, int64_t vs, float* out, int64_t os, int64_t n_heads,
                      int64_t dq, int64_t dv, int64_t group, float scale, int64_t window,
                      const float* sinks, const uint32_t* keep, int64_t keep_words,
                      cuda::AttentionRounding rounding);
  int64_t esz() const { return opt_.gemm_bf16 ? 2 : 4; }

  CudaBackendOptions opt_;
  gpu::DeviceBudget* budget_ = nullptr;
  const gpu::Stream* stream_ = nullptr;  // null: sizing only
  void* blas_ = nullptr;
  gpu::DeviceBuffer scratch_, slots_dev_, rows_dev_, moe_ints_;
  // Block histograms (CudaBackendOptions::block_histograms): 512 counts per slot, and the bins'
  // thresholds (calib/max_calib.h headroom_thresholds).
  gpu::DeviceBuffer hist_dev_, thresholds_dev_;
  unsigned long long* hist_of(int slot);
  std::unique_ptr<strata::cuda::Stream> qstream_;    // weight quantization
  static constexpr uint64_t kStageChecks = 64;       // the check words' room before the codes
  static constexpr uint64_t kBatchStage = 32 << 20;  // quantize_weights' stage, at least
  gpu::PinnedBuffer qstage_;                         // the encoders' outputs back to the host
  // An NVFP4 weight's encoder queued on the quantization stream, its check words and codes copied
  // to `stage` (nvfp4_stage_bytes of room); returns weight_scale_2. take_nvfp4 checks and copies
  // them out once the stream has run.
  float queue_nvfp4(const StoredWeight& stored, float amax, std::string_view name,
                    const WeightSearch* search, uint8_t* stage);
  static uint64_t nvfp4_stage_bytes(int64_t rows, int64_t cols);
  static Nvfp4Weight take_nvfp4(const uint8_t* stage, int64_t rows, int64_t cols, float ws2,
                                float amax, std::string_view name);
  uint64_t arena_at_ = 0, high_water_ = 0;
  std::vector<std::vector<std::string>> slot_names_;
  std::vector<int64_t> slot_rows_;
  std::vector<SequenceStats> sequence_stats_;  // observe_sequences', until taken
  gpu::DeviceBuffer sequence_buf_;             // observe_sequences' device results
  std::unordered_map<std::string, int> slot_of_;
  int64_t max_slots_ = 0;
  // local_hessian (track_hessians): each slot's sums at hessian_at_[slot] doubles into hessian_
  // (-1: not tracked), the slots' sums allocated in registration order from the layer's start.
  std::set<std::string, std::less<>> hessian_names_;
  gpu::DeviceBuffer hessian_;
  std::vector<int64_t> hessian_at_, hessian_cols_;
  int64_t hessian_used_ = 0;
  std::vector<HessianStats> hessians_taken_;
  bool tracked(const std::vector<std::string>& names) const;
  double* hessian_of(int s, int64_t cols);
  bool sizing_ = false;
  uint64_t sizing_mark_ = 0, sizing_high_ = 0;
  std::vector<std::pair<std::vector<double>, gpu::DeviceBuffer>> rope_tables_;
  std::unique_ptr<Attention> att_;
  std::unique_ptr<Profile> prof_;
  struct Experts;
  std::unique_ptr<Experts> experts_;
  DeviceExpertExchange* exchange_ = nullptr;
  Observer* routing_ = nullptr;        // set_routing_observer
  std::vector<int32_t> routing_host_;  // its chosen experts, copied back
  gpu::DeviceBuffer received_;  // the exchanged MoE's receiving side, when the scratch is full
  gpu::DeviceBuffer slice_;     // deferred experts' slots (reserve_expert_slice)
  int64_t slice_experts_ = 0;
  uint64_t slot_bytes_ = 0, expert_slot_high_ = 0;
  gpu::DeviceBuffer decompressed_;    // weight quantization's (reserve_decompression)
  gpu::DeviceBuffer search_hessian_;  // its local_hessian statistics (reserve_hessian)
  gpu::PinnedBuffer ep_host_;         // its counts on the host: offsets [E + 1], group counts
};

}  // namespace strata::ops
