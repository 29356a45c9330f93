#include "ops/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "ops/cuda/amax.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/convert.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/expert_gemm.h"
#include "ops/cuda/fake_quant.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/indexer.h"
#include "ops/cuda/kda.h"
#include "ops/cuda/moe.h"
#include "ops/cuda/norm.h"
#include "ops/cuda/rope.h"
#include "ops/cuda/routing.h"
#include "quant/cuda/quant_cuda.h"
#include "quant/scale_search.h"

namespace strata::ops {

using namespace strata::gpu;

namespace {

constexpr uint64_t kAlign = 256;
uint64_t align_up(uint64_t x) {
  return (x + kAlign - 1) / kAlign * kAlign;
}

// The parts of a layer the profile times (CudaBackendOptions::profile).
enum Part {
  kNorms,
  kAttention,
  kAttentionNorm,
  kAttentionObserve,
  kAttentionRope,
  kAttentionGemm,
  kAttentionCore,
  kRouter,
  kExpertGateUp,
  kExpertDown,
  kExpertOther,
  kCombine,
  kFfn,
  kParts
};
const char* const kPartNames[kParts] = {"norms and residuals",
                                        "attention copies, casts, KV split, other",
                                        "attention norms",
                                        "attention observers (amax, KV statistics)",
                                        "attention RoPE",
                                        "attention projections (linears)",
                                        "attention scores, softmax and values",
                                        "router, expert offsets",
                                        "expert gate/up GEMMs",
                                        "expert down GEMMs",
                                        "expert gather, amax, SwiGLU",
                                        "expert combine",
                                        "dense MLP, shared experts"};

// Attention through GEMMs: S for `seqs_per_call` sequences; the batched GEMMs' pointer arrays
// (q, k, S, v, out, and the keep mask's rows: kPtrArrays of seqs_per_call x nH pointers per call)
// in a ring of kPtrSlots slots, filled in pinned memory and copied asynchronously, so that the host
// queues calls ahead of the device; a slot is refilled once the device has run the call that used
// it (ptr_done).
constexpr int kPtrSlots = 32;
constexpr int kPtrArrays = 6;

}  // namespace

// Device time of each part of the forward, from timing events recorded between the parts, summed
// over the run and logged when the backend is destroyed. The events cost a little; off by default.
// Beside each part's device time, the host's time issuing it (from the previous mark to its own):
// a part whose host time reaches its device time keeps the device waiting for the host.
struct CudaBackend::Profile {
  bool on = false;
  std::vector<std::unique_ptr<Event>> events;  // a pool, reused after each take
  std::vector<int> part;                       // events[i] closes a span of part[i] (-1: none)
  double ms[kParts] = {}, host_ms[kParts] = {};
  std::chrono::steady_clock::time_point last_mark;
  int64_t gemms = 0, forwards = 0;
  void mark(int p, const Stream& s) {
    if (!on) return;
    const auto now = std::chrono::steady_clock::now();
    if (p >= 0) host_ms[p] += std::chrono::duration<double, std::milli>(now - last_mark).count();
    last_mark = now;
    if (part.size() == events.size()) events.push_back(std::make_unique<Event>(true));
    events[part.size()]->record(s);
    part.push_back(p);
  }
  // After the stream has synchronized.
  void collect() {
    for (size_t i = 1; i < part.size(); ++i) {
      if (part[i] >= 0) ms[part[i]] += events[i]->ms_since(*events[i - 1]);
    }
    part.clear();
  }
  void log() const {
    if (!on || forwards == 0) return;
    double total = 0;
    for (double m : ms)
      total += m;
    log_info("GPU profile: ", forwards, " chunk forwards, ", gemms, " GEMM calls, ",
             str(total / 1000).substr(0, 6), " s of device time in the parts:");
    for (int p = 0; p < kParts; ++p)
      log_info("  ", kPartNames[p], ": ", str(ms[p] / 1000).substr(0, 6), " s (host ",
               str(host_ms[p] / 1000).substr(0, 6), " s)");
  }
};

// An op of a mixer timed as a part of its own (the profile; the mixer's other element-wise work
// stays kAttention).
struct CudaBackend::MixerOp {
  CudaBackend* be;
  int part;
  MixerOp(CudaBackend* b, int p) : be(b), part(p) {
    if (be->in_mixer_) be->span(kAttention);
  }
  ~MixerOp() {
    if (be->in_mixer_) be->span(part);
  }
};

struct CudaBackend::Attention {
  DeviceBuffer scores, ptrs;
  PinnedBuffer host_ptrs;
  std::vector<std::unique_ptr<Event>> done;
  int64_t next = 0;  // calls issued; slot = next % kPtrSlots
  int64_t seqs_per_call = 0, longest = 0, n_heads = 0;
};

// The routed experts' weight and bias pointers as device arrays for expert_gemm and
// moe_add_bias (5 arrays of E: gate or gate_up, up, down, gate_up_bias, down_bias), and with
// deferred experts after them the decompression tables of decompress_experts (deferred_tables),
// copied through pinned memory when they differ from the last chunk's, i.e. once per layer.
struct CudaBackend::Experts {
  DeviceBuffer dev;
  PinnedBuffer host;
  std::vector<const void*> next, last;
  bool aligned = false;
  Event copied;  // the last copy out of `host`
};

CudaBackend::CudaBackend(CudaBackendOptions options)
    : opt_(options), att_(std::make_unique<Attention>()), prof_(std::make_unique<Profile>()) {
  bf16_ops_ = options.bf16_ops;
}

CudaBackend::CudaBackend(DeviceBudget& budget, const Stream& stream, CudaBackendOptions options,
                         int64_t max_slots, int64_t max_experts)
    : CudaBackend(options) {
  budget_ = &budget;
  stream_ = &stream;
  max_slots_ = max_slots;
  slots_dev_ = DeviceBuffer(budget, static_cast<uint64_t>(max_slots) * 4, "amax slots");
  rows_dev_ = DeviceBuffer(budget, static_cast<uint64_t>(max_slots) * 8, "observed rows");
  stream.zero(rows_dev_.data(), rows_dev_.bytes());
  if (!options.histogram_thresholds.empty()) {
    const std::vector<float>& t = opt_.histogram_thresholds;
    STRATA_ASSERT(t.size() == cuda::kHistogramBins - 1, t.size(), " histogram thresholds");
    hist_dev_ = DeviceBuffer(budget, static_cast<uint64_t>(max_slots) * cuda::kHistogramBins * 8,
                             "block amax histograms");
    stream.zero(hist_dev_.data(), hist_dev_.bytes());
    thresholds_dev_ = DeviceBuffer(budget, t.size() * 4, "histogram bin thresholds");
    stream.copy_to_device(thresholds_dev_.data(), t.data(), t.size() * 4);
  }
  if (max_experts > 0) {
    // counts [E], offsets [E + 1], cursor [E], tile_first [E + 1]; with expert parallelism also
    // the receiving side's groups (one per source rank and expert held, at most E + ranks):
    // counts [G], offsets [G + 1], tile_first [G + 1].
    const int64_t groups = options.expert_ranks > 1 ? max_experts + options.expert_ranks : 0;
    moe_ints_ = DeviceBuffer(
        budget, static_cast<uint64_t>(4 * max_experts + 2 + 3 * groups + 2) * 4, "expert counts");
    if (groups > 0) ep_host_.reserve(static_cast<uint64_t>(max_experts + 1 + groups) * 4);
    // The five arrays, and the deferred experts' decompression tables (at most 9 x E).
    const uint64_t tables =
        static_cast<uint64_t>(5 * std::max(max_experts, groups) + 9 * max_experts) * sizeof(void*);
    experts_ = std::make_unique<Experts>();  // (its event needs a device: not in sizing)
    experts_->dev = DeviceBuffer(budget, tables, "expert pointers");
    experts_->host.reserve(tables);
  }
  if (options.hessian_bytes > 0)
    hessian_ = DeviceBuffer(budget, options.hessian_bytes, "local_hessian input statistics");
  blas_ = cuda::gemm_handle_create(stream.handle());
  stream.synchronize();
  prof_->on = opt_.profile;
}

std::unique_ptr<CudaBackend> CudaBackend::sizing(CudaBackendOptions options) {
  return std::unique_ptr<CudaBackend>(new CudaBackend(options));
}

CudaBackend::~CudaBackend() {
  prof_->log();
  if (blas_) cuda::gemm_handle_destroy(blas_);
}

template <typename T>
T* CudaBackend::take_bytes(int64_t n) {
  const uint64_t at = arena_at_;
  arena_at_ += align_up(static_cast<uint64_t>(n) * sizeof(T));
  high_water_ = std::max(high_water_, arena_at_);
  if (dry()) return reinterpret_cast<T*>(kAlign + at);  // never dereferenced
  STRATA_ASSERT(arena_at_ <= scratch_.bytes(), "GPU scratch overflow");
  return reinterpret_cast<T*>(scratch_.as<uint8_t>() + at);
}

void CudaBackend::reserve_scratch(uint64_t bytes) {
  if (bytes <= scratch_.bytes()) return;
  scratch_ = DeviceBuffer();
  scratch_ = DeviceBuffer(*budget_, bytes, "the layer's working set");
}

uint64_t CudaBackend::attention_bytes(int64_t n_heads, int64_t longest, uint64_t cap) {
  const uint64_t one = static_cast<uint64_t>(n_heads * longest * longest) * 4;
  if (one == 0 || one > cap) return 0;
  // Whole sequences, about 64 MiB of scores per call (at least one sequence).
  const uint64_t seqs = std::max<uint64_t>(1, (64ull << 20) / one);
  return seqs * one +
         kPtrSlots * seqs * static_cast<uint64_t>(n_heads) * kPtrArrays * sizeof(void*);
}

void decompress_weight(const Compressed& c, int64_t rows, int64_t cols, void* dst, bool to_bf16,
                       void* stream) {
  const auto* values = static_cast<const uint8_t*>(c.values);
  switch (c.kind) {
    case Compressed::Kind::kInt4Pack:
      cuda::dequant_int4_pack(values, rows, cols, c.group, c.scales, c.scale_dtype, dst, to_bf16,
                              stream);
      return;
    case Compressed::Kind::kMxfp4:
      cuda::dequant_mxfp4(values, static_cast<const uint8_t*>(c.scales), rows, c.stored_cols, dst,
                          to_bf16, stream);
      return;
    case Compressed::Kind::kFp8Block:
      cuda::dequant_fp8_block(values, rows, cols, c.group, c.scales, c.scale_dtype, dst, to_bf16,
                              stream);
      return;
    case Compressed::Kind::kNvfp4:
      cuda::dequant_nvfp4_export(values, static_cast<const uint8_t*>(c.scales),
                                 static_cast<const float*>(c.global_scale), rows, cols, c.group,
                                 dst, to_bf16, stream);
      return;
    case Compressed::Kind::kFp8:
      cuda::dequant_fp8_export(values, static_cast<const float*>(c.scales), rows, cols, c.group,
                               dst, to_bf16, stream);
      return;
    case Compressed::Kind::kMxfp8:
      cuda::dequant_mxfp8_export(values, static_cast<const uint8_t*>(c.scales), rows, cols, dst,
                                 to_bf16, stream);
      return;
    case Compressed::Kind::kNone:
      break;
  }
  STRATA_ASSERT(false, "decompress_weight: not a compressed weight");
}

void decompress_weights(const Compressed& c, int64_t rows, int64_t cols, const void* const* ptrs,
                        int64_t stride, int64_t count, bool to_bf16, void* stream) {
  const cuda::WeightTable t{ptrs, stride, count};
  switch (c.kind) {
    case Compressed::Kind::kInt4Pack:
      cuda::dequant_int4_pack_many(t, rows, cols, c.group, c.scale_dtype, to_bf16, stream);
      return;
    case Compressed::Kind::kMxfp4:
      cuda::dequant_mxfp4_many(t, rows, c.stored_cols, to_bf16, stream);
      return;
    case Compressed::Kind::kFp8Block:
      cuda::dequant_fp8_block_many(t, rows, cols, c.group, c.scale_dtype, to_bf16, stream);
      return;
    case Compressed::Kind::kNvfp4:  // an export's kinds: never deferred (model/cuda/gpu_forward)
    case Compressed::Kind::kFp8:
    case Compressed::Kind::kMxfp8:
    case Compressed::Kind::kNone:
      break;
  }
  STRATA_ASSERT(false, "decompress_weights: not a compressed source's weight");
}

uint64_t CudaBackend::expert_slot_bytes(const Mlp& m, bool gemm_bf16) {
  const uint64_t one = align_up(static_cast<uint64_t>(m.inter * m.hidden) * (gemm_bf16 ? 2 : 4));
  // gate and up, or gate_up [2I, H]; down [H, I] reuses the slot.
  return m.interleaved
             ? align_up(2 * static_cast<uint64_t>(m.inter * m.hidden) * (gemm_bf16 ? 2 : 4))
             : 2 * one;
}

void CudaBackend::reserve_expert_slice(int64_t experts, uint64_t slot_bytes) {
  slot_bytes = align_up(slot_bytes);
  if (experts == slice_experts_ && slot_bytes == slot_bytes_) return;
  if (stream_) stream_->synchronize();  // the last layer's slices may still be read
  slice_ = DeviceBuffer();
  slice_experts_ = experts;
  slot_bytes_ = slot_bytes;
  if (experts > 0)
    slice_ = DeviceBuffer(*budget_, static_cast<uint64_t>(experts) * slot_bytes,
                          "a slice of routed experts' decompressed weights");
}

void CudaBackend::reserve_attention(int64_t n_heads, int64_t longest, uint64_t cap) {
  Attention& a = *att_;
  const uint64_t bytes = attention_bytes(n_heads, longest, cap);
  if (bytes == 0 || longest <= a.longest) return;
  const uint64_t one = static_cast<uint64_t>(n_heads * longest * longest) * 4;
  a.seqs_per_call = std::max<int64_t>(1, static_cast<int64_t>((64ull << 20) / one));
  a.n_heads = n_heads;
  a.scores = DeviceBuffer();
  a.ptrs = DeviceBuffer();
  a.scores =
      DeviceBuffer(*budget_, static_cast<uint64_t>(a.seqs_per_call) * one, "attention scores");
  const uint64_t ptr_bytes =
      kPtrSlots * static_cast<uint64_t>(a.seqs_per_call * n_heads) * kPtrArrays * sizeof(void*);
  a.ptrs = DeviceBuffer(*budget_, ptr_bytes, "attention pointers");
  a.host_ptrs.reserve(ptr_bytes);
  while (a.done.size() < static_cast<size_t>(kPtrSlots))
    a.done.push_back(std::make_unique<Event>());
  a.next = 0;
  a.longest = longest;
}

void CudaBackend::begin_sizing() {
  sizing_ = true;
  sizing_mark_ = arena_at_;
  sizing_high_ = high_water_;
}

void CudaBackend::end_sizing() {
  sizing_ = false;
  arena_at_ = sizing_mark_;
  high_water_ = sizing_high_;
}

// ---- observers ----------------------------------------------------------------------------------

void CudaBackend::clear_slots() {
  slot_names_.clear();
  slot_rows_.clear();
  slot_of_.clear();
  hessian_at_.clear();
  hessian_cols_.clear();
  hessian_used_ = 0;
  if (dry()) return;
  stream_->zero(slots_dev_.data(), slots_dev_.bytes());
  stream_->zero(rows_dev_.data(), rows_dev_.bytes());
  if (hist_dev_.bytes() > 0) stream_->zero(hist_dev_.data(), hist_dev_.bytes());
}

int CudaBackend::slot(const std::vector<std::string>& names) {
  auto it = slot_of_.find(names[0]);
  if (it != slot_of_.end()) return it->second;
  const int s = static_cast<int>(slot_names_.size());
  slot_names_.push_back(names);
  slot_rows_.push_back(0);
  hessian_at_.push_back(-1);
  hessian_cols_.push_back(0);
  slot_of_.emplace(names[0], s);
  STRATA_ASSERT(dry() || static_cast<int64_t>(slot_names_.size()) <= max_slots_, "amax slots");
  return s;
}

// The first of experts.size() consecutive slots, one per expert's gate/up (or down) input.
int CudaBackend::slot_range(std::span<const Mlp> experts, bool gate_up) {
  auto names = [&](size_t e) -> const std::vector<std::string>& {
    return gate_up ? experts[e].gate_up_names : experts[e].down_names;
  };
  auto it = slot_of_.find(names(0)[0]);
  if (it != slot_of_.end()) return it->second;
  const int first = static_cast<int>(slot_names_.size());
  for (size_t e = 0; e < experts.size(); ++e)
    slot(names(e));
  return first;
}

uint32_t* CudaBackend::slot_ptr(int s) {
  return slots_dev_.as<uint32_t>() + s;
}

unsigned long long* CudaBackend::hist_of(int s) {
  return hist_dev_.as<unsigned long long>() + static_cast<int64_t>(s) * cuda::kHistogramBins;
}

void CudaBackend::track_hessians(std::set<std::string, std::less<>> names) {
  STRATA_ASSERT(names.empty() || opt_.hessian_bytes > 0,
                "local_hessian statistics without CudaBackendOptions::hessian_bytes");
  hessian_names_ = std::move(names);
}

bool CudaBackend::tracked(const std::vector<std::string>& names) const {
  if (hessian_names_.empty()) return false;
  for (const std::string& n : names) {
    if (hessian_names_.count(n)) return true;
  }
  return false;
}

// Slot s's sums, zeroed when first taken (consecutive slots taken in turn lie back to back).
double* CudaBackend::hessian_of(int s, int64_t cols) {
  const auto i = static_cast<size_t>(s);
  if (hessian_at_[i] < 0) {
    const int64_t n = 16 * cols;
    STRATA_ASSERT(static_cast<uint64_t>(hessian_used_ + n) * 8 <= hessian_.bytes(),
                  "local_hessian statistics: ", hessian_.bytes(), " bytes reserved, ",
                  (hessian_used_ + n) * 8, " needed");
    hessian_at_[i] = hessian_used_;
    hessian_cols_[i] = cols;
    hessian_used_ += n;
    stream_->zero(hessian_.as<double>() + hessian_at_[i], static_cast<uint64_t>(n) * 8);
  }
  return hessian_.as<double>() + hessian_at_[i];
}

void CudaBackend::observe(const std::vector<std::string>& names, const float* x, int64_t rows,
                          int64_t cols) {
  const int s = slot(names);
  if (dry()) return;
  const MixerOp op(this, kAttentionObserve);
  cuda::amax(x, rows * cols, slot_ptr(s), stream_->handle());
  slot_rows_[s] += rows;
  if (hist_dev_.bytes() > 0) {
    cuda::block_histogram(x, rows, cols, nullptr, 1, thresholds_dev_.as<float>(), hist_of(s),
                          stream_->handle());
  }
  if (tracked(names)) cuda::block_hessian(x, rows, cols, hessian_of(s, cols), stream_->handle());
}

void CudaBackend::observe_sequences(const std::string& name, const float* x, const Tokens& t,
                                    const KvLayout& layout) {
  if (!opt_.sequence_stats) return;
  const MixerOp op(this, kAttentionObserve);
  const int64_t cols = layout.channels(), n = t.n_seqs();
  if (dry() || n == 0) return;
  // [group, cols] each of sum (double), max and min, in a buffer of its own (not the scratch,
  // whose per-token sizing does not cover a fixed group): 16 bytes x kSequenceGroup x cols.
  const uint64_t need = static_cast<uint64_t>(kSequenceGroup * cols) * 16;
  if (sequence_buf_.bytes() < need) {
    sequence_buf_ = DeviceBuffer();
    sequence_buf_ = DeviceBuffer(*budget_, need, "KV sequence statistics");
  }
  double* sum = sequence_buf_.as<double>();
  float* mx = reinterpret_cast<float*>(sum + kSequenceGroup * cols);
  float* mn = mx + kSequenceGroup * cols;
  {
    for (int64_t g0 = 0; g0 < n; g0 += kSequenceGroup) {
      const int64_t g = std::min(kSequenceGroup, n - g0);
      cuda::column_stats(x, cols, t.seq_bounds_dev + g0, g, sum, mx, mn, stream_->handle());
      const size_t first = sequence_stats_.size();
      for (int64_t s = g0; s < g0 + g; ++s) {
        SequenceStats q;
        q.name = name;
        q.seq_id = t.seq_ids.empty() ? s : t.seq_ids[static_cast<size_t>(s)];
        q.layout = layout;
        q.tokens = t.seq_bounds[static_cast<size_t>(s) + 1] - t.seq_bounds[static_cast<size_t>(s)];
        q.sum.resize(static_cast<size_t>(cols));
        q.max.resize(static_cast<size_t>(cols));
        q.min.resize(static_cast<size_t>(cols));
        const int64_t at = (s - g0) * cols;
        stream_->copy_to_host(q.sum.data(), sum + at, static_cast<uint64_t>(cols) * 8);
        stream_->copy_to_host(q.max.data(), mx + at, static_cast<uint64_t>(cols) * 4);
        stream_->copy_to_host(q.min.data(), mn + at, static_cast<uint64_t>(cols) * 4);
        sequence_stats_.push_back(std::move(q));
      }
      stream_->synchronize();  // the scratch is reused by the next group
      STRATA_ASSERT(sequence_stats_.size() == first + static_cast<size_t>(g));
    }
  }
}

std::vector<SequenceStats> CudaBackend::take_sequence_stats() {
  return std::exchange(sequence_stats_, {});
}

std::vector<AmaxStat> CudaBackend::take_stats() {
  std::vector<uint32_t> bits(slot_names_.size());
  std::vector<uint64_t> rows(slot_names_.size());  // the routed experts' rows, counted there
  stream_->copy_to_host(bits.data(), slots_dev_.data(), bits.size() * 4);
  stream_->copy_to_host(rows.data(), rows_dev_.data(), rows.size() * 8);
  std::vector<int64_t> hist(hist_dev_.bytes() > 0 ? slot_names_.size() * cuda::kHistogramBins : 0);
  if (!hist.empty()) stream_->copy_to_host(hist.data(), hist_dev_.data(), hist.size() * 8);
  stream_->synchronize();
  prof_->collect();
  cuda_check_last("GPU forward");
  std::vector<double> sums(static_cast<size_t>(hessian_used_));
  if (!sums.empty()) {
    stream_->copy_to_host(sums.data(), hessian_.data(), sums.size() * 8);
    stream_->synchronize();
  }
  std::vector<AmaxStat> out;
  hessians_taken_.clear();
  for (size_t i = 0; i < bits.size(); ++i) {
    float a;
    std::memcpy(&a, &bits[i], 4);
    const int64_t n_rows = slot_rows_[i] + static_cast<int64_t>(rows[i]);
    for (const std::string& n : slot_names_[i]) {
      out.push_back({n, a, n_rows, {}});
      if (!hist.empty()) {
        const auto first = hist.begin() + static_cast<int64_t>(i) * cuda::kHistogramBins;
        out.back().hist.assign(first, first + cuda::kHistogramBins);
      }
    }
    slot_rows_[i] = 0;
    if (hessian_at_[i] < 0 || n_rows == 0) continue;  // no token reached it: no statistics
    HessianStats h;
    for (const std::string& n : slot_names_[i]) {
      if (hessian_names_.count(n)) h.names.push_back(n);
    }
    h.cols = hessian_cols_[i];
    h.rows = n_rows;
    const auto* first = sums.data() + hessian_at_[i];
    h.sums.assign(first, first + 16 * h.cols);
    hessians_taken_.push_back(std::move(h));
  }
  stream_->zero(slots_dev_.data(), slots_dev_.bytes());
  stream_->zero(rows_dev_.data(), rows_dev_.bytes());
  if (!hist.empty()) stream_->zero(hist_dev_.data(), hist.size() * 8);
  if (hessian_used_ > 0) stream_->zero(hessian_.data(), static_cast<uint64_t>(hessian_used_) * 8);
  return out;
}

// ---- profile ------------------------------------------------------------------------------------

void CudaBackend::span(int part) {
  if (!dry()) prof_->mark(part, *stream_);
}

void CudaBackend::phase(Phase p) {
  // The mixer runs between a layer's first norm and Phase::kMixer (model/blocks.h Residual).
  in_mixer_ = p == Phase::kNorms && last_phase_ == Phase::kStart;
  last_phase_ = p;
  switch (p) {
    case Phase::kStart:
      if (!dry()) ++prof_->forwards;
      span(-1);
      return;
    case Phase::kNorms:
      span(kNorms);
      return;
    case Phase::kMixer:
      span(kAttention);
      return;
    case Phase::kFfn:
      span(kFfn);
      return;
  }
}

// ---- GEMMs --------------------------------------------------------------------------------------

void CudaBackend::mm(const void* x, const void* w, float* y, int64_t M, int64_t N, int64_t K,
                     bool bf16) {
  ++prof_->gemms;
  cuda::gemm(blas_, x, w, y, M, N, K, bf16);
}

// The GEMM input for a[count] fp32: a itself (fp32 GEMMs) or its bf16 copy.
const void* CudaBackend::gin(const float* a, int64_t count) {
  if (!opt_.gemm_bf16) return a;
  uint16_t* h = take_bytes<uint16_t>(count);
  if (!dry()) cuda::cast_bf16(a, h, count, stream_->handle());
  return h;
}

namespace {

// The one input quantization of every routed expert's gate and up (gate_up) projections, or of
// their down projections: the export shares an MoE layer's input scales among its experts
// (docs/COMPARE.md), so the GPU quantizes a layer's rows once, before they are grouped by expert.
// Experts that differ are refused (the CPU simulates each expert's own).
ActQuant experts_input_quant(std::span<const Mlp> experts, bool gate_up) {
  std::optional<ActQuant> q;
  for (const Mlp& m : experts) {
    if (!m.held()) continue;
    const Weight* ws[2] = {gate_up ? (m.interleaved ? &m.gate_up : &m.gate) : &m.down,
                           gate_up && !m.interleaved ? &m.up : nullptr};
    for (const Weight* w : ws) {
      if (!w) continue;
      if (!q) q = w->input_quant;
      STRATA_CHECK(*q == w->input_quant, "the routed experts of ", m.gate_up_names[0],
                   "'s layer have different ", gate_up ? "gate/up" : "down",
                   " input scales; the GPU simulates one per layer, as ModelOpt exports them "
                   "(run strata compare --device cpu)");
    }
  }
  return q.value_or(ActQuant{});
}

}  // namespace

void CudaBackend::fake_quantize(float* x, int64_t rows, int64_t cols, const ActQuant& q,
                                std::string_view name) {
  // The CPU reference's own checks (the block divides the rows, a positive finite scale), made
  // by running it on no rows.
  strata::fake_quantize(q, nullptr, 0, cols, name);
  if (dry()) return;
  void* s = stream_->handle();
  const int64_t n = rows * cols;
  switch (q.kind) {
    case ActQuant::Kind::kNone:
      return;
    case ActQuant::Kind::kNvfp4:
      cuda::fake_quantize_nvfp4(x, n, q.scale, s);
      return;
    case ActQuant::Kind::kFp8:
      cuda::fake_quantize_fp8(x, n, q.scale, s);
      return;
    case ActQuant::Kind::kMxfp8:
      cuda::fake_quantize_mxfp8(x, n, s);
      return;
  }
}

void CudaBackend::observe_routing(const std::string& router, const int32_t* chosen, int64_t tokens,
                                  int64_t k) {
  if (!routing_ || dry()) return;
  routing_host_.resize(static_cast<size_t>(tokens * k));
  stream_->copy_to_host(routing_host_.data(), chosen, routing_host_.size() * 4);
  stream_->synchronize();
  routing_->observe_routing(router, routing_host_.data(), tokens, k);
}

const float* CudaBackend::quantized_copy(const float* x, int64_t rows, int64_t cols,
                                         const ActQuant& q, std::string_view name) {
  float* c = take(rows * cols);
  if (!dry()) stream_->copy_device(c, x, static_cast<uint64_t>(rows * cols) * 4);
  fake_quantize(c, rows, cols, q, name);
  return c;
}

void CudaBackend::linears(const float* x, int64_t m, std::initializer_list<Out> outs) {
  // The profile: a mixer's linears apart from its element-wise work.
  if (in_mixer_) span(kAttention);
  const uint64_t at = mark();
  const void* xin = nullptr;  // the GEMM input made of `from`
  const float* from = nullptr;
  const float* quantized = nullptr;  // x as `held` says (the serving simulation)
  ActQuant held;
  for (const Out& o : outs) {
    const Weight& w = *o.w;
    // Only routed experts are deferred (moe() decompresses them); linears and mlp() (dense MLPs,
    // shared experts) get their weights decompressed at set_layer.
    STRATA_ASSERT(!w.deferred(), "a linear's weight with deferred decompression");
    const float* in = x;
    if (w.input_quant.on()) {
      if (!quantized || !(held == w.input_quant)) {
        quantized = quantized_copy(x, m, w.cols(), w.input_quant, "a linear's input");
        held = w.input_quant;
      }
      in = quantized;
    }
    if (w.f32) {  // routers and gates: fp32 GEMMs on the fp32 input
      if (!dry()) mm(in, w.data, o.y, m, w.rows(), w.cols(), false);
    } else {
      if (!xin || from != in) {
        xin = gin(in, m * w.cols());
        from = in;
      }
      if (!dry()) mm(xin, w.data, o.y, m, w.rows(), w.cols(), opt_.gemm_bf16);
    }
    if (o.bias && !dry())
      cuda::add_bias(o.y, m, w.rows(), static_cast<const float*>(o.bias->data), stream_->handle());
    if (!w.f32) round_ops(o.y, m * w.rows());
  }
  release(at);
  if (in_mixer_) span(kAttentionGemm);
}

// ---- element-wise -------------------------------------------------------------------------------

void CudaBackend::rms_norm(const float* x, int64_t rows, int64_t dim, const Weight& w, float eps,
                           float* y) {
  if (dry()) return;
  const MixerOp op(this, kAttentionNorm);
  const cuda::NormRounding rounding = !bf16_ops_ ? cuda::NormRounding::kNone
                                      : w.offset != 0.0f || w.norm_fp32
                                          ? cuda::NormRounding::kOnce
                                          : cuda::NormRounding::kNormalizedFirst;
  cuda::rms_norm(x, rows, dim, static_cast<const float*>(w.data), eps, y, stream_->handle(),
                 w.offset, rounding);
}

void CudaBackend::layer_norm(const float* x, int64_t rows, int64_t dim, const Weight& w,
                             const Weight& b, float eps, float* y) {
  if (dry()) return;
  cuda::layer_norm(x, rows, dim, static_cast<const float*>(w.data),
                   static_cast<const float*>(b.data), eps, y, stream_->handle());
  round_ops(y, rows * dim);
}

void CudaBackend::add(float* y, const float* x, int64_t n) {
  if (!dry()) cuda::add(y, x, n, stream_->handle());
  round_ops(y, n);
}

void CudaBackend::round_bf16(float* x, int64_t n) {
  if (!dry()) cuda::round_bf16(x, n, stream_->handle());
}

void CudaBackend::swiglu(const float* gate, const float* up, int64_t n, float* h) {
  if (!dry()) cuda::swiglu(gate, up, n, h, stream_->handle(), bf16_ops_);
}

void CudaBackend::add_sigmoid_gated(float* y, const float* s, const float* g, int64_t rows,
                                    int64_t cols) {
  if (!dry()) cuda::add_sigmoid_gated(y, s, g, rows, cols, stream_->handle(), bf16_ops_);
}

void CudaBackend::mul_sigmoid(float* x, const float* g, int64_t n) {
  if (!dry()) cuda::mul_sigmoid(x, g, n, stream_->handle(), bf16_ops_);
}

void CudaBackend::sigmoid(float* x, int64_t n) {
  if (!dry()) cuda::sigmoid_inplace(x, n, stream_->handle());
  round_ops(x, n);
}

void CudaBackend::copy_cols(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                            int64_t rows, int64_t cols) {
  if (!dry()) cuda::copy_cols(src, src_stride, dst, dst_stride, rows, cols, stream_->handle());
}

void CudaBackend::mlp(const Mlp& w, const float* x, int64_t rows, float* y) {
  const uint64_t at = mark();
  observe(w.gate_up_names, x, rows, w.hidden);
  if (w.interleaved) {  // gpt-oss
    float* gu = take(rows * 2 * w.inter);
    float* h = take(rows * w.inter);
    // Under bf16_ops GptOssExperts' order: the GEMM rounded, then its bias added and rounded.
    auto biased = [&](const float* in, const Weight& wt, const Weight& b, float* out) {
      if (!bf16_ops_ || !b.defined()) {
        linear(in, rows, wt, out, b.defined() ? &b : nullptr);
        return;
      }
      linear(in, rows, wt, out);
      if (!dry())
        cuda::add_bias(out, rows, wt.rows(), static_cast<const float*>(b.data), stream_->handle());
      round_ops(out, rows * wt.rows());
    };
    biased(x, w.gate_up, w.gate_up_bias, gu);
    if (!dry())
      cuda::swiglu_clamped(gu, rows * w.inter, w.alpha, w.limit, h, stream_->handle(), bf16_ops_);
    observe(w.down_names, h, rows, w.inter);
    biased(h, w.down, w.down_bias, y);
    release(at);
    return;
  }
  float* g = take(rows * w.inter);
  float* u = take(rows * w.inter);
  linears(x, rows, {{&w.gate, g}, {&w.up, u}});
  swiglu(g, u, rows * w.inter, g);
  observe(w.down_names, g, rows, w.inter);
  linear(g, rows, w.down, y);
  release(at);
}

// ---- attention ----------------------------------------------------------------------------------

const float* CudaBackend::rope_table(const std::vector<double>& inv_freq) {
  for (const auto& [f, buf] : rope_tables_) {
    if (f == inv_freq) return buf.as<float>();
  }
  std::vector<float> f32(inv_freq.begin(), inv_freq.end());
  if (f32.empty()) f32.push_back(0.0f);
  DeviceBuffer buf(*budget_, f32.size() * 4, "RoPE frequencies");
  stream_->copy_to_device(buf.data(), f32.data(), f32.size() * 4);
  stream_->synchronize();  // f32 is a local
  rope_tables_.emplace_back(inv_freq, std::move(buf));
  return rope_tables_.back().second.as<float>();
}

void CudaBackend::rope(float* x, const Tokens& t, int64_t n_heads, int64_t stride, int64_t offset,
                       int64_t rot_dim, const std::vector<double>& inv_freq,
                       double attention_factor, bool interleaved) {
  if (dry()) return;
  const MixerOp op(this, kAttentionRope);
  cuda::rope(x, t.tokens, n_heads, stride, offset, rot_dim, t.positions, rope_table(inv_freq),
             attention_factor, interleaved, stream_->handle(), bf16_ops_);
}

void CudaBackend::attention(const Tokens& t, const float* q, int64_t qs, const float* k, int64_t ks,
                            const float* v, int64_t vs, int64_t n_heads, int64_t n_kv, int64_t dq,
                            int64_t dv, float scale, float* out, const AttentionVariant& variant) {
  if (dry()) {
    STRATA_CHECK(dv <= 256, "value head dim ", dv, " exceeds the GPU attention's 256");
    return;
  }
  span(kAttention);
  const float* sinks = variant.sinks ? static_cast<const float*>(variant.sinks->data) : nullptr;
  const auto* keep = reinterpret_cast<const uint32_t*>(variant.keep);
  const cuda::AttentionRounding rounding = !bf16_ops_      ? cuda::AttentionRounding::kNone
                                           : variant.eager ? cuda::AttentionRounding::kEager
                                                           : cuda::AttentionRounding::kFlash;
  if (att_->seqs_per_call > 0) {
    STRATA_ASSERT(n_heads == att_->n_heads, "attention reserved for ", att_->n_heads, " heads");
    attention_gemm(t, q, qs, k, ks, v, vs, out, n_heads * dv, n_heads, dq, dv, n_heads / n_kv,
                   scale, variant.window, sinks, keep, variant.keep_words, rounding);
    round_ops(out, t.tokens * n_heads * dv);  // P·V's output
  } else {
    cuda::attention(q, qs, k, ks, v, vs, t.tokens, n_heads, n_kv, dq, dv, scale, t.seq_start, out,
                    stream_->handle(), variant.window, sinks, keep, variant.keep_words, rounding);
  }
  span(kAttentionCore);
}

// Sequences of equal length, up to seqs_per_call at a time: one batched GEMM for the scores of
// every (sequence, head), the causal softmax, one batched GEMM for the outputs.
void CudaBackend::attention_gemm(const Tokens& t, const float* q, int64_t qs, const float* k,
                                 int64_t ks, const float* v, int64_t vs, float* out, int64_t os,
                                 int64_t nH, int64_t dq, int64_t dv, int64_t group, float scale,
                                 int64_t window, const float* sinks, const uint32_t* keep,
                                 int64_t keep_words, cuda::AttentionRounding rounding) {
  Attention& a = *att_;
  void* s = stream_->handle();
  const int64_t n_seqs = t.n_seqs();
  std::vector<bool> done(static_cast<size_t>(n_seqs), false);
  const int64_t cap = a.seqs_per_call * nH;
  for (int64_t first = 0; first < n_seqs; ++first) {
    if (done[first]) continue;
    const int64_t L = t.seq_bounds[first + 1] - t.seq_bounds[first];
    std::vector<int64_t> members;
    for (int64_t i = first; i < n_seqs && static_cast<int64_t>(members.size()) < a.seqs_per_call;
         ++i) {
      if (done[i] || t.seq_bounds[i + 1] - t.seq_bounds[i] != L) continue;
      members.push_back(i);
      done[i] = true;
    }
    if (L == 0) continue;
    STRATA_ASSERT(L <= a.longest, "sequence of ", L, " tokens, attention sized for ", a.longest);
    const int64_t batch = static_cast<int64_t>(members.size()) * nH;
    float* S = a.scores.as<float>();
    const int64_t slot = a.next++ % kPtrSlots;
    if (a.next > kPtrSlots) a.done[slot]->synchronize();  // its last call has run
    const void** host =
        reinterpret_cast<const void**>(a.host_ptrs.data()) + slot * kPtrArrays * cap;
    const float* const* dev = a.ptrs.as<const float*>() + slot * kPtrArrays * cap;
    int64_t idx = 0;
    for (int64_t m : members) {
      const int64_t b = t.seq_bounds[m];
      for (int64_t h = 0; h < nH; ++h, ++idx) {
        const int64_t g = h / group;
        host[0 * cap + idx] = q + b * qs + h * dq;
        host[1 * cap + idx] = k + b * ks + g * dq;
        host[2 * cap + idx] = S + idx * L * L;
        host[3 * cap + idx] = v + b * vs + g * dv;
        host[4 * cap + idx] = out + b * os + h * dv;
        host[5 * cap + idx] = keep ? keep + b * keep_words : nullptr;
      }
    }
    stream_->copy_to_device(const_cast<const float**>(dev), host,
                            static_cast<uint64_t>(kPtrArrays * cap) * sizeof(void*));
    auto arr = [&](int i) { return dev + i * cap; };
    cuda::gemm_batched_qk(blas_, arr(0), qs, arr(1), ks, const_cast<float* const*>(arr(2)), L, dq,
                          batch, opt_.gemm_bf16);
    cuda::causal_softmax(S, batch, L, scale, s, window, sinks, nH,
                         keep ? reinterpret_cast<const uint32_t* const*>(arr(5)) : nullptr,
                         keep_words, rounding);
    cuda::gemm_batched_pv(blas_, arr(2), arr(3), vs, const_cast<float* const*>(arr(4)), os, L, dv,
                          batch, opt_.gemm_bf16);
    a.done[slot]->record(*stream_);
  }
}

void CudaBackend::index_topk(const Tokens& t, const float* q, const float* k, const float* w,
                             int64_t n_heads, int64_t d, float scale, float w_scale, int64_t top_k,
                             int32_t* keep, int64_t words) {
  const uint64_t at = mark();
  if (bf16_ops_) {  // weights_proj is a bf16 linear in the source: its output rounded, in a copy
    float* w16 = take(t.tokens * n_heads);
    copy_cols(w, n_heads, w16, n_heads, t.tokens, n_heads);
    round_bf16(w16, t.tokens * n_heads);
    w = w16;
  }
  if (dry()) {
    release(at);
    return;
  }
  span(kAttention);  // the indexer's projections and RoPE before, its selection in the core
  cuda::index_topk(q, k, w, t.tokens, n_heads, d, scale, w_scale, top_k, t.seq_start,
                   reinterpret_cast<uint32_t*>(keep), words, stream_->handle());
  span(kAttentionCore);
  release(at);
}

void CudaBackend::mla_kv(const float* kv, const float* kr, int64_t T, int64_t n_heads, int64_t dn,
                         int64_t dr, int64_t dv, float* k, float* v) {
  if (!dry()) cuda::mla_kv(kv, kr, T, n_heads, dn, dr, dv, k, v, stream_->handle());
}

// ---- linear attention ---------------------------------------------------------------------------

void CudaBackend::conv_silu(const Tokens& t, const float* x, int64_t C, const Weight& w, int64_t K,
                            float* y) {
  if (dry()) return;
  cuda::kda_conv_silu(x, t.tokens, C, static_cast<const float*>(w.data), K, t.seq_start, y,
                      stream_->handle(), bf16_ops_);
}

void CudaBackend::l2_norm_scale(float* x, int64_t rows, int64_t dim, float eps, float scale) {
  if (!dry()) cuda::l2_norm_scale(x, rows, dim, eps, scale, stream_->handle());
}

void CudaBackend::kda_forget_gate(float* g, int64_t T, int64_t n_heads, int64_t d,
                                  const Weight& a_log, const Weight& dt_bias) {
  if (dry()) return;
  cuda::kda_forget_gate(g, T, n_heads, d, static_cast<const float*>(a_log.data),
                        static_cast<const float*>(dt_bias.data), stream_->handle());
}

void CudaBackend::gated_delta_rule(const Tokens& t, const float* q, const float* k, const float* v,
                                   const float* g, const float* beta, int64_t n_heads, int64_t dk,
                                   int64_t dv, float* out, bool head_decay) {
  if (dry()) {
    // The recurrence keeps a state column in registers, one thread per value channel.
    STRATA_CHECK(dk <= 256, "linear key head dim ", dk, " exceeds the GPU kernel's 256");
    STRATA_CHECK(dv <= 256, "linear value head dim ", dv, " exceeds the GPU kernel's 256");
    return;
  }
  span(kAttention);
  cuda::gated_delta_rule(q, k, v, g, beta, t.seq_bounds_dev, t.n_seqs(), n_heads, dk, dv, out,
                         stream_->handle(), head_decay);
  round_ops(out, t.tokens * n_heads * dv);
  span(kAttentionCore);
}

// ---- mixture of experts -------------------------------------------------------------------------

void CudaBackend::route_softmax(float* logits, int64_t T, int64_t E, int64_t K,
                                const SoftmaxRouting& r, int32_t* chosen, float* weight) {
  if (dry()) {
    const std::string why = cuda::routing_unsupported(E, K);
    STRATA_CHECK(why.empty(), why);
    return;
  }
  int32_t* counts = moe_ints_.as<int32_t>();
  stream_->zero(counts, static_cast<uint64_t>(E) * 4);
  round_ops(logits, T * E);  // the router's logits (a bf16 linear in the source)
  cuda::route_softmax_topk(logits, T, E, K, r.renormalize, chosen, weight, counts,
                           stream_->handle());
  if (r.bf16_weights) round_ops(weight, T * K);
}

void CudaBackend::route_sigmoid(float* logits, int64_t T, int64_t E, int64_t K,
                                const SigmoidRouting& r, int32_t* chosen, float* weight) {
  if (dry()) {
    const std::string why = cuda::grouped_routing_unsupported(E, K, r.n_group, r.topk_group);
    STRATA_CHECK(why.empty(), why);
    return;
  }
  int32_t* counts = moe_ints_.as<int32_t>();
  stream_->zero(counts, static_cast<uint64_t>(E) * 4);
  if (r.bf16_logits) round_ops(logits, T * E);
  cuda::route_sigmoid_grouped(
      logits, T, E, K, r.bias ? static_cast<const float*>(r.bias->data) : nullptr, r.n_group,
      r.topk_group, r.renormalize, r.scaling, chosen, weight, counts, stream_->handle());
}

// The device arrays of the experts' pointers (CudaBackend::Experts) for G = count x repeat
// groups, group g being expert first + g mod count (one process: every expert once; expert
// parallelism: the experts held, once per source rank); aligned: every weight at a 16-byte
// boundary (expert_gemm's vector loads).
const void* const* CudaBackend::expert_tables(std::span<const Mlp> experts, int64_t first,
                                              int64_t count, int64_t repeat, bool* aligned) {
  STRATA_ASSERT(experts_, "expert pointers: the backend was made for no experts");
  Experts& x = *experts_;
  const size_t E = static_cast<size_t>(count * repeat);
  x.next.assign(5 * E, nullptr);
  for (size_t e = 0; e < E; ++e) {
    const int64_t ex = first + static_cast<int64_t>(e % static_cast<size_t>(count));
    const Mlp& m = experts[static_cast<size_t>(ex)];
    // A deferred weight: where decompress_experts puts it (gate or gate_up, and down, at the
    // slot's start; up after gate).
    auto ptr = [&](const Weight& w, uint64_t at) -> const void* {
      if (!w.defined()) return nullptr;
      if (!w.deferred()) return w.data;
      return static_cast<const uint8_t*>(expert_slot(ex)) + at;
    };
    const uint64_t up_at =
        align_up(static_cast<uint64_t>(m.inter * m.hidden) * static_cast<uint64_t>(esz()));
    x.next[e] = m.interleaved ? ptr(m.gate_up, 0) : ptr(m.gate, 0);
    x.next[E + e] = ptr(m.up, up_at);
    x.next[2 * E + e] = ptr(m.down, 0);
    x.next[3 * E + e] = ptr(m.gate_up_bias, 0);
    x.next[4 * E + e] = ptr(m.down_bias, 0);
  }
  if (repeat == 1 && first == 0 && count == static_cast<int64_t>(experts.size()) && count > 0)
    deferred_tables(experts, x.next);
  if (x.next != x.last) {
    const uint64_t bytes = x.next.size() * sizeof(void*);
    STRATA_ASSERT(bytes <= x.dev.bytes(), "expert pointers: ", E, " experts");
    x.copied.synchronize();  // the pinned copy of the last tables has been read
    std::memcpy(x.host.data(), x.next.data(), bytes);
    stream_->copy_to_device(x.dev.data(), x.host.data(), bytes);
    x.copied.record(*stream_);
    x.last = x.next;
    x.aligned = true;
    for (size_t i = 0; i < 3 * E; ++i)
      x.aligned = x.aligned && reinterpret_cast<uintptr_t>(x.next[i]) % 16 == 0;
  }
  *aligned = x.aligned;
  return static_cast<const void* const*>(x.dev.data());
}

const void* CudaBackend::expert_slot(int64_t e) const {
  STRATA_ASSERT(slice_experts_ > 0, "deferred experts without a slice buffer");
  return slice_.as<uint8_t>() + static_cast<uint64_t>(e % slice_experts_) * slot_bytes_;
}

void CudaBackend::deferred_tables(std::span<const Mlp> experts,
                                  std::vector<const void*>& tables) const {
  const Mlp& m0 = experts[0];
  const Weight& first = m0.interleaved ? m0.gate_up : m0.gate;
  if (!first.deferred()) return;
  // Gate/up items: per expert gate_up, or gate then up; down items: one per expert. Each array
  // (values, scales, outputs) over all items of its pass.
  const int64_t E = static_cast<int64_t>(experts.size()), per = m0.interleaved ? 1 : 2;
  const uint64_t up_at =
      align_up(static_cast<uint64_t>(m0.inter * m0.hidden) * static_cast<uint64_t>(esz()));
  for (const bool gate_up : {true, false}) {
    const int64_t n = gate_up ? E * per : E;
    const size_t at = tables.size();
    tables.resize(at + 3 * static_cast<size_t>(n), nullptr);
    const Weight& w0 = gate_up ? first : m0.down;
    for (int64_t e = 0; e < E; ++e) {
      const Mlp& m = experts[static_cast<size_t>(e)];
      STRATA_ASSERT(m.held(), "deferred experts: expert ", e, " is not held");
      auto* slot = static_cast<const uint8_t*>(expert_slot(e));
      for (int64_t k = 0; k < (gate_up ? per : 1); ++k) {
        const Weight& w = !gate_up ? m.down : m.interleaved ? m.gate_up : k == 0 ? m.gate : m.up;
        const Compressed& c = w.compressed;
        // One launch decompresses them all: one kind, shape and scale layout.
        STRATA_ASSERT(w.deferred() && c.kind == w0.compressed.kind && w.shape == w0.shape &&
                          c.group == w0.compressed.group &&
                          c.scale_dtype == w0.compressed.scale_dtype &&
                          c.stored_cols == w0.compressed.stored_cols,
                      "deferred experts of unlike weights (expert ", e, ")");
        const size_t i = at + static_cast<size_t>(e * (gate_up ? per : 1) + k);
        tables[i] = c.values;
        tables[i + static_cast<size_t>(n)] = c.scales;
        tables[i + 2 * static_cast<size_t>(n)] = slot + (k == 1 ? up_at : 0);
      }
    }
  }
}

void CudaBackend::decompress_experts(std::span<const Mlp> experts, const void* const* tables,
                                     int64_t e0, int64_t e1, bool gate_up) {
  // deferred_tables' layout: after the five arrays of E, the gate/up pass's 3 arrays of E x per
  // items, then the down pass's 3 arrays of E.
  const Mlp& m0 = experts[0];
  const int64_t E = static_cast<int64_t>(experts.size()), per = m0.interleaved ? 1 : 2;
  const void* const* gu = tables + 5 * E;
  const Weight& w = !gate_up ? m0.down : m0.interleaved ? m0.gate_up : m0.gate;
  const int64_t k = gate_up ? per : 1, n = gate_up ? E * per : E;
  decompress_weights(w.compressed, w.rows(), w.cols(), (gate_up ? gu : gu + 3 * E * per) + e0 * k,
                     n, (e1 - e0) * k, opt_.gemm_bf16, stream_->handle());
}

void CudaBackend::moe(const float* n, int64_t T, int64_t H, int64_t K, const int32_t* chosen,
                      const float* weight, std::span<const Mlp> experts, float* y) {
  // The serving simulation (strata compare): every expert's input quantization, one per layer.
  const ExpertQuant quant{experts_input_quant(experts, true), experts_input_quant(experts, false)};
  if (exchange_ ? exchange_->ranks() > 1 : dry() && opt_.expert_ranks > 1) {
    moe_exchanged(n, T, H, K, chosen, weight, experts, y, quant);
    return;
  }
  const int64_t E = static_cast<int64_t>(experts.size()), S = T * K, Im = experts[0].inter;
  // gpt-oss: one [2Im, H] GEMM per expert into g [S, 2Im] (gate/up interleaved), its bias, then
  // the clamped SwiGLU into u [S, Im], the down GEMM's input; the down bias after that GEMM.
  const bool interleaved = experts[0].interleaved;
  const int64_t gw = interleaved ? 2 * Im : Im;  // g's width
  const int gu0 = slot_range(experts, true), dn0 = slot_range(experts, false);
  const uint64_t top = mark();
  int32_t* pos = take_i32(S);
  int32_t* row_expert = take_i32(S);
  // local_hessian: each expert's slots in token order (taken whenever the run keeps statistics,
  // so that the sizing runs count it).
  int32_t* order = opt_.hessian_bytes > 0 ? take_i32(S) : nullptr;
  float* og = take(S * H);           // [S, H] the experts' outputs, rows grouped by expert
  float* g = take(S * gw);           // [S, Im] gate, or [S, 2Im] gate/up interleaved
  float* u = take(S * Im);           // [S, Im] up, or the activation
  float* act = interleaved ? u : g;  // the down GEMMs' input [S, Im]
  const uint64_t at = mark();
  // The GEMM inputs [S, H], rows grouped by expert: gathered in bf16 from n's bf16 copy (the
  // same bits as gathering, then rounding), or for fp32 GEMMs in fp32 into og, which the down
  // GEMMs overwrite once gate/up have read them.
  uint16_t *n16 = nullptr, *x16 = nullptr;
  if (opt_.gemm_bf16) {
    n16 = take_bytes<uint16_t>(T * H);
    x16 = take_bytes<uint16_t>(S * H);
  }
  // The serving simulation: n as the experts' gate/up input quantization says (row-wise, so
  // quantizing n before the gather gives each expert's rows as the CPU quantizes them).
  float* nq = quant.gate_up.on() ? take(T * H) : nullptr;
  if (dry()) {
    release(at);
    gin(act, S * Im);  // the down GEMMs' input
    release(top);
    expert_slot_high_ = std::max(expert_slot_high_, expert_slot_bytes(experts[0], opt_.gemm_bf16));
    return;
  }
  void* s = stream_->handle();
  // Deferred experts (reserve_expert_slice): the GEMMs run a slice of experts at a time, each
  // slice's weights decompressed just before, into the same slots. Every row's output has the
  // bits of the whole launch (expert_gemm.h: the same row tile for S and E, the same k order).
  const bool deferred =
      experts[0].interleaved ? experts[0].gate_up.deferred() : experts[0].gate.deferred();
  const int64_t slice = deferred ? slice_experts_ : E;
  if (deferred) {
    STRATA_ASSERT(slice > 0 && slot_bytes_ >= expert_slot_bytes(experts[0], opt_.gemm_bf16),
                  "deferred experts: the slice buffer holds ", slice, " slots of ", slot_bytes_,
                  " bytes");
  }
  int32_t* counts = moe_ints_.as<int32_t>();  // from the router
  int32_t* offsets = counts + E;              // [E + 1]
  int32_t* cursor = offsets + E + 1;          // [E]
  int32_t* tile_first = cursor + E;           // [E + 1]
  STRATA_ASSERT(moe_ints_.bytes() >= static_cast<uint64_t>(4 * E + 2) * 4, "expert counts: ", E,
                " experts");
  bool aligned = false;
  const void* const* tables = expert_tables(experts, 0, E, 1, &aligned);
  const float* const* gate_up_bias = reinterpret_cast<const float* const*>(tables + 3 * E);
  const float* const* down_bias = reinterpret_cast<const float* const*>(tables + 4 * E);
  // Offsets and tiles from the counts on the device; each expert's rows are added to its
  // gate/up and down slots' row counts there (read back with the amaxes).
  uint64_t* rows = rows_dev_.as<uint64_t>();
  const int64_t tile = cuda::expert_row_tile(S, E, opt_.gemm_bf16);
  cuda::expert_plan(counts, E, tile, offsets, tile_first, rows + gu0, rows + dn0, s);
  stream_->zero(cursor, static_cast<uint64_t>(E) * 4);
  cuda::moe_scatter(chosen, S, offsets, cursor, pos, row_expert, s);
  span(kRouter);
  // The rows an expert sees are its tokens' n: each token's amax goes to its K experts' slots.
  cuda::amax_rows(n, T, H, chosen, slot_ptr(gu0), s, K);
  if (hist_dev_.bytes() > 0)
    cuda::block_histogram(n, T, H, chosen, K, thresholds_dev_.as<float>(), hist_of(gu0), s);
  // local_hessian: an expert's sums over its rows in token order (the CPU's expert loop), its
  // experts' sums back to back.
  auto hessians = [&](int first, int64_t cols) -> double* {
    bool any = false;
    for (int64_t e = 0; e < E; ++e)
      any = any || tracked(slot_names_[static_cast<size_t>(first + e)]);
    if (!any) return nullptr;
    double* at = hessian_of(first, cols);
    for (int64_t e = 1; e < E; ++e)
      hessian_of(first + static_cast<int>(e), cols);
    return at;
  };
  double* h_gu = hessians(gu0, H);
  double* h_dn = hessians(dn0, Im);
  if (h_gu || h_dn) cuda::expert_order(chosen, S, offsets, E, order, s);
  if (h_gu)
    cuda::expert_block_hessian(n, H, order, static_cast<int32_t>(K), nullptr, offsets, E, h_gu, s);
  const float* nx = n;  // the GEMMs' rows before the gather
  if (nq) {
    stream_->copy_device(nq, n, static_cast<uint64_t>(T * H) * 4);
    fake_quantize(nq, T, H, quant.gate_up, "an expert's input");
    nx = nq;
  }
  const void* xin = nullptr;
  if (opt_.gemm_bf16) {
    cuda::cast_bf16(nx, n16, T * H, s);
    cuda::moe_gather(n16, T, H, K, pos, x16, s);
    xin = x16;
  } else {
    cuda::moe_gather(nx, T, H, K, pos, og, s);
    xin = og;
  }
  span(kExpertOther);
  // Every expert's gate and up GEMMs in one launch (gpt-oss: its gate_up GEMM).
  cuda::ExpertGemmOutputs gu;
  gu.w[0] = tables;
  gu.y[0] = g;
  if (!interleaved) {
    gu.w[1] = tables + E;
    gu.y[1] = u;
    gu.n_out = 2;
  }
  auto gemms = [&](const cuda::ExpertGemmOutputs& out, const void* x, int64_t k, int64_t width,
                   bool gate_up) {
    for (int64_t e0 = 0; e0 < E; e0 += slice) {
      const int64_t e1 = std::min(E, e0 + slice);
      if (deferred) {
        decompress_experts(experts, tables, e0, e1, gate_up);
        span(kExpertOther);
      }
      cuda::ExpertGemmOutputs part = out;
      for (int j = 0; j < out.n_out; ++j)
        part.w[j] = out.w[j] + e0;
      cuda::expert_gemm(x, S, k, offsets + e0, tile_first + e0, e1 - e0, tile, part, width,
                        opt_.gemm_bf16, aligned, s);
      ++prof_->gemms;
      span(gate_up ? kExpertGateUp : kExpertDown);
    }
  };
  gemms(gu, xin, H, gw, true);
  release(at);
  // Under bf16_ops every GEMM output, and gpt-oss's biased one again, rounded (as CpuBackend::mlp).
  round_ops(g, S * gw);
  if (!interleaved) round_ops(u, S * Im);
  if (interleaved) {
    cuda::moe_add_bias(g, S, gw, row_expert, gate_up_bias, s);
    round_ops(g, S * gw);
    cuda::swiglu_clamped(g, S * Im, experts[0].alpha, experts[0].limit, u, s, bf16_ops_);
  } else {
    cuda::swiglu(g, u, S * Im, g, s, bf16_ops_);
  }
  cuda::amax_rows(act, S, Im, row_expert, slot_ptr(dn0), s);
  if (hist_dev_.bytes() > 0)
    cuda::block_histogram(act, S, Im, row_expert, 1, thresholds_dev_.as<float>(), hist_of(dn0), s);
  if (h_dn) cuda::expert_block_hessian(act, Im, order, 1, pos, offsets, E, h_dn, s);
  fake_quantize(act, S, Im, quant.down, "an expert's down input");  // once observed
  const void* hin = gin(act, S * Im);
  span(kExpertOther);
  cuda::ExpertGemmOutputs dn;
  dn.w[0] = tables + 2 * E;
  dn.y[0] = og;
  gemms(dn, hin, Im, H, false);
  round_ops(og, S * H);
  if (interleaved) {
    cuda::moe_add_bias(og, S, H, row_expert, down_bias, s);
    round_ops(og, S * H);
  }
  span(kExpertDown);
  cuda::moe_combine(og, pos, weight, T, K, H, y, s, bf16_ops_);
  span(kCombine);
  release(top);
}

uint8_t* CudaBackend::take_received(uint64_t bytes) {
  if (dry() || arena_at_ + align_up(bytes) <= scratch_.bytes())
    return take_bytes<uint8_t>(static_cast<int64_t>(bytes));
  if (received_.bytes() < bytes) {
    stream_->synchronize();  // the last chunk's rows may still be read
    received_ = DeviceBuffer();
    received_ = DeviceBuffer(*budget_, bytes + bytes / 4, "expert rows received from other ranks");
  }
  return received_.as<uint8_t>();
}

// Expert parallelism (docs/SCALEOUT.md "Expert parallel on GPU ranks"). The sender groups its
// slots by expert as moe() does (rows of expert e at [offsets[e], offsets[e + 1]); the experts of
// a rank are contiguous, so are its rows), sends each rank its rows (bf16 GEMM inputs, or fp32)
// with their meta (expert, the token's amax), and counts each expert's rows into its observers'
// row counts. The owner runs its experts on what it received: group g = (source rank q, expert
// e0 + j) holds q's rows of that expert, G = ranks x experts held groups in one grouped GEMM per
// projection, and observes the gate/up amax from the meta and the down amax from its rows. Each
// row's output depends on that row alone (expert_gemm: one fixed order over k whatever the tile
// or the rows beside it), so it has the bits one process computes. The outputs go back in the
// order received and are combined where the token lives, in slot order, as in moe().
void CudaBackend::moe_exchanged(const float* n, int64_t T, int64_t H, int64_t K,
                                const int32_t* chosen, const float* weight,
                                std::span<const Mlp> experts, float* y, const ExpertQuant& quant) {
  const int64_t E = static_cast<int64_t>(experts.size()), S = T * K, Im = experts[0].inter;
  STRATA_ASSERT(hessian_names_.empty(), "local_hessian statistics under expert parallelism");
  STRATA_CHECK(!experts[0].interleaved,
               "expert parallelism on the GPU: gpt-oss's experts are written fused (run without "
               "--expert_parallel)");
  for (const Mlp& m : experts)
    STRATA_ASSERT(!m.gate.deferred(), "expert parallelism: deferred experts (never sliced)");
  const int N = exchange_ ? exchange_->ranks() : opt_.expert_ranks;
  const int me = exchange_ ? exchange_->rank() : opt_.expert_rank;
  const int64_t e0 = E * me / N, e1 = E * (me + 1) / N, Em = e1 - e0;  // the experts held here
  const int64_t G = N * Em;
  const uint64_t es = static_cast<uint64_t>(esz());
  const int gu0 = slot_range(experts, true), dn0 = slot_range(experts, false);
  const uint64_t top = mark();
  int32_t* pos = take_i32(S);
  int32_t* row_expert = take_i32(S);
  int32_t* meta = take_i32(2 * S);  // [S, 2]: expert, the token's amax bits
  float* og = take(S * H);          // [S, H] the experts' outputs, back from their ranks
  void* xs = take_bytes<uint8_t>(static_cast<int64_t>(static_cast<uint64_t>(S * H) * es));
  uint16_t* n16 = opt_.gemm_bf16 ? take_bytes<uint16_t>(T * H) : nullptr;
  float* nq = quant.gate_up.on() ? take(T * H) : nullptr;  // as in moe()
  // The receiving side for R rows: [R, H] inputs, [R, 2] meta, [R] experts, [R, Im] gate and up,
  // [R, Im] the down GEMMs' bf16 input, [R, H] outputs.
  auto received_bytes = [&](int64_t R) {
    return align_up(static_cast<uint64_t>(R * H) * es) + align_up(static_cast<uint64_t>(R) * 8) +
           align_up(static_cast<uint64_t>(R) * 4) +
           2 * align_up(static_cast<uint64_t>(R * Im) * 4) +
           (opt_.gemm_bf16 ? align_up(static_cast<uint64_t>(R * Im) * 2) : 0) +
           align_up(static_cast<uint64_t>(R * H) * 4);
  };
  if (dry()) {
    // The most rows this rank can receive: every token of every rank sends it one row per slot
    // that chose an expert held here, at most min(K, Em) a token. Planned for, so that a chunk's
    // exchange never outgrows the memory plan (a chunk of 16k tokens on 2 ranks needed 3.1 GiB
    // more than the plan's "as many as sent" when routing sent one rank more rows than it sent).
    take_received(received_bytes(static_cast<int64_t>(N) * T * std::min(K, Em)));
    release(top);
    return;
  }
  void* s = stream_->handle();
  int32_t* counts = moe_ints_.as<int32_t>();  // from the router
  int32_t* offsets = counts + E;              // [E + 1]
  int32_t* cursor = offsets + E + 1;          // [E]
  int32_t* tile_first = cursor + E;           // [E + 1]
  int32_t* g_counts = tile_first + E + 1;     // [G]
  int32_t* g_offsets = g_counts + G;          // [G + 1]
  int32_t* g_tiles = g_offsets + G + 1;       // [G + 1]
  STRATA_ASSERT(moe_ints_.bytes() >= static_cast<uint64_t>(4 * E + 2 + 3 * G + 2) * 4,
                "expert counts: ", E, " experts over ", N, " ranks");
  // Sender: slots grouped by expert, each expert's rows counted for its observers here (the
  // ranks' counts add up to one process's), the rows and their meta in expert order.
  uint64_t* rows = rows_dev_.as<uint64_t>();
  cuda::expert_plan(counts, E, cuda::expert_row_tile(S, E, opt_.gemm_bf16), offsets, tile_first,
                    rows + gu0, rows + dn0, s);
  stream_->zero(cursor, static_cast<uint64_t>(E) * 4);
  cuda::moe_scatter(chosen, S, offsets, cursor, pos, row_expert, s);
  cuda::moe_dispatch_meta(n, T, H, K, chosen, pos, meta, s);
  // Block histograms of the experts' gate/up input: counted here for every expert a row goes to
  // (the ranks' counts add up to one process's, as the rows do).
  if (hist_dev_.bytes() > 0)
    cuda::block_histogram(n, T, H, chosen, K, thresholds_dev_.as<float>(), hist_of(gu0), s);
  const float* nx = n;
  if (nq) {
    stream_->copy_device(nq, n, static_cast<uint64_t>(T * H) * 4);
    fake_quantize(nq, T, H, quant.gate_up, "an expert's input");
    nx = nq;
  }
  if (opt_.gemm_bf16) {
    cuda::cast_bf16(nx, n16, T * H, s);
    cuda::moe_gather(n16, T, H, K, pos, static_cast<uint16_t*>(xs), s);
  } else {
    cuda::moe_gather(nx, T, H, K, pos, static_cast<float*>(xs), s);
  }
  span(kRouter);
  // The counts, exchanged on the host: each rank gets every rank's rows per expert it holds.
  auto* host = reinterpret_cast<int32_t*>(ep_host_.data());
  stream_->copy_to_host(host, offsets, static_cast<uint64_t>(E + 1) * 4);
  stream_->synchronize();
  std::vector<int64_t> per_expert(static_cast<size_t>(E)), expert_counts(static_cast<size_t>(N));
  std::vector<int64_t> send_rows(static_cast<size_t>(N), 0);
  for (int64_t e = 0; e < E; ++e)
    per_expert[e] = host[e + 1] - host[e];
  for (int q = 0; q < N; ++q) {
    const int64_t a = E * q / N, b = E * (q + 1) / N;
    expert_counts[q] = b - a;
    send_rows[q] = host[b] - host[a];
  }
  std::vector<int64_t> got;  // [N][Em]: each source rank's rows per expert held here
  const std::vector<int64_t> group_counts =
      exchange_->exchange_counts(per_expert, expert_counts, &got);
  STRATA_ASSERT(static_cast<int64_t>(group_counts.size()) == G, "expert counts from the ranks");
  std::vector<int64_t> recv_rows(static_cast<size_t>(N), 0);
  int64_t R = 0;
  for (int q = 0; q < N; ++q) {
    for (int64_t j = 0; j < Em; ++j)
      recv_rows[q] += group_counts[q * Em + j];
    R += recv_rows[q];
  }
  // The receiving side.
  uint8_t* at = take_received(received_bytes(R));
  auto carve = [&at](uint64_t bytes) {
    uint8_t* p = at;
    at += align_up(bytes);
    return p;
  };
  void* xr = carve(static_cast<uint64_t>(R * H) * es);
  auto* meta_r = reinterpret_cast<int32_t*>(carve(static_cast<uint64_t>(R) * 8));
  auto* expert_r = reinterpret_cast<int32_t*>(carve(static_cast<uint64_t>(R) * 4));
  auto* g = reinterpret_cast<float*>(carve(static_cast<uint64_t>(R * Im) * 4));
  auto* u = reinterpret_cast<float*>(carve(static_cast<uint64_t>(R * Im) * 4));
  auto* h16 = opt_.gemm_bf16 ? reinterpret_cast<uint16_t*>(carve(static_cast<uint64_t>(R * Im) * 2))
                             : nullptr;
  auto* og_r = reinterpret_cast<float*>(carve(static_cast<uint64_t>(R * H) * 4));
  exchange_->alltoallv_rows(xs, send_rows, xr, recv_rows, static_cast<size_t>(H) * es, s);
  exchange_->alltoallv_rows(meta, send_rows, meta_r, recv_rows, 8, s);
  span(kExpertOther);
  if (G > 0) {
    // Owner: the gate/up amax from the meta, the groups' plan, the GEMMs as moe() runs them.
    cuda::moe_receive_meta(meta_r, R, expert_r, slot_ptr(gu0), s);
    int32_t* hg = host + E + 1;
    for (int64_t i = 0; i < G; ++i)
      hg[i] = static_cast<int32_t>(group_counts[i]);
    stream_->copy_to_device(g_counts, hg, static_cast<uint64_t>(G) * 4);
    const int64_t tile = cuda::expert_row_tile(R, G, opt_.gemm_bf16);
    cuda::expert_plan(g_counts, G, tile, g_offsets, g_tiles, nullptr, nullptr, s);
    bool aligned = false;
    const void* const* tables = expert_tables(experts, e0, Em, N, &aligned);
    cuda::ExpertGemmOutputs gu;
    gu.w[0] = tables;
    gu.y[0] = g;
    gu.w[1] = tables + G;
    gu.y[1] = u;
    gu.n_out = 2;
    cuda::expert_gemm(xr, R, H, g_offsets, g_tiles, G, tile, gu, Im, opt_.gemm_bf16, aligned, s);
    ++prof_->gemms;
    span(kExpertGateUp);
    round_ops(g, R * Im);
    round_ops(u, R * Im);
    cuda::swiglu(g, u, R * Im, g, s, bf16_ops_);
    cuda::amax_rows(g, R, Im, expert_r, slot_ptr(dn0), s);
    if (hist_dev_.bytes() > 0)
      cuda::block_histogram(g, R, Im, expert_r, 1, thresholds_dev_.as<float>(), hist_of(dn0), s);
    fake_quantize(g, R, Im, quant.down, "an expert's down input");
    const void* hin = g;
    if (opt_.gemm_bf16) {
      cuda::cast_bf16(g, h16, R * Im, s);
      hin = h16;
    }
    span(kExpertOther);
    cuda::ExpertGemmOutputs dn;
    dn.w[0] = tables + 2 * G;
    dn.y[0] = og_r;
    cuda::expert_gemm(hin, R, Im, g_offsets, g_tiles, G, tile, dn, H, opt_.gemm_bf16, aligned, s);
    ++prof_->gemms;
    round_ops(og_r, R * H);
    span(kExpertDown);
  }
  // The outputs back to the ranks their rows came from, in the order sent.
  exchange_->alltoallv_rows(og_r, recv_rows, og, send_rows, static_cast<size_t>(H) * 4, s);
  span(kExpertOther);
  cuda::moe_combine(og, pos, weight, T, K, H, y, s, bf16_ops_);
  span(kCombine);
  release(top);
}

void CudaBackend::use_for_quantization(int device) {
  // At the device's highest priority: its small kernels (a layer's ~1000 expert weights'
  // decompression, amax and encoding) go between the forward's blocks instead of after them.
  qstream_ = std::make_unique<strata::cuda::Stream>(device, true);
  // The encoders' outputs and their two check words come back through pinned memory: one
  // weight's (quantize_weight), or many queued NVFP4 weights' (quantize_weights).
  qstage_.reserve(std::max(kStageChecks + align_up(scratch_.bytes()), kBatchStage));
}

uint64_t CudaBackend::staging_bytes() const {
  return qstage_.bytes();
}

void CudaBackend::reserve_decompression(uint64_t bytes) {
  if (bytes <= decompressed_.bytes()) return;
  decompressed_ = DeviceBuffer();
  decompressed_ = DeviceBuffer(*budget_, bytes, "a compressed weight decompressed to quantize it");
}

void CudaBackend::reserve_hessian(uint64_t bytes) {
  if (bytes <= search_hessian_.bytes()) return;
  search_hessian_ = DeviceBuffer();
  search_hessian_ = DeviceBuffer(*budget_, bytes, "local_hessian statistics of a weight searched");
}

StoredWeight CudaBackend::decompressed_for_quantization(const StoredWeight& w) {
  if (!w.compressed.defined()) return w;
  const uint64_t bytes = static_cast<uint64_t>(w.rows * w.cols) * 2;
  STRATA_ASSERT(bytes <= decompressed_.bytes(), "a deferred weight of ", bytes,
                " bytes to quantize; reserve_decompression reserved ", decompressed_.bytes());
  // bf16, as the CPU decompresses it (FP8's rounding follows the weight's dtype); on the
  // quantization stream, in order with its readers (the buffer is reused by the next weight).
  decompress_weight(w.compressed, w.rows, w.cols, decompressed_.data(), true, qstream_->native());
  StoredWeight d{decompressed_.data(), DType::kBF16, w.rows, w.cols};
  d.fp32_quotient = w.fp32_quotient;
  return d;
}

void CudaBackend::weight_amaxes(const std::vector<std::vector<StoredWeight>>& groups, float* out) {
  namespace qc = strata::quant::cuda;
  if (groups.empty()) return;
  STRATA_ASSERT(qstream_ && static_cast<int64_t>(groups.size()) <= max_slots_,
                "weight amaxes: ", groups.size(), " groups, ", max_slots_, " slots");
  cudaSetDevice(qstream_->device());  // the caller may be a helper thread
  // Every group at once: one copy back.
  float* slots = slots_dev_.as<float>();
  strata::cuda::fill_zero(slots, groups.size() * 4, *qstream_);
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const StoredWeight& stored : groups[g]) {
      const StoredWeight w = decompressed_for_quantization(stored);
      qc::weight_amax(w.data, w.dtype, w.rows * w.cols, slots + g, *qstream_);
    }
  }
  strata::cuda::copy_to_host(out, slots, groups.size() * 4, *qstream_);
}

float CudaBackend::queue_nvfp4(const StoredWeight& stored, float amax, std::string_view name,
                               const WeightSearch* search, uint8_t* stage) {
  namespace qc = strata::quant::cuda;
  static_assert(qc::kMaxSearchCandidates == kMaxDeviceSearchCandidates);
  STRATA_CHECK(search == nullptr || device_search_unsupported(search->calib).empty(),
               "nvfp4: ", name, ": ",
               search ? device_search_unsupported(search->calib) : std::string());
  // The search's candidates, passed to the kernel by value.
  std::optional<qc::Nvfp4Search> candidates;
  if (search) {
    candidates.emplace();
    qc::Nvfp4Search& c = *candidates;
    c.sweep = search->calib.fp8_scale_sweep;
    if (c.sweep) {
      const std::vector<uint8_t> bytes = nvfp4_sweep_scales(amax);
      c.count = static_cast<int>(bytes.size());
      std::copy(bytes.begin(), bytes.end(), c.bytes);
    } else {
      const std::vector<float> m = mse_multipliers(search->calib);
      c.count = static_cast<int>(m.size());
      std::copy(m.begin(), m.end(), c.multipliers);
    }
  }
  const StoredWeight w = decompressed_for_quantization(stored);
  const int64_t rows = w.rows, cols = w.cols;
  if (search && !search->hessian.empty()) {
    // local_hessian: the module's statistics beside the weight (read by the kernel before the
    // caller synchronizes, while the caller's vector lives).
    const uint64_t bytes = search->hessian.size() * sizeof(double);
    STRATA_CHECK(static_cast<int64_t>(search->hessian.size()) == 16 * cols, "local_hessian: the ",
                 "input statistics of ", name, " have ", search->hessian.size() / 256,
                 " blocks of 16 features, the weight ", cols / 16);
    STRATA_ASSERT(bytes <= search_hessian_.bytes(), "local_hessian statistics of ", bytes,
                  " bytes; reserve_hessian reserved ", search_hessian_.bytes());
    strata::cuda::copy_to_device(search_hessian_.data(), search->hessian.data(), bytes, *qstream_);
    candidates->hessian = search_hessian_.as<double>();
    candidates->blocks_per_row = cols / 16;
  }
  // Packed codes then block scales, side by side in the arena, copied to the stage after the two
  // check words (the arena is reused by the next weight queued: in stream order, after this copy).
  uint8_t* arena = scratch_.as<uint8_t>();
  const uint64_t packed_bytes = static_cast<uint64_t>(rows * cols / 2);
  const uint64_t codes = packed_bytes + static_cast<uint64_t>(rows * cols / 16);
  STRATA_ASSERT(codes <= scratch_.bytes() && nvfp4_stage_bytes(rows, cols) <= qstage_.bytes(),
                "quantize_weight scratch");
  unsigned long long* checks = qc::check_slots(*qstream_);
  const float ws2 =
      qc::nvfp4_quantize_deferred(w.data, w.dtype, rows, cols, amax, arena, arena + packed_bytes,
                                  name, checks, *qstream_, candidates ? &*candidates : nullptr);
  strata::cuda::copy_to_host_async(stage, checks, 2 * sizeof(unsigned long long), *qstream_);
  strata::cuda::copy_to_host_async(stage + kStageChecks, arena, codes, *qstream_);
  return ws2;
}

uint64_t CudaBackend::nvfp4_stage_bytes(int64_t rows, int64_t cols) {
  return kStageChecks + align_up(static_cast<uint64_t>(rows * cols / 2 + rows * cols / 16));
}

Nvfp4Weight CudaBackend::take_nvfp4(const uint8_t* stage, int64_t rows, int64_t cols, float ws2,
                                    float amax, std::string_view name) {
  unsigned long long checks[2];
  std::memcpy(checks, stage, sizeof(checks));
  strata::quant::cuda::nvfp4_check(checks, name, amax, cols);
  Tensor packed = Tensor::zeros(DType::kU8, {rows, cols / 2});
  Tensor scales = Tensor::zeros(DType::kF8E4M3, {rows, cols / 16});
  std::memcpy(packed.mutable_bytes(), stage + kStageChecks, packed.nbytes());
  std::memcpy(scales.mutable_bytes(), stage + kStageChecks + packed.nbytes(), scales.nbytes());
  return Nvfp4Weight{std::move(packed), std::move(scales), Tensor::scalar_f32(ws2)};
}

QuantizedWeight CudaBackend::quantize_weight(const StoredWeight& stored, QFormat format, float amax,
                                             std::string_view name, const WeightSearch* search) {
  namespace qc = strata::quant::cuda;
  STRATA_ASSERT(qstream_, "quantize_weight: use_for_quantization first");
  STRATA_ASSERT(search == nullptr || format == QFormat::kNvfp4 || format == QFormat::kW4A16Nvfp4,
                "a scale search for ", name, " in ", qformat_name(format));
  cudaSetDevice(qstream_->device());
  uint8_t* arena = scratch_.as<uint8_t>();  // the encoders' outputs, then copied back
  auto fetch = [&](const uint8_t* src, DType dtype, Shape shape) {
    Tensor t = Tensor::zeros(dtype, std::move(shape));
    strata::cuda::copy_to_host(t.mutable_bytes(), src, t.nbytes(), *qstream_);
    return t;
  };
  QuantizedWeight o;
  switch (format) {
    case QFormat::kNvfp4:
    case QFormat::kW4A16Nvfp4: {
      // One synchronization for the codes and the check words (three before).
      const float ws2 = queue_nvfp4(stored, amax, name, search, qstage_.data());
      qstream_->synchronize();
      o.nvfp4 = take_nvfp4(qstage_.data(), stored.rows, stored.cols, ws2, amax, name);
      break;
    }
    case QFormat::kFp8: {
      const StoredWeight w = decompressed_for_quantization(stored);
      STRATA_ASSERT(static_cast<uint64_t>(w.rows * w.cols) <= scratch_.bytes(),
                    "quantize_weight scratch");
      const float ws = qc::fp8_quantize(w.data, w.dtype, w.rows * w.cols, amax, arena, name,
                                        *qstream_, w.fp32_quotient);
      o.fp8 = Fp8Weight{fetch(arena, DType::kF8E4M3, {w.rows, w.cols}), Tensor::scalar_f32(ws)};
      break;
    }
    case QFormat::kMxfp8: {
      const StoredWeight w = decompressed_for_quantization(stored);
      const int64_t rows = w.rows, cols = w.cols;
      STRATA_ASSERT(static_cast<uint64_t>(rows * cols + rows * cols / 32) <= scratch_.bytes(),
                    "quantize_weight scratch");
      uint8_t* scales = arena + rows * cols;
      qc::mxfp8_quantize(w.data, w.dtype, rows, cols, arena, scales, name, *qstream_);
      o.mxfp8 = Mxfp8Weight{fetch(arena, DType::kF8E4M3, {rows, cols}),
                            fetch(scales, DType::kU8, {rows, cols / 32})};
      break;
    }
    case QFormat::kW4A16Nvfp4Bs32:
    case QFormat::kMxfp4:
    case QFormat::kFp8PbWo:
      // No device encoder: engine/weight_quantizer.h leaves these to the CPU exporter.
      STRATA_ASSERT(false, "quantize_weight of ", name, " in ", qformat_name(format),
                    " on the device");
      break;
    case QFormat::kNone:
      STRATA_ASSERT(false, "quantize_weight of ", name, " in no format");
  }
  return o;
}

std::vector<QuantizedWeight> CudaBackend::quantize_weights(std::span<const WeightJob> jobs) {
  STRATA_ASSERT(qstream_, "quantize_weights: use_for_quantization first");
  cudaSetDevice(qstream_->device());
  std::vector<QuantizedWeight> out(jobs.size());
  // NVFP4 encoders queued back to back, each one's check words and codes at its own place in
  // the stage; one synchronization when the stage is full, at another format's job, and at the
  // end. Their checks are read in job order, so the first failing job's error is the one thrown.
  struct Queued {
    size_t job;
    uint64_t at;
    float ws2;
  };
  std::vector<Queued> queued;
  uint64_t used = 0;
  auto drain = [&]() {
    if (queued.empty()) return;
    qstream_->synchronize();
    for (const Queued& q : queued) {
      const WeightJob& j = jobs[q.job];
      out[q.job].nvfp4 =
          take_nvfp4(qstage_.data() + q.at, j.weight.rows, j.weight.cols, q.ws2, j.amax, j.name);
    }
    queued.clear();
    used = 0;
  };
  for (size_t i = 0; i < jobs.size(); ++i) {
    const WeightJob& j = jobs[i];
    if (j.format != QFormat::kNvfp4 && j.format != QFormat::kW4A16Nvfp4) {
      drain();
      out[i] = quantize_weight(j.weight, j.format, j.amax, j.name, j.search);
      continue;
    }
    const uint64_t need = nvfp4_stage_bytes(j.weight.rows, j.weight.cols);
    if (used + need > qstage_.bytes()) drain();
    try {
      queued.push_back(
          {i, used, queue_nvfp4(j.weight, j.amax, j.name, j.search, qstage_.data() + used)});
    } catch (...) {
      drain();  // an earlier job's error first
      throw;
    }
    used += need;
    // local_hessian: the statistics' buffer is the next search's, and the caller's vector must
    // outlive the kernel's read of it.
    if (j.search && !j.search->hessian.empty()) drain();
  }
  drain();
  return out;
}

}  // namespace strata::ops
