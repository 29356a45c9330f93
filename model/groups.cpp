#include "model/groups.h"

#include <cstdint>
#include <string>

namespace strata {
namespace {

struct Split {
  std::string_view parent;  // everything before the last '.'
  std::string_view leaf;
};

Split split_last(std::string_view m) {
  const size_t dot = m.rfind('.');
  if (dot == std::string_view::npos) return {"", m};
  return {m.substr(0, dot), m.substr(dot + 1)};
}

}  // namespace

std::string fused_group_key(std::string_view module) {
  const Split s = split_last(module);
  const std::string p(s.parent);
  if (s.leaf == "q_proj" || s.leaf == "k_proj" || s.leaf == "v_proj") return p + ".{q,k,v}_proj";
  if (s.leaf == "gate_proj" || s.leaf == "up_proj") return p + ".{gate,up}_proj";
  if (s.leaf == "w1" || s.leaf == "w3") return p + ".{w1,w3}";
  if (s.leaf == "q_a_proj" || s.leaf == "kv_a_proj_with_mqa")
    return p + ".{q_a_proj,kv_a_proj_with_mqa}";
  if (s.leaf == "in_proj_qkv" || s.leaf == "in_proj_z") return p + ".{in_proj_qkv,in_proj_z}";
  if (s.leaf == "in_proj_b" || s.leaf == "in_proj_a") return p + ".{in_proj_b,in_proj_a}";
  return std::string(module);
}

int64_t routed_expert_index(std::string_view module) {
  // "<...>.experts.<E>.<leaf>" with E all digits; "shared_experts" does not count.
  const Split s = split_last(module);
  const Split e = split_last(s.parent);
  const Split x = split_last(e.parent);
  if (x.leaf != "experts" || e.leaf.empty()) return -1;
  int64_t v = 0;
  for (char c : e.leaf) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

std::string shared_input_group_key(std::string_view module) {
  const Split s = split_last(module);
  // DeepSeek-V3.2's lightning indexer (<p>.indexer.*): wk and weights_proj read the attention
  // block's input, wq_b reads MLA's normalised q LoRA output as q_b_proj does.
  const Split owner = split_last(s.parent);
  if (owner.leaf == "indexer") {
    if (s.leaf == "wk" || s.leaf == "weights_proj")
      return std::string(owner.parent) + ".{attention input}";
    if (s.leaf == "wq_b") return std::string(owner.parent) + ".{q_b_proj input}";
  }
  if (s.leaf == "q_b_proj") return std::string(s.parent) + ".{q_b_proj input}";
  for (std::string_view leaf : {"q_proj", "k_proj", "v_proj", "q_a_proj", "kv_a_proj_with_mqa",
                                "f_a_proj", "g_a_proj", "b_proj"}) {
    if (s.leaf == leaf) return std::string(s.parent) + ".{attention input}";
  }
  return fused_group_key(module);
}

std::string input_scale_group_key(std::string_view module) {
  if (routed_expert_index(module) < 0) return shared_input_group_key(module);
  const Split s = split_last(module);
  const std::string experts(split_last(s.parent).parent);  // "<p>.experts"
  const bool down = s.leaf == "down_proj" || s.leaf == "w2";
  return experts + (down ? ".*.down" : ".*.gate_up");
}

}  // namespace strata
