#include "io/fused_experts.h"

#include <string>
#include <vector>

#include "core/error.h"
#include "io/checkpoint.h"

namespace strata {

namespace {

constexpr std::string_view kGateUp = "experts.gate_up_proj";

bool is_float(DType d) {
  return d == DType::kBF16 || d == DType::kF16 || d == DType::kF32;
}

bool is_u8(DType d) {
  return d == DType::kU8 || d == DType::kF8E8M0;
}

// The per-expert name of expert e's leaf (gate_proj, up_proj, down_proj) tensor `suffix`.
std::string expert_name(const std::string& x, int64_t e, std::string_view leaf,
                        std::string_view suffix) {
  return x + std::to_string(e) + "." + std::string(leaf) + "." + std::string(suffix);
}

// One fused projection pair at X: the gate_up tensor's name, the down tensor's, and the suffix
// their per-expert views take.
struct Pair {
  std::string gate_up, down, suffix;
};

// Row-major bytes per step along dimension 0 and along dimension 1 of a tensor.
struct Strides {
  uint64_t expert = 0, row = 0;
};

Strides strides(const TensorEntry& t) {
  uint64_t row = static_cast<uint64_t>(dtype_bits(t.dtype)) / 8;
  for (size_t d = 2; d < t.shape.size(); ++d)
    row *= static_cast<uint64_t>(t.shape[d]);
  return {row * static_cast<uint64_t>(t.shape[1]), row};
}

// Views of one pair: gate_up [E, 2I, ...] split in halves, down [E, H, ...] per expert.
void add_pair_views(Checkpoint& ckpt, const std::string& x, const Pair& p) {
  const TensorEntry gu = ckpt.entry(p.gate_up);
  const TensorEntry dn = ckpt.entry(p.down);
  const int64_t E = gu.shape[0], I = gu.shape[1] / 2;
  const Strides g = strides(gu), d = strides(dn);
  Shape half = gu.shape, one = dn.shape;
  half.erase(half.begin());
  half[0] = I;
  one.erase(one.begin());
  for (int64_t e = 0; e < E; ++e) {
    const uint64_t ue = static_cast<uint64_t>(e);
    ckpt.add_view(expert_name(x, e, "gate_proj", p.suffix), p.gate_up, ue * g.expert, gu.dtype,
                  half);
    ckpt.add_view(expert_name(x, e, "up_proj", p.suffix), p.gate_up,
                  ue * g.expert + static_cast<uint64_t>(I) * g.row, gu.dtype, half);
    ckpt.add_view(expert_name(x, e, "down_proj", p.suffix), p.down, ue * d.expert, dn.dtype, one);
  }
}

// The pairs at X in the standard layout, empty when X is not one (see the header).
std::vector<Pair> standard_pairs(const Checkpoint& ckpt, const std::string& x) {
  if (ckpt.has(x + "gate_up_proj_bias") || !ckpt.has(x + "down_proj")) return {};
  const TensorEntry& gu = ckpt.entry(x + "gate_up_proj");
  const TensorEntry& dn = ckpt.entry(x + "down_proj");
  if (gu.shape.size() != 3 || dn.shape.size() != 3 || !is_float(gu.dtype) || dn.dtype != gu.dtype) {
    return {};
  }
  const int64_t E = gu.shape[0], I = gu.shape[1] / 2, H = gu.shape[2];
  if (E <= 0 || I <= 0 || gu.shape[1] != 2 * I || dn.shape != Shape{E, H, I}) return {};
  return {{x + "gate_up_proj", x + "down_proj", "weight"}};
}

// MXFP4: blocks [E, 2I, H/32, 16] and scales [E, 2I, H/32]; down blocks [E, H, I/32, 16].
std::vector<Pair> mxfp4_pairs(const Checkpoint& ckpt, const std::string& x) {
  const std::string gb = x + "gate_up_proj_blocks", gs = x + "gate_up_proj_scales";
  const std::string db = x + "down_proj_blocks", ds = x + "down_proj_scales";
  if (ckpt.has(x + "gate_up_proj_bias") || !ckpt.has(gs) || !ckpt.has(db) || !ckpt.has(ds))
    return {};
  const TensorEntry &b = ckpt.entry(gb), &s = ckpt.entry(gs);
  const TensorEntry &c = ckpt.entry(db), &t = ckpt.entry(ds);
  if (b.shape.size() != 4 || s.shape.size() != 3 || c.shape.size() != 4 || t.shape.size() != 3 ||
      b.dtype != DType::kU8 || c.dtype != DType::kU8 || !is_u8(s.dtype) || !is_u8(t.dtype)) {
    return {};
  }
  const int64_t E = b.shape[0], I = b.shape[1] / 2, G = b.shape[2], H = G * 32;
  if (E <= 0 || I <= 0 || I % 32 != 0 || b.shape != Shape{E, 2 * I, G, 16} ||
      s.shape != Shape{E, 2 * I, G} || c.shape != Shape{E, H, I / 32, 16} ||
      t.shape != Shape{E, H, I / 32}) {
    return {};
  }
  return {{gb, db, "weight_blocks"}, {gs, ds, "weight_scales"}};
}

}  // namespace

void split_fused_experts(Checkpoint& ckpt) {
  for (const std::string& name : ckpt.tensor_names()) {
    const bool plain = name.ends_with(kGateUp);
    const bool blocks = name.ends_with(std::string(kGateUp) + "_blocks");
    if (!plain && !blocks) continue;
    const std::string x = name.substr(0, name.rfind("gate_up_proj"));  // "<...>.experts."
    const std::vector<Pair> pairs = plain ? standard_pairs(ckpt, x) : mxfp4_pairs(ckpt, x);
    if (pairs.empty()) continue;
    const std::string per_expert = expert_name(x, 0, "gate_proj", pairs[0].suffix);
    STRATA_CHECK(!ckpt.has(per_expert), ckpt.dir(), ": the checkpoint holds both the fused '", name,
                 "' and the per-expert '", per_expert,
                 "'; it must store each expert's weights once");
    for (const Pair& p : pairs)
      add_pair_views(ckpt, x, p);
    for (const Pair& p : pairs) {
      ckpt.hide(p.gate_up);
      ckpt.hide(p.down);
    }
  }
}

}  // namespace strata
