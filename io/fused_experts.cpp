#include "io/fused_experts.h"

#include <string>
#include <tuple>
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

// A ModelOpt export of gpt-oss at X (see the header): per projection P of out x in per expert,
// NVFP4 P U8 [E, in/2, out] + P_weight_scale F8_E4M3 [E, in/16, out], or FP8 P F8_E4M3
// [E, in, out] + P_weight_scale F32 [], with the scalars P_weight_scale_2 (NVFP4) and
// P_input_scale (W4A4) shared by all experts. Served as a per-module export: X.{e}.P.weight and
// .weight_scale transposed views of [e], the scalars views of their one tensor. Appends the
// fused names to `fused`; false (nothing added) when a shape or dtype differs.
bool add_gpt_oss_modelopt_views(Checkpoint& ckpt, const std::string& x, int64_t E, int64_t I,
                                int64_t H, std::vector<std::string>& fused) {
  struct Proj {
    std::string leaf;
    int64_t out, in;
    bool nvfp4;
  };
  std::vector<Proj> projs = {{"gate_up_proj", 2 * I, H, false}, {"down_proj", H, I, false}};
  for (Proj& p : projs) {
    const std::string P = x + p.leaf;
    if (!ckpt.has(P)) return false;
    const TensorEntry w = ckpt.entry(P), s = ckpt.entry(P + "_weight_scale");
    p.nvfp4 = w.dtype == DType::kU8;
    const bool ok = p.nvfp4
                        ? p.in % 16 == 0 && w.shape == Shape{E, p.in / 2, p.out} &&
                              s.dtype == DType::kF8E4M3 && s.shape == Shape{E, p.in / 16, p.out} &&
                              ckpt.has(P + "_weight_scale_2")
                        : w.dtype == DType::kF8E4M3 && w.shape == Shape{E, p.in, p.out} &&
                              s.dtype == DType::kF32 && s.shape.empty();
    if (!ok) return false;
  }
  for (const Proj& p : projs) {
    const std::string P = x + p.leaf;
    const TensorEntry w = ckpt.entry(P), s = ckpt.entry(P + "_weight_scale");
    const Strides ws = strides(w), ss = p.nvfp4 ? strides(s) : Strides{};
    for (int64_t e = 0; e < E; ++e) {
      const uint64_t ue = static_cast<uint64_t>(e);
      ckpt.add_view(expert_name(x, e, p.leaf, "weight"), P, ue * ws.expert, w.dtype,
                    {p.out, p.nvfp4 ? p.in / 2 : p.in}, /*transposed=*/true);
      if (p.nvfp4) {
        ckpt.add_view(expert_name(x, e, p.leaf, "weight_scale"), P + "_weight_scale",
                      ue * ss.expert, s.dtype, {p.out, p.in / 16}, /*transposed=*/true);
      } else {
        ckpt.add_view(expert_name(x, e, p.leaf, "weight_scale"), P + "_weight_scale", 0, s.dtype,
                      {});
      }
      for (const char* scalar : {"weight_scale_2", "input_scale"}) {
        const std::string name = P + "_" + scalar;
        if (!ckpt.has(name)) continue;
        ckpt.add_view(expert_name(x, e, p.leaf, scalar), name, 0, ckpt.entry(name).dtype, {});
      }
    }
    fused.insert(fused.end(), {P, P + "_weight_scale"});
    for (const char* scalar : {"weight_scale_2", "input_scale"}) {
      if (ckpt.has(P + "_" + scalar)) fused.push_back(P + "_" + scalar);
    }
  }
  return true;
}

// gpt-oss at X (see the header); false when X is not in its layout (left fused).
bool add_gpt_oss_views(Checkpoint& ckpt, const std::string& x) {
  const std::string gb = x + "gate_up_proj_bias", db = x + "down_proj_bias";
  if (!ckpt.has(gb) || !ckpt.has(db)) return false;
  const TensorEntry gbias = ckpt.entry(gb), dbias = ckpt.entry(db);
  if (gbias.shape.size() != 2 || dbias.shape.size() != 2 || !is_float(gbias.dtype) ||
      dbias.dtype != gbias.dtype)
    return false;
  const int64_t E = gbias.shape[0], I = gbias.shape[1] / 2, H = dbias.shape[1];
  if (E <= 0 || I <= 0 || gbias.shape[1] != 2 * I || dbias.shape[0] != E) return false;
  std::vector<std::string> fused = {gb, db};
  if (ckpt.has(x + "gate_up_proj_weight_scale") && ckpt.has(x + "down_proj_weight_scale")) {
    if (!add_gpt_oss_modelopt_views(ckpt, x, E, I, H, fused)) return false;
  } else if (ckpt.has(x + "gate_up_proj") && ckpt.has(x + "down_proj")) {
    const TensorEntry gu = ckpt.entry(x + "gate_up_proj"), dn = ckpt.entry(x + "down_proj");
    if (gu.shape != Shape{E, H, 2 * I} || dn.shape != Shape{E, I, H} || !is_float(gu.dtype) ||
        dn.dtype != gu.dtype)
      return false;
    const Strides g = strides(gu), d = strides(dn);
    for (int64_t e = 0; e < E; ++e) {
      const uint64_t ue = static_cast<uint64_t>(e);
      ckpt.add_view(expert_name(x, e, "gate_up_proj", "weight"), x + "gate_up_proj", ue * g.expert,
                    gu.dtype, {2 * I, H}, /*transposed=*/true);
      ckpt.add_view(expert_name(x, e, "down_proj", "weight"), x + "down_proj", ue * d.expert,
                    dn.dtype, {H, I}, /*transposed=*/true);
    }
    fused.insert(fused.end(), {x + "gate_up_proj", x + "down_proj"});
  } else {
    const std::string b = x + "gate_up_proj_blocks", s = x + "gate_up_proj_scales";
    const std::string c = x + "down_proj_blocks", t = x + "down_proj_scales";
    if (!ckpt.has(b) || !ckpt.has(s) || !ckpt.has(c) || !ckpt.has(t)) return false;
    const TensorEntry eb = ckpt.entry(b), es = ckpt.entry(s), ec = ckpt.entry(c),
                      et = ckpt.entry(t);
    if (H % 32 != 0 || I % 32 != 0 || eb.shape != Shape{E, 2 * I, H / 32, 16} ||
        es.shape != Shape{E, 2 * I, H / 32} || ec.shape != Shape{E, H, I / 32, 16} ||
        et.shape != Shape{E, H, I / 32} || eb.dtype != DType::kU8 || ec.dtype != DType::kU8 ||
        !is_u8(es.dtype) || !is_u8(et.dtype))
      return false;
    for (const auto& [fused_name, leaf, suffix] :
         {std::tuple<std::string, const char*, const char*>{b, "gate_up_proj", "weight_blocks"},
          {s, "gate_up_proj", "weight_scales"},
          {c, "down_proj", "weight_blocks"},
          {t, "down_proj", "weight_scales"}}) {
      const TensorEntry f = ckpt.entry(fused_name);
      Shape one = f.shape;
      one.erase(one.begin());
      const Strides st = strides(f);
      for (int64_t e = 0; e < E; ++e)
        ckpt.add_view(expert_name(x, e, leaf, suffix), fused_name,
                      static_cast<uint64_t>(e) * st.expert, f.dtype, one);
      fused.push_back(fused_name);
    }
  }
  const Strides gs = strides(gbias), ds = strides(dbias);
  for (int64_t e = 0; e < E; ++e) {
    const uint64_t ue = static_cast<uint64_t>(e);
    ckpt.add_view(expert_name(x, e, "gate_up_proj", "bias"), gb, ue * gs.expert, gbias.dtype,
                  {2 * I});
    ckpt.add_view(expert_name(x, e, "down_proj", "bias"), db, ue * ds.expert, dbias.dtype, {H});
  }
  for (const std::string& f : fused)
    ckpt.hide(f);
  return true;
}

}  // namespace

void split_fused_experts(Checkpoint& ckpt) {
  for (const std::string& name : ckpt.tensor_names()) {
    const bool plain = name.ends_with(kGateUp);
    const bool blocks = name.ends_with(std::string(kGateUp) + "_blocks");
    if (!plain && !blocks) continue;
    const std::string x = name.substr(0, name.rfind("gate_up_proj"));  // "<...>.experts."
    if (ckpt.has(x + "gate_up_proj_bias")) {                           // gpt-oss
      const std::string per_expert = expert_name(x, 0, "gate_up_proj", "bias");
      STRATA_CHECK(!ckpt.has(per_expert), ckpt.dir(), ": the checkpoint holds both the fused '",
                   name, "' and the per-expert '", per_expert,
                   "'; it must store each expert's weights once");
      add_gpt_oss_views(ckpt, x);
      continue;
    }
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
