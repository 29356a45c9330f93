#include "model/cuda/gpu_forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "model/arch.h"
#include "model/common.h"
#include "model/cuda/kda_kernels.h"
#include "model/cuda/kernels.h"
#include "model/cuda/parallel_gemm.h"
#include "model/deepseek_v3.h"
#include "model/kimi_linear.h"
#include "ops/ops.h"

namespace strata::gpu {
namespace {

constexpr uint64_t kAlign = 256;
constexpr int64_t kFp8Block = 128;  // DeepSeek's FP8 weight blocks (io/source_weights.h)
uint64_t align_up(uint64_t x) {
  return (x + kAlign - 1) / kAlign * kAlign;
}

// GpuForwardOptions::profile: the device time of each part of the forward, from timing events
// recorded between the parts, summed over the run and logged when the forward is destroyed. The
// events cost a little; off by default.
enum Part {
  kNorms,
  kAttention,
  kAttentionCore,
  kRouter,
  kExpertGateUp,
  kExpertDown,
  kExpertOther,
  kCombine,
  kDenseMlp,
  kParts
};
const char* const kPartNames[kParts] = {"norms and residuals",
                                        "attention projections, norms, RoPE, observers",
                                        "attention scores, softmax and values",
                                        "router (and the host's wait for counts)",
                                        "expert gate/up GEMMs",
                                        "expert down GEMMs",
                                        "expert gather, amax, SwiGLU",
                                        "combine and shared experts",
                                        "dense MLP"};

struct Profile {
  bool on = false;
  std::vector<std::unique_ptr<Event>> events;  // a pool, reused after each take
  std::vector<int> part;                       // events[i] closes a span of part[i] (-1: none)
  double ms[kParts] = {};
  int64_t gemms = 0, forwards = 0;
  void mark(int p, const Stream& s) {
    if (!on) return;
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
      log_info("  ", kPartNames[p], ": ", str(ms[p] / 1000).substr(0, 6), " s");
  }
};

// The names of a SwiGLU MLP's gate, up and down projections (Kimi-Linear's routed experts call
// them w1, w3, w2).
struct MlpLeaves {
  const char *gate = "gate_proj", *up = "up_proj", *down = "down_proj";
};

struct Swiglu {
  const void *gate = nullptr, *up = nullptr, *down = nullptr;  // GEMM dtype
  int64_t inter = 0;
  int gu_slot = -1, down_slot = -1;
};

// A Kimi-Linear KDA layer's weights (model/kimi_linear.cpp KdaAttention): GEMM weights in the
// GEMM dtype, the rest fp32. D = nH * d.
struct KdaWeights {
  const void *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;      // [D, H] x3, [H, D]
  const void *wfa = nullptr, *wfb = nullptr, *wga = nullptr, *wgb = nullptr;  // [d,H] [D,d] x2
  const void* wb = nullptr;                                                   // [nH, H]
  const float *conv_q = nullptr, *conv_k = nullptr, *conv_v = nullptr;        // [D, K] each
  const float *a_log = nullptr, *dt_bias = nullptr, *o_norm = nullptr;        // [nH], [D], [d]
};

}  // namespace

struct GpuForward::Impl {
  const ModelConfig& c;
  const Checkpoint& ckpt;
  DeviceBudget& budget;
  const Stream& stream;
  GpuForwardOptions opt;
  ArchInfo arch;
  std::string model_prefix;
  void* blas = nullptr;
  int64_t H, nH, nKV, d, qd, kd, E = 0, K = 0, Im = 0, Is = 0;
  float eps;
  ops::RopeParams rope_p;
  DeviceBuffer inv_freq;  // [d/2] fp32 (MLA: [dr/2])
  // DeepSeek-V3 / Kimi-K2 (MLA attention, sigmoid-routed MoE with plain shared experts).
  bool mla = false;
  model::MlaParams mp;
  model::SigmoidMoeConfig smoe;
  // Kimi-Linear: MLA without RoPE (mla is set too) on some layers, KDA on the others; the
  // sigmoid-routed MoE under block_sparse_moe. with experts' w1/w3/w2.
  bool kimi = false;
  model::KdaShape kda;
  DeviceBuffer converted, scratch, slots_dev, moe_ints;
  // Attention through GEMMs: S for `seqs_per_call` sequences; the batched GEMMs' pointer arrays
  // (5 of seqs_per_call x nH pointers per call) in a ring of kPtrSlots slots, filled in pinned
  // memory and copied asynchronously, so that the host queues calls ahead of the device; a
  // slot is refilled once the device has run the call that used it (ptr_done).
  static constexpr int kPtrSlots = 32;
  DeviceBuffer scores, ptrs;
  PinnedBuffer host_att_ptrs;
  std::vector<std::unique_ptr<Event>> ptr_done;
  int64_t ptr_next = 0;  // calls issued; slot = ptr_next % kPtrSlots
  int64_t seqs_per_call = 0, longest = 0;
  PinnedBuffer host_ints;  // counts [E], offsets [E]
  // The routed experts' GEMMs, issued from several host threads (model/cuda/parallel_gemm.h;
  // GpuForwardOptions::gemm_threads, default 4; 1: by this thread).
  std::unique_ptr<ParallelGemms> expert_gemms;
  std::vector<GemmJob> jobs;
  int64_t max_tokens = 0;
  uint64_t arena_at = 0;

  // The current layer.
  int64_t layer = -1;
  bool moe = false;
  const float *in_norm = nullptr, *post_norm = nullptr;
  const void *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr, *qn = nullptr, *kn = nullptr;
  const void *wqa = nullptr, *wqb = nullptr, *wkva = nullptr, *wkvb = nullptr;  // MLA
  const float *q_a_norm = nullptr, *kv_a_norm = nullptr, *router_bias = nullptr;
  int slot_qb = -1, slot_kvb = -1;
  Swiglu dense, shared;
  const float* router = nullptr;       // [E, H] fp32
  const float* shared_gate = nullptr;  // [1, H] fp32
  std::vector<Swiglu> experts;
  int slot_qkv = -1, slot_k = -1, slot_v = -1, slot_o = -1, expert_gu0 = -1, expert_dn0 = -1;
  bool kda_layer = false;  // Kimi-Linear: the current layer's mixer is KDA
  KdaWeights kw;
  int slot_fb = -1, slot_gb = -1;
  std::vector<std::vector<std::string>> slot_names;
  std::vector<int64_t> slot_rows;
  Profile prof;

  Impl(const ModelConfig& config, const Checkpoint& ck, DeviceBudget& b, const Stream& s,
       GpuForwardOptions o)
      : c(config), ckpt(ck), budget(b), stream(s), opt(o), arch(resolve_arch(config)) {
    model_prefix = model::find_prefixes(c, ckpt).model;
    H = c.hidden_size;
    nH = c.num_attention_heads;
    nKV = c.num_key_value_heads;
    d = c.head_dim;
    qd = nH * d;
    kd = nKV * d;
    eps = static_cast<float>(c.rms_norm_eps);
    mla = arch.family == ArchFamily::kDeepseekV3;
    kimi = arch.family == ArchFamily::kKimiLinear;
    if (kimi) {
      mla = true;
      kda = model::kda_shape(c);
    }
    if (arch.family == ArchFamily::kQwenMoe || (mla && c.num_experts > 0)) {
      E = c.num_experts;
      K = c.num_experts_per_tok;
      Im = c.moe_intermediate_size;
    }
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      for (const char* leaf :
           {"mlp.shared_expert.gate_proj.weight", "mlp.shared_experts.gate_proj.weight"}) {
        const std::string n = lp(l) + leaf;
        if (ckpt.has(n)) Is = std::max(Is, ckpt.entry(n).shape[0]);
      }
    }
    rope_p = model::rope_params(c);
    std::vector<double> f;
    if (mla) {
      mp = model::mla_params(c, /*nope=*/kimi);
      smoe = kimi ? model::kimi_linear_moe_config(c) : model::deepseek_moe_config(c);
      if (kimi && E > 0) Is = Im * smoe.n_shared;
      f = mp.inv_freq;
    } else {
      f = ops::rope_inv_freq(rope_p, d);
    }
    std::vector<float> f32(f.begin(), f.end());
    if (f32.empty()) f32.push_back(0.0f);  // NoPE MLA: no frequencies
    inv_freq = DeviceBuffer(budget, f32.size() * 4, "RoPE frequencies");
    stream.copy_to_device(inv_freq.data(), f32.data(), f32.size() * 4);
    const int64_t max_slots = 12 + 2 * std::max<int64_t>(E, 1);
    slots_dev = DeviceBuffer(budget, static_cast<uint64_t>(max_slots) * 4, "amax slots");
    if (E > 0) {
      moe_ints = DeviceBuffer(budget, static_cast<uint64_t>(3 * E) * 4, "expert counts");
      host_ints.reserve(static_cast<uint64_t>(2 * E) * 4);
      expert_gemms = std::make_unique<ParallelGemms>(opt.gemm_threads, opt.gemm_bf16);
    }
    blas = gemm_handle_create(stream.handle());
    stream.synchronize();
    prof.on = opt.profile;
  }
  ~Impl() {
    prof.log();
    gemm_handle_destroy(blas);
  }
  void span(int part) { prof.mark(part, stream); }
  void mm(const void* x, const void* w, float* y, int64_t M, int64_t N, int64_t K, bool bf16) {
    ++prof.gemms;
    gemm(blas, x, w, y, M, N, K, bf16);
  }
  // The routed experts' GEMMs queued in `jobs`, from the issuing threads.
  void run_jobs() {
    prof.gemms += static_cast<int64_t>(jobs.size());
    expert_gemms->run(stream, blas, jobs);
  }

  std::string lp(int64_t l) const { return model_prefix + "layers." + std::to_string(l) + "."; }
  int64_t esz() const { return opt.gemm_bf16 ? 2 : 4; }

  // ---- weights -------------------------------------------------------------------------------
  struct Binder {
    Impl& im;
    const LayerBlob& blob;
    const uint8_t* base;  // device blob; null: only count bytes
    uint64_t used = 0;
    const LayerBlob::Item& item(const std::string& name, const Shape& shape) {
      auto it = blob.items.find(name);
      STRATA_CHECK(it != blob.items.end(), im.ckpt.dir(), ": tensor '", name,
                   "' is missing; the checkpoint does not match its config.json");
      STRATA_CHECK(it->second.shape == shape, im.ckpt.dir(), ": tensor '", name, "' has shape ",
                   shape_str(it->second.shape), " but config.json implies ", shape_str(shape));
      return it->second;
    }
    void* alloc(uint64_t bytes) {
      const uint64_t at = used;
      used += align_up(bytes);
      if (!base) return nullptr;
      STRATA_ASSERT(used <= im.converted.bytes(), "converted weights overflow");
      return im.converted.as<uint8_t>() + at;
    }
    const void* gemm_w(const std::string& name, const Shape& shape) {
      const LayerBlob::Item& it = item(name, shape);
      const int64_t n = shape_numel(shape);
      if (it.dtype == DType::kF8E4M3) {  // an FP8-block source, decompressed as on the CPU
        const std::string sname = name + "_scale_inv";
        auto sc = blob.items.find(sname);
        STRATA_CHECK(sc != blob.items.end(), im.ckpt.dir(), ": '", name, "' is F8_E4M3 without '",
                     sname, "'");
        const Shape want{(shape[0] + kFp8Block - 1) / kFp8Block,
                         (shape[1] + kFp8Block - 1) / kFp8Block};
        STRATA_CHECK(sc->second.shape == want, im.ckpt.dir(), ": '", sname, "' has shape ",
                     shape_str(sc->second.shape), "; 128x128 blocks of ", shape_str(shape),
                     " need ", shape_str(want));
        void* dst = alloc(static_cast<uint64_t>(n) * static_cast<uint64_t>(im.esz()));
        if (!base) return nullptr;
        dequant_fp8_block(base + it.offset, shape[0], shape[1], kFp8Block, base + sc->second.offset,
                          sc->second.dtype, dst, im.opt.gemm_bf16, im.stream.handle());
        return dst;
      }
      const bool as_is = im.opt.gemm_bf16 ? it.dtype == DType::kBF16 : it.dtype == DType::kF32;
      if (as_is && it.offset % 16 == 0) return base ? base + it.offset : nullptr;
      void* dst = alloc(static_cast<uint64_t>(n) * static_cast<uint64_t>(im.esz()));
      if (!base) return nullptr;
      if (im.opt.gemm_bf16) {
        convert_to_bf16(base + it.offset, it.dtype, static_cast<uint16_t*>(dst), n,
                        im.stream.handle());
      } else {
        convert_to_f32(base + it.offset, it.dtype, static_cast<float*>(dst), n, im.stream.handle());
      }
      return dst;
    }
    const float* f32_w(const std::string& name, const Shape& shape) {
      const LayerBlob::Item& it = item(name, shape);
      const int64_t n = shape_numel(shape);
      if (it.dtype == DType::kF32 && it.offset % 16 == 0)
        return base ? reinterpret_cast<const float*>(base + it.offset) : nullptr;
      void* dst = alloc(static_cast<uint64_t>(n) * 4);
      if (!base) return nullptr;
      convert_to_f32(base + it.offset, it.dtype, static_cast<float*>(dst), n, im.stream.handle());
      return static_cast<const float*>(dst);
    }
    bool has(const std::string& name) const { return blob.items.count(name) > 0; }
  };

  int add_slot(std::vector<std::string> names) {
    slot_names.push_back(std::move(names));
    slot_rows.push_back(0);
    return static_cast<int>(slot_names.size()) - 1;
  }

  // MLA's attention weights under the attention prefix `a` (mp's sizes).
  void bind_mla(Binder& b, const std::string& a) {
    const int64_t dq = mp.dn + mp.dr;
    if (mp.q_rank > 0) {
      wqa = b.gemm_w(a + "q_a_proj.weight", {mp.q_rank, H});
      q_a_norm = b.f32_w(a + "q_a_layernorm.weight", {mp.q_rank});
      wqb = b.gemm_w(a + "q_b_proj.weight", {nH * dq, mp.q_rank});
    } else {
      wq = b.gemm_w(a + "q_proj.weight", {nH * dq, H});
    }
    wkva = b.gemm_w(a + "kv_a_proj_with_mqa.weight", {mp.kv_rank + mp.dr, H});
    kv_a_norm = b.f32_w(a + "kv_a_layernorm.weight", {mp.kv_rank});
    wkvb = b.gemm_w(a + "kv_b_proj.weight", {nH * (mp.dn + mp.dv), mp.kv_rank});
    wo = b.gemm_w(a + "o_proj.weight", {H, nH * mp.dv});
  }

  // A SwiGLU MLP's three weights under prefix p.
  Swiglu bind_swiglu(Binder& b, const std::string& p, int64_t inter, MlpLeaves n = {}) {
    Swiglu s;
    s.inter = inter;
    s.gate = b.gemm_w(p + n.gate + ".weight", {inter, H});
    s.up = b.gemm_w(p + n.up + ".weight", {inter, H});
    s.down = b.gemm_w(p + n.down + ".weight", {H, inter});
    return s;
  }

  // A Kimi-Linear KDA layer's weights under the attention prefix `a` (model/kimi_linear.cpp
  // KdaAttention).
  void bind_kda(Binder& b, const std::string& a) {
    const int64_t nh = kda.n_heads, dk = kda.head_dim, D = nh * dk, Kc = kda.conv_kernel;
    kw.wq = b.gemm_w(a + "q_proj.weight", {D, H});
    kw.wk = b.gemm_w(a + "k_proj.weight", {D, H});
    kw.wv = b.gemm_w(a + "v_proj.weight", {D, H});
    kw.wo = b.gemm_w(a + "o_proj.weight", {H, D});
    kw.conv_q = b.f32_w(a + "q_conv1d.weight", {D, 1, Kc});
    kw.conv_k = b.f32_w(a + "k_conv1d.weight", {D, 1, Kc});
    kw.conv_v = b.f32_w(a + "v_conv1d.weight", {D, 1, Kc});
    kw.wfa = b.gemm_w(a + "f_a_proj.weight", {dk, H});
    kw.wfb = b.gemm_w(a + "f_b_proj.weight", {D, dk});
    kw.wga = b.gemm_w(a + "g_a_proj.weight", {dk, H});
    kw.wgb = b.gemm_w(a + "g_b_proj.weight", {D, dk});
    kw.wb = b.gemm_w(a + "b_proj.weight", {nh, H});
    kw.a_log = b.f32_w(a + "A_log", {1, 1, nh, 1});
    kw.dt_bias = b.f32_w(a + "dt_bias", {D});
    kw.o_norm = b.f32_w(a + "o_norm.weight", {dk});
  }

  // Binds (or, with base null, sizes) layer l's weights; returns converted bytes. The mixer is
  // GQA, MLA (DeepSeek; NoPE for Kimi-Linear) or KDA (Kimi-Linear's linear-attention layers);
  // the MLP dense or MoE. Kimi-Linear keeps its MoE under block_sparse_moe. with the routed
  // experts' projections named w1/w3/w2, and its dense MLP where model/kimi_linear.h finds it.
  uint64_t bind(int64_t l, const LayerBlob& blob, const uint8_t* base) {
    Binder b{*this, blob, base};
    const std::string p = lp(l), a = p + "self_attn.";
    in_norm = b.f32_w(p + "input_layernorm.weight", {H});
    post_norm = b.f32_w(p + "post_attention_layernorm.weight", {H});
    bq = bk = bv = qn = kn = nullptr;
    wq = wk = wv = wo = wqa = wqb = wkva = wkvb = nullptr;
    q_a_norm = kv_a_norm = router_bias = nullptr;
    kw = KdaWeights{};
    kda_layer = kimi && layer_is_linear_attention(arch, c, l);
    if (kda_layer) {
      bind_kda(b, a);
    } else if (mla) {
      bind_mla(b, a);
    } else {
      wq = b.gemm_w(a + "q_proj.weight", {qd, H});
      wk = b.gemm_w(a + "k_proj.weight", {kd, H});
      wv = b.gemm_w(a + "v_proj.weight", {kd, H});
      wo = b.gemm_w(a + "o_proj.weight", {H, qd});
    }
    if (!mla && b.has(a + "q_proj.bias")) {
      bq = b.f32_w(a + "q_proj.bias", {qd});
      bk = b.f32_w(a + "k_proj.bias", {kd});
      bv = b.f32_w(a + "v_proj.bias", {kd});
    }
    if (!mla && b.has(a + "q_norm.weight")) {
      qn = b.f32_w(a + "q_norm.weight", {d});
      kn = b.f32_w(a + "k_norm.weight", {d});
    }
    moe = E > 0 && layer_is_moe(arch, c, l);
    std::string m = p + "mlp.";
    if (kimi) m = moe ? p + "block_sparse_moe." : model::kimi_linear_dense_prefix(ckpt, p);
    const MlpLeaves expert_leaves = kimi ? MlpLeaves{"w1", "w3", "w2"} : MlpLeaves{};
    experts.clear();
    shared = Swiglu{};
    router = shared_gate = nullptr;
    if (!moe) {
      dense = bind_swiglu(b, m, c.intermediate_size);
    } else {
      router = b.f32_w(m + "gate.weight", {E, H});
      if (mla && b.has(m + "gate.e_score_correction_bias"))
        router_bias = b.f32_w(m + "gate.e_score_correction_bias", {E});
      for (int64_t e = 0; e < E; ++e)
        experts.push_back(
            bind_swiglu(b, m + "experts." + std::to_string(e) + ".", Im, expert_leaves));
      if (mla && smoe.n_shared > 0) {
        shared = bind_swiglu(b, m + "shared_experts.", Im * smoe.n_shared);
      } else if (b.has(m + "shared_expert.gate_proj.weight")) {
        const int64_t is = blob.items.at(m + "shared_expert.gate_proj.weight").shape[0];
        shared = bind_swiglu(b, m + "shared_expert.", is);
        shared_gate = b.f32_w(m + "shared_expert_gate.weight", {1, H});
      }
    }
    if (base) {  // observers of this layer, under the CPU path's hub names
      slot_names.clear();
      slot_rows.clear();
      slot_k = slot_v = slot_qb = slot_fb = slot_gb = -1;
      if (kda_layer) {  // no KV cache
        slot_qkv = add_slot({a + "q_proj", a + "k_proj", a + "v_proj", a + "f_a_proj", a + "b_proj",
                             a + "g_a_proj"});
        slot_fb = add_slot({a + "f_b_proj"});
        slot_gb = add_slot({a + "g_b_proj"});
      } else {
        if (mla) {
          slot_qkv =
              add_slot({a + (mp.q_rank > 0 ? "q_a_proj" : "q_proj"), a + "kv_a_proj_with_mqa"});
          slot_qb = mp.q_rank > 0 ? add_slot({a + "q_b_proj"}) : -1;
          slot_kvb = add_slot({a + "kv_b_proj"});
        } else {
          slot_qkv = add_slot({a + "q_proj", a + "k_proj", a + "v_proj"});
        }
        slot_k = add_slot({a + "k_cache"});
        slot_v = add_slot({a + "v_cache"});
      }
      slot_o = add_slot({a + "o_proj"});
      auto mlp_slots = [&](Swiglu& s, const std::string& q, const MlpLeaves& n) {
        s.gu_slot = add_slot({q + n.gate, q + n.up});
        s.down_slot = add_slot({q + n.down});
      };
      if (!moe) {
        mlp_slots(dense, m, {});
      } else {
        expert_gu0 = static_cast<int>(slot_names.size());
        for (int64_t e = 0; e < E; ++e) {
          const std::string q = m + "experts." + std::to_string(e) + ".";
          experts[e].gu_slot = add_slot({q + expert_leaves.gate, q + expert_leaves.up});
        }
        expert_dn0 = static_cast<int>(slot_names.size());
        for (int64_t e = 0; e < E; ++e) {
          const std::string q = m + "experts." + std::to_string(e) + ".";
          experts[e].down_slot = add_slot({q + expert_leaves.down});
        }
        if (shared.gate) mlp_slots(shared, m + (mla ? "shared_experts." : "shared_expert."), {});
      }
      STRATA_ASSERT(slot_names.size() * 4 <= slots_dev.bytes(), "amax slots");
      stream.zero(slots_dev.data(), slots_dev.bytes());
    }
    return b.used;
  }

  // ---- scratch -------------------------------------------------------------------------------
  uint64_t per_token() const {
    int64_t cast = std::max({H, qd, c.intermediate_size, Im, Is});
    int64_t attn = 2 * qd + 2 * kd + cast / 2 + 1;
    if (mla) {
      const int64_t dq = mp.dn + mp.dr;
      cast = std::max({cast, mp.q_rank, mp.kv_rank, nH * mp.dv});
      // q, cq, c|kr, c, kr, kv, k, v, attention output, one bf16 GEMM input
      attn = nH * dq + mp.q_rank + 2 * (mp.kv_rank + mp.dr) + nH * (mp.dn + mp.dv) + nH * dq +
             2 * nH * mp.dv + cast / 2 + 1;
    }
    if (kimi) attn = std::max(attn, kda_per_token());
    const int64_t dense_mlp = 2 * c.intermediate_size + cast / 2 + 1;
    int64_t moe_ffn = 0;
    if (E > 0)  // moe_block: routing, og/g/u, then the bf16 copies (or the shared expert)
      moe_ffn = E + 4 * K + K * (H + 2 * Im) +
                std::max((H + K * std::max(H, Im)) / 2 + 2,
                         Is > 0 ? 2 * Is + H + 1 + std::max(H, Is) / 2 + 1 : 0);
    return 4ull * static_cast<uint64_t>(2 * H + std::max({attn, dense_mlp, moe_ffn}));
  }

  // A KDA layer's scratch per token in floats (kda_block): q, k, v, the forget gate g, the
  // recurrence's output o and one projection / output gate buffer (6 D); f_a and g_a's outputs
  // (2 d); beta (nH); one bf16 GEMM input (the normed input or o, max(H, D) / 2 + 1); 1 spare.
  int64_t kda_per_token() const {
    const int64_t D = kda.n_heads * kda.head_dim;
    return 6 * D + 2 * kda.head_dim + kda.n_heads + 1 + std::max(H, D) / 2 + 1;
  }

  template <typename T>
  T* take(int64_t n) {
    const uint64_t at = arena_at;
    arena_at += align_up(static_cast<uint64_t>(n) * sizeof(T));
    STRATA_ASSERT(arena_at <= scratch.bytes(), "GPU scratch overflow");
    return reinterpret_cast<T*>(scratch.as<uint8_t>() + at);
  }
  // The GEMM input for a[count] fp32: a itself (fp32 GEMMs) or its bf16 copy.
  const void* gin(const float* a, int64_t count) {
    if (!opt.gemm_bf16) return a;
    uint16_t* h = take<uint16_t>(count);
    cast_bf16(a, h, count, stream.handle());
    return h;
  }
  uint32_t* slot(int s) { return slots_dev.as<uint32_t>() + s; }

  // ---- the layer -----------------------------------------------------------------------------
  void attention_block(const GpuChunk& ch, const float* n, float* y) {
    void* s = stream.handle();
    const int64_t T = ch.tokens;
    amax(n, T * H, slot(slot_qkv), s);
    slot_rows[slot_qkv] += T;
    float* q = take<float>(T * qd);
    float* k = take<float>(T * kd);
    float* v = take<float>(T * kd);
    float* att = take<float>(T * qd);
    const uint64_t mark = arena_at;
    const void* xin = gin(n, T * H);
    mm(xin, wq, q, T, qd, H, opt.gemm_bf16);
    mm(xin, wk, k, T, kd, H, opt.gemm_bf16);
    mm(xin, wv, v, T, kd, H, opt.gemm_bf16);
    arena_at = mark;
    if (bq) {
      add_bias(q, T, qd, bq, s);
      add_bias(k, T, kd, bk, s);
      add_bias(v, T, kd, bv, s);
    }
    if (qn) {
      rms_norm(q, T * nH, d, qn, eps, q, s);
      rms_norm(k, T * nKV, d, kn, eps, k, s);
    }
    const float* f = inv_freq.as<float>();
    gpu::rope(q, T, nH, d, 0, d, ch.positions, f, rope_af(), false, s);
    gpu::rope(k, T, nKV, d, 0, d, ch.positions, f, rope_af(), false, s);
    amax(k, T * kd, slot(slot_k), s);
    amax(v, T * kd, slot(slot_v), s);
    slot_rows[slot_k] += T;
    slot_rows[slot_v] += T;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    span(kAttention);
    if (seqs_per_call > 0) {
      attention_gemm(ch, {q, qd, k, kd, v, kd, att, qd, d, d, nH / nKV}, scale);
    } else {
      attention(q, qd, k, kd, v, kd, T, nH, nKV, d, d, scale, ch.seq_start, att, s);
    }
    span(kAttentionCore);
    amax(att, T * qd, slot(slot_o), s);
    slot_rows[slot_o] += T;
    mm(gin(att, T * qd), wo, y, T, H, qd, opt.gemm_bf16);
  }
  double rope_af() const { return rope_p.attention_factor; }

  // Attention operands: per token, nH query heads of dq values (row stride qs), kv heads of dq /
  // dv values (strides ks, vs; query head h reads kv head h / group), outputs nH x dv (stride os).
  struct AttnArgs {
    const float* q;
    int64_t qs;
    const float* k;
    int64_t ks;
    const float* v;
    int64_t vs;
    float* out;
    int64_t os, dq, dv, group;
  };
  // Sequences of equal length, up to seqs_per_call at a time: one batched GEMM for the scores of
  // every (sequence, head), the causal softmax, one batched GEMM for the outputs.
  void attention_gemm(const GpuChunk& ch, const AttnArgs& A, float scale) {
    void* s = stream.handle();
    const int64_t n_seqs = static_cast<int64_t>(ch.seq_bounds.size()) - 1;
    const int64_t group = A.group;
    std::vector<bool> done(static_cast<size_t>(n_seqs), false);
    const int64_t cap = seqs_per_call * nH;
    for (int64_t first = 0; first < n_seqs; ++first) {
      if (done[first]) continue;
      const int64_t L = ch.seq_bounds[first + 1] - ch.seq_bounds[first];
      std::vector<int64_t> members;
      for (int64_t i = first; i < n_seqs && static_cast<int64_t>(members.size()) < seqs_per_call;
           ++i) {
        if (done[i] || ch.seq_bounds[i + 1] - ch.seq_bounds[i] != L) continue;
        members.push_back(i);
        done[i] = true;
      }
      if (L == 0) continue;
      STRATA_ASSERT(L <= longest, "sequence of ", L, " tokens, attention sized for ", longest);
      const int64_t batch = static_cast<int64_t>(members.size()) * nH;
      float* S = scores.as<float>();
      const int64_t slot = ptr_next++ % kPtrSlots;
      if (ptr_next > kPtrSlots) ptr_done[slot]->synchronize();  // its last call has run
      const void** host = reinterpret_cast<const void**>(host_att_ptrs.data()) + slot * 5 * cap;
      const float* const* dev = ptrs.as<const float*>() + slot * 5 * cap;
      int64_t idx = 0;
      for (int64_t m : members) {
        const int64_t b = ch.seq_bounds[m];
        for (int64_t h = 0; h < nH; ++h, ++idx) {
          const int64_t g = h / group;
          host[0 * cap + idx] = A.q + b * A.qs + h * A.dq;
          host[1 * cap + idx] = A.k + b * A.ks + g * A.dq;
          host[2 * cap + idx] = S + idx * L * L;
          host[3 * cap + idx] = A.v + b * A.vs + g * A.dv;
          host[4 * cap + idx] = A.out + b * A.os + h * A.dv;
        }
      }
      stream.copy_to_device(const_cast<const float**>(dev), host,
                            static_cast<uint64_t>(5 * cap) * sizeof(void*));
      auto arr = [&](int i) { return dev + i * cap; };
      gemm_batched_qk(blas, arr(0), A.qs, arr(1), A.ks, const_cast<float* const*>(arr(2)), L, A.dq,
                      batch, opt.gemm_bf16);
      causal_softmax(S, batch, L, scale, s);
      gemm_batched_pv(blas, arr(2), arr(3), A.vs, const_cast<float* const*>(arr(4)), A.os, L, A.dv,
                      batch, opt.gemm_bf16);
      ptr_done[slot]->record(stream);
    }
  }

  // MLA (model/deepseek_v3.h MlaAttention::forward, the same observers).
  void mla_block(const GpuChunk& ch, const float* n, float* y) {
    void* s = stream.handle();
    const int64_t T = ch.tokens, dq = mp.dn + mp.dr, dkv = mp.kv_rank + mp.dr;
    amax(n, T * H, slot(slot_qkv), s);
    slot_rows[slot_qkv] += T;
    float* q = take<float>(T * nH * dq);                           // [T, nH, dn + dr]
    float* ckr = take<float>(T * dkv);                             // [T, r_kv + dr]
    float* kv = take<float>(T * nH * (mp.dn + mp.dv));             // [T, nH, dn + dv]
    float* k = take<float>(T * nH * dq);                           // [T, nH, dn + dr]
    float* v = take<float>(T * nH * mp.dv);                        // [T, nH, dv]
    float* att = take<float>(T * nH * mp.dv);                      // [T, nH, dv]
    float* cq = take<float>(T * std::max<int64_t>(mp.q_rank, 1));  // [T, r_q]
    float* c = take<float>(T * mp.kv_rank);                        // [T, r_kv]
    float* kr = take<float>(T * mp.dr);                            // [T, dr]
    uint64_t mark = arena_at;
    const void* xin = gin(n, T * H);
    if (mp.q_rank > 0) {
      mm(xin, wqa, cq, T, mp.q_rank, H, opt.gemm_bf16);
    } else {
      mm(xin, wq, q, T, nH * dq, H, opt.gemm_bf16);
    }
    mm(xin, wkva, ckr, T, dkv, H, opt.gemm_bf16);
    arena_at = mark;
    if (mp.q_rank > 0) {
      rms_norm(cq, T, mp.q_rank, q_a_norm, 1e-6f, cq, s);
      amax(cq, T * mp.q_rank, slot(slot_qb), s);
      slot_rows[slot_qb] += T;
      mm(gin(cq, T * mp.q_rank), wqb, q, T, nH * dq, mp.q_rank, opt.gemm_bf16);
      arena_at = mark;
    }
    copy_cols(ckr, dkv, c, mp.kv_rank, T, mp.kv_rank, s);
    copy_cols(ckr + mp.kv_rank, dkv, kr, mp.dr, T, mp.dr, s);
    rms_norm(c, T, mp.kv_rank, kv_a_norm, 1e-6f, c, s);
    amax(c, T * mp.kv_rank, slot(slot_kvb), s);
    slot_rows[slot_kvb] += T;
    mm(gin(c, T * mp.kv_rank), wkvb, kv, T, nH * (mp.dn + mp.dv), mp.kv_rank, opt.gemm_bf16);
    arena_at = mark;
    if (!mp.nope) {
      const float* f = inv_freq.as<float>();
      gpu::rope(q, T, nH, dq, mp.dn, mp.dr, ch.positions, f, mp.attention_factor, mp.interleaved,
                s);
      gpu::rope(kr, T, 1, mp.dr, 0, mp.dr, ch.positions, f, mp.attention_factor, mp.interleaved, s);
    }
    mla_kv(kv, kr, T, nH, mp.dn, mp.dr, mp.dv, k, v, s);
    amax(k, T * nH * dq, slot(slot_k), s);
    amax(v, T * nH * mp.dv, slot(slot_v), s);
    slot_rows[slot_k] += T;
    slot_rows[slot_v] += T;
    span(kAttention);
    if (seqs_per_call > 0) {
      attention_gemm(ch, {q, nH * dq, k, nH * dq, v, nH * mp.dv, att, nH * mp.dv, dq, mp.dv, 1},
                     mp.scale);
    } else {
      attention(q, nH * dq, k, nH * dq, v, nH * mp.dv, T, nH, nH, dq, mp.dv, mp.scale, ch.seq_start,
                att, s);
    }
    span(kAttentionCore);
    amax(att, T * nH * mp.dv, slot(slot_o), s);
    slot_rows[slot_o] += T;
    mm(gin(att, T * nH * mp.dv), wo, y, T, H, nH * mp.dv, opt.gemm_bf16);
  }

  // Kimi Delta Attention (model/kimi_linear.cpp KdaAttention::forward, the same observers).
  void kda_block(const GpuChunk& ch, const float* n, float* y) {
    void* s = stream.handle();
    const int64_t T = ch.tokens, nh = kda.n_heads, dk = kda.head_dim, D = nh * dk;
    const int64_t n_seqs = static_cast<int64_t>(ch.seq_bounds.size()) - 1;
    amax(n, T * H, slot(slot_qkv), s);
    slot_rows[slot_qkv] += T;
    float* q = take<float>(T * D);      // [T, nH, d] after the conv, the L2 norm and the scale
    float* k = take<float>(T * D);      // [T, nH, d]
    float* v = take<float>(T * D);      // [T, nH, d]
    float* g = take<float>(T * D);      // [T, nH, d] the log decay
    float* o = take<float>(T * D);      // [T, nH, d] the recurrence's output, then gated
    float* raw = take<float>(T * D);    // [T, D] a projection before its conv; the output gate
    float* fa = take<float>(T * dk);    // [T, d]
    float* ga = take<float>(T * dk);    // [T, d]
    float* beta = take<float>(T * nh);  // [T, nH]
    const uint64_t mark = arena_at;
    const void* xin = gin(n, T * H);
    // q, k, v: projection, causal depthwise conv restarting at each sequence start, SiLU.
    mm(xin, kw.wq, raw, T, D, H, opt.gemm_bf16);
    kda_conv_silu(raw, T, D, kw.conv_q, kda.conv_kernel, ch.seq_start, q, s);
    mm(xin, kw.wk, raw, T, D, H, opt.gemm_bf16);
    kda_conv_silu(raw, T, D, kw.conv_k, kda.conv_kernel, ch.seq_start, k, s);
    mm(xin, kw.wv, raw, T, D, H, opt.gemm_bf16);
    kda_conv_silu(raw, T, D, kw.conv_v, kda.conv_kernel, ch.seq_start, v, s);
    mm(xin, kw.wfa, fa, T, dk, H, opt.gemm_bf16);
    mm(xin, kw.wga, ga, T, dk, H, opt.gemm_bf16);
    mm(xin, kw.wb, beta, T, nh, H, opt.gemm_bf16);
    arena_at = mark;
    l2_norm_scale(q, T * nh, dk, 1e-6f, 1.0f / std::sqrt(static_cast<float>(dk)), s);
    l2_norm_scale(k, T * nh, dk, 1e-6f, 1.0f, s);
    // Forget gate g = -exp(A_log) softplus(f_b_proj(f_a_proj n) + dt_bias); beta = sigmoid(b).
    amax(fa, T * dk, slot(slot_fb), s);
    slot_rows[slot_fb] += T;
    mm(gin(fa, T * dk), kw.wfb, g, T, D, dk, opt.gemm_bf16);
    arena_at = mark;
    kda_forget_gate(g, T, nh, dk, kw.a_log, kw.dt_bias, s);
    sigmoid_inplace(beta, T * nh, s);
    span(kAttention);
    gated_delta_rule(q, k, v, g, beta, ch.seq_bounds_dev, n_seqs, nh, dk, dk, o, s);
    span(kAttentionCore);
    // Output: RMSNorm per head (o_norm shared by the heads) times sigmoid(g_b_proj(g_a_proj n)).
    amax(ga, T * dk, slot(slot_gb), s);
    slot_rows[slot_gb] += T;
    mm(gin(ga, T * dk), kw.wgb, raw, T, D, dk, opt.gemm_bf16);
    arena_at = mark;
    rms_norm(o, T * nh, dk, kw.o_norm, eps, o, s);
    mul_sigmoid(o, raw, T * D, s);
    amax(o, T * D, slot(slot_o), s);
    slot_rows[slot_o] += T;
    mm(gin(o, T * D), kw.wo, y, T, H, D, opt.gemm_bf16);
  }

  void swiglu_block(const Swiglu& w, const float* n, int64_t T, float* y) {
    void* s = stream.handle();
    amax(n, T * H, slot(w.gu_slot), s);
    slot_rows[w.gu_slot] += T;
    float* g = take<float>(T * w.inter);
    float* u = take<float>(T * w.inter);
    const uint64_t mark = arena_at;
    const void* xin = gin(n, T * H);
    mm(xin, w.gate, g, T, w.inter, H, opt.gemm_bf16);
    mm(xin, w.up, u, T, w.inter, H, opt.gemm_bf16);
    arena_at = mark;
    swiglu(g, u, T * w.inter, g, s);
    amax(g, T * w.inter, slot(w.down_slot), s);
    slot_rows[w.down_slot] += T;
    mm(gin(g, T * w.inter), w.down, y, T, H, w.inter, opt.gemm_bf16);
  }

  void moe_block(const float* n, int64_t T, float* y) {
    void* s = stream.handle();
    const int64_t S = T * K;
    float* logits = take<float>(T * E);
    float* weight = take<float>(S);
    int32_t* chosen = take<int32_t>(S);
    int32_t* pos = take<int32_t>(S);
    int32_t* row_expert = take<int32_t>(S);
    int32_t* counts = moe_ints.as<int32_t>();
    int32_t* offsets = counts + E;
    int32_t* cursor = counts + 2 * E;
    mm(n, router, logits, T, E, H, false);
    stream.zero(counts, static_cast<uint64_t>(E) * 4);
    if (mla) {
      route_sigmoid_grouped(logits, T, E, K, router_bias, smoe.n_group, smoe.topk_group,
                            smoe.renormalize, smoe.routed_scaling, chosen, weight, counts, s);
    } else {
      route_softmax_topk(logits, T, E, K, c.norm_topk_prob, chosen, weight, counts, s);
    }
    int32_t* hc = reinterpret_cast<int32_t*>(host_ints.data());
    stream.copy_to_host(hc, counts, static_cast<uint64_t>(E) * 4);
    stream.synchronize();
    int32_t* ho = hc + E;
    int32_t at = 0;
    for (int64_t e = 0; e < E; ++e) {
      ho[e] = at;
      at += hc[e];
      slot_rows[experts[e].gu_slot] += hc[e];
      slot_rows[experts[e].down_slot] += hc[e];
    }
    STRATA_ASSERT(at == S, "routing counts");
    stream.copy_to_device(offsets, ho, static_cast<uint64_t>(E) * 4);
    stream.zero(cursor, static_cast<uint64_t>(E) * 4);
    moe_scatter(chosen, S, offsets, cursor, pos, row_expert, s);
    span(kRouter);
    // The rows an expert sees are its tokens' n: each token's amax goes to its K experts' slots.
    amax_rows(n, T, H, chosen, slot(expert_gu0), s, K);
    float* og = take<float>(S * H);  // [S, H] the experts' outputs, rows grouped by expert
    float* g = take<float>(S * Im);  // [S, Im]
    float* u = take<float>(S * Im);  // [S, Im]
    const uint64_t mark = arena_at;
    // The GEMM inputs [S, H], rows grouped by expert: gathered in bf16 from n's bf16 copy (the
    // same bits as gathering, then rounding), or for fp32 GEMMs in fp32 into og, which the down
    // GEMMs overwrite once gate/up have read them.
    const uint8_t* xin = nullptr;
    if (opt.gemm_bf16) {
      uint16_t* n16 = take<uint16_t>(T * H);
      uint16_t* x16 = take<uint16_t>(S * H);
      cast_bf16(n, n16, T * H, s);
      moe_gather(n16, T, H, K, pos, x16, s);
      xin = reinterpret_cast<const uint8_t*>(x16);
    } else {
      moe_gather(n, T, H, K, pos, og, s);
      xin = reinterpret_cast<const uint8_t*>(og);
    }
    span(kExpertOther);
    jobs.clear();
    for (int64_t e = 0; e < E; ++e) {
      if (hc[e] == 0) continue;
      const uint8_t* xe = xin + static_cast<int64_t>(ho[e]) * H * esz();
      jobs.push_back({xe, experts[e].gate, g + static_cast<int64_t>(ho[e]) * Im, hc[e], Im, H});
      jobs.push_back({xe, experts[e].up, u + static_cast<int64_t>(ho[e]) * Im, hc[e], Im, H});
    }
    run_jobs();
    span(kExpertGateUp);
    arena_at = mark;
    swiglu(g, u, S * Im, g, s);
    amax_rows(g, S, Im, row_expert, slot(expert_dn0), s);
    const uint8_t* hin = static_cast<const uint8_t*>(gin(g, S * Im));
    span(kExpertOther);
    jobs.clear();
    for (int64_t e = 0; e < E; ++e) {
      if (hc[e] == 0) continue;
      jobs.push_back({hin + static_cast<int64_t>(ho[e]) * Im * esz(), experts[e].down,
                      og + static_cast<int64_t>(ho[e]) * H, hc[e], H, Im});
    }
    run_jobs();
    span(kExpertDown);
    arena_at = mark;
    moe_combine(og, pos, weight, T, K, H, y, s);
    if (shared.gate) {
      float* sy = take<float>(T * H);
      float* sg = take<float>(T);
      const uint64_t m2 = arena_at;
      swiglu_block(shared, n, T, sy);
      arena_at = m2;
      if (shared_gate) {
        mm(n, shared_gate, sg, T, 1, H, false);
        add_sigmoid_gated(y, sy, sg, T, H, s);
      } else {  // DeepSeek's shared experts: added as they are
        add(y, sy, T * H, s);
      }
    }
    span(kCombine);
  }

  void forward(const GpuChunk& ch, float* x, bool round) {
    STRATA_ASSERT(layer >= 0 && ch.tokens <= max_tokens, "GPU forward: chunk of ", ch.tokens,
                  " tokens, reserved ", max_tokens);
    void* s = stream.handle();
    const int64_t T = ch.tokens;
    arena_at = 0;
    float* n = take<float>(T * H);
    float* y = take<float>(T * H);
    const uint64_t top = arena_at;
    ++prof.forwards;
    span(-1);
    rms_norm(x, T, H, in_norm, eps, n, s);
    span(kNorms);
    if (kda_layer) {
      kda_block(ch, n, y);
    } else if (mla) {
      mla_block(ch, n, y);
    } else {
      attention_block(ch, n, y);
    }
    span(kAttention);
    add(x, y, T * H, s);
    arena_at = top;
    rms_norm(x, T, H, post_norm, eps, n, s);
    span(kNorms);
    if (moe) {
      moe_block(n, T, y);
    } else {
      swiglu_block(dense, n, T, y);
      span(kDenseMlp);
    }
    add(x, y, T * H, s);
    if (round) round_bf16(x, T * H, s);
    span(kNorms);
  }
};

std::string GpuForward::unsupported(const ModelConfig& config, const Checkpoint& ckpt) {
  const ArchInfo arch = resolve_arch(config);
  if (arch.family != ArchFamily::kLlama && arch.family != ArchFamily::kQwenMoe &&
      arch.family != ArchFamily::kDeepseekV3 && arch.family != ArchFamily::kKimiLinear)
    return str(
        "the GPU forward implements the llama, qwen_moe, deepseek_v3 and kimi_linear "
        "families, not ",
        arch_family_name(arch.family));
  if (arch.family == ArchFamily::kKimiLinear) {
    const model::KdaShape kda = model::kda_shape(config);
    if (kda.head_dim > 256)  // gated_delta_rule keeps a state column in registers
      return str("linear_head_dim ", kda.head_dim, " exceeds 256");
  }
  const bool kimi = arch.family == ArchFamily::kKimiLinear;
  if (arch.family == ArchFamily::kDeepseekV3 || kimi) {
    if (config.v_head_dim > 256) return str("v_head_dim ", config.v_head_dim, " exceeds 256");
    if (config.num_experts > 0) {
      const model::SigmoidMoeConfig m =
          kimi ? model::kimi_linear_moe_config(config) : model::deepseek_moe_config(config);
      if (m.top_k > 32) return str("num_experts_per_tok ", m.top_k, " exceeds 32");
      if (m.n_group > 64) return str("n_group ", m.n_group, " exceeds 64");
    }
  } else if (config.head_dim > 256) {
    return str("head_dim ", config.head_dim, " exceeds 256");
  }
  if (arch.family == ArchFamily::kQwenMoe && config.num_experts_per_tok > 32)
    return str("num_experts_per_tok ", config.num_experts_per_tok, " exceeds 32");
  for (const std::string& n : ckpt.tensor_names()) {
    if (n.find(".layers.") == std::string::npos) continue;
    const DType t = ckpt.entry(n).dtype;
    if (t == DType::kF32 || t == DType::kF16 || t == DType::kBF16) continue;
    // DeepSeek FP8 blocks: decompressed on the device (dequant_fp8_block).
    const std::string m = n.ends_with(".weight") ? n.substr(0, n.size() - 7) : "";
    if (t == DType::kF8E4M3 && !m.empty() && ckpt.has(m + ".weight_scale_inv")) continue;
    return str("tensor '", n, "' has dtype ", dtype_name(t),
               " (the GPU forward reads F32, F16 and BF16 weights, and DeepSeek FP8 blocks)");
  }
  return "";
}

GpuForward::GpuForward(const ModelConfig& config, const Checkpoint& ckpt, DeviceBudget& budget,
                       const Stream& stream, GpuForwardOptions options)
    : impl_(std::make_unique<Impl>(config, ckpt, budget, stream, options)) {}
GpuForward::~GpuForward() = default;

std::vector<std::string> GpuForward::layer_tensors(const ModelConfig& config,
                                                   const Checkpoint& ckpt, int64_t l) {
  const std::string p =
      model::find_prefixes(config, ckpt).model + "layers." + std::to_string(l) + ".";
  std::vector<std::string> out;
  for (const std::string& n : ckpt.tensor_names()) {
    if (n.starts_with(p)) out.push_back(n);
  }
  return out;
}

std::vector<std::string> GpuForward::layer_tensors(int64_t l) const {
  return layer_tensors(impl_->c, impl_->ckpt, l);
}

uint64_t GpuForward::bytes_per_token() const {
  return impl_->per_token();
}

uint64_t GpuForward::converted_bytes(int64_t l, const LayerBlob& blob) const {
  return impl_->bind(l, blob, nullptr);
}

uint64_t GpuForward::attention_bytes(int64_t longest, uint64_t cap) const {
  const Impl& im = *impl_;
  if (im.opt.warp_attention) return 0;
  const uint64_t one = static_cast<uint64_t>(im.nH * longest * longest) * 4;
  if (one == 0 || one > cap) return 0;
  // Whole sequences, about 64 MiB of scores per call (at least one sequence).
  const uint64_t seqs = std::max<uint64_t>(1, (64ull << 20) / one);
  return seqs * one + Impl::kPtrSlots * seqs * static_cast<uint64_t>(im.nH) * 5 * sizeof(void*);
}

void GpuForward::reserve(int64_t tokens, int64_t longest, uint64_t attention_cap) {
  Impl& im = *impl_;
  const uint64_t att = attention_bytes(longest, attention_cap);
  if (att > 0 && longest > im.longest) {
    const uint64_t one = static_cast<uint64_t>(im.nH * longest * longest) * 4;
    im.seqs_per_call = std::max<int64_t>(1, static_cast<int64_t>((64ull << 20) / one));
    im.scores = DeviceBuffer();
    im.ptrs = DeviceBuffer();
    im.scores =
        DeviceBuffer(im.budget, static_cast<uint64_t>(im.seqs_per_call) * one, "attention scores");
    const uint64_t ptr_bytes =
        Impl::kPtrSlots * static_cast<uint64_t>(im.seqs_per_call * im.nH) * 5 * sizeof(void*);
    im.ptrs = DeviceBuffer(im.budget, ptr_bytes, "attention pointers");
    im.host_att_ptrs.reserve(ptr_bytes);
    while (im.ptr_done.size() < static_cast<size_t>(Impl::kPtrSlots))
      im.ptr_done.push_back(std::make_unique<Event>());
    im.ptr_next = 0;
    im.longest = longest;
  }
  if (tokens <= im.max_tokens) return;
  im.scratch = DeviceBuffer();
  im.scratch =
      DeviceBuffer(im.budget, im.per_token() * static_cast<uint64_t>(tokens) + (1ull << 20),
                   "the layer's working set");
  im.max_tokens = tokens;
}

void GpuForward::set_layer(int64_t l, const LayerBlob& blob, const void* weights) {
  Impl& im = *impl_;
  const uint64_t need = im.bind(l, blob, nullptr);
  if (need > im.converted.bytes()) {
    im.stream.synchronize();
    im.converted = DeviceBuffer();
    im.converted = DeviceBuffer(im.budget, need, "converted layer weights");
  }
  im.bind(l, blob, static_cast<const uint8_t*>(weights));
  im.layer = l;
}

void GpuForward::forward(const GpuChunk& chunk, float* x, bool round_bf16) {
  impl_->forward(chunk, x, round_bf16);
}

std::vector<AmaxStat> GpuForward::take_stats() {
  Impl& im = *impl_;
  std::vector<uint32_t> bits(im.slot_names.size());
  im.stream.copy_to_host(bits.data(), im.slots_dev.data(), bits.size() * 4);
  im.stream.synchronize();
  im.prof.collect();
  cuda_check_last("GPU forward");
  std::vector<AmaxStat> out;
  for (size_t i = 0; i < bits.size(); ++i) {
    float a;
    std::memcpy(&a, &bits[i], 4);
    for (const std::string& n : im.slot_names[i])
      out.push_back({n, a, im.slot_rows[i]});
    im.slot_rows[i] = 0;
  }
  im.stream.zero(im.slots_dev.data(), im.slots_dev.bytes());
  return out;
}

}  // namespace strata::gpu
