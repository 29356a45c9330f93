// The family table: every architecture family whose forward strata implements, with its config
// check and its layer builder (one file each under model/). Adding a family adds its file and
// one entry here.
#include <array>

#include "core/error.h"
#include "model/layer.h"

namespace strata::model {

void check_llama_config(const ModelConfig& c);
std::unique_ptr<Layer> make_llama_layer(const ModelConfig& c, int64_t index, const std::string& p);
std::unique_ptr<Layer> make_qwen_moe_layer(const ModelConfig& c, int64_t index,
                                           const std::string& p);
std::unique_ptr<Layer> make_mixtral_layer(const ModelConfig& c, int64_t index,
                                          const std::string& p);
void check_deepseek_v3_config(const ModelConfig& c);
std::unique_ptr<Layer> make_deepseek_v3_layer(const ModelConfig& c, int64_t index,
                                              const std::string& p);
void check_kimi_linear_config(const ModelConfig& c);
std::unique_ptr<Layer> make_kimi_linear_layer(const ModelConfig& c, int64_t index,
                                              const std::string& p);
void check_glm4_moe_config(const ModelConfig& c);
std::unique_ptr<Layer> make_glm4_moe_layer(const ModelConfig& c, int64_t index,
                                           const std::string& p);
void check_minimax_m2_config(const ModelConfig& c);
std::unique_ptr<Layer> make_minimax_m2_layer(const ModelConfig& c, int64_t index,
                                             const std::string& p);
void check_gpt_oss_config(const ModelConfig& c);
std::unique_ptr<Layer> make_gpt_oss_layer(const ModelConfig& c, int64_t index,
                                          const std::string& p);
void check_qwen3_next_config(const ModelConfig& c);
std::unique_ptr<Layer> make_qwen3_next_layer(const ModelConfig& c, int64_t index,
                                             const std::string& p);

namespace {

constexpr std::array kFamilies = {
    Family{ArchFamily::kLlama, check_llama_config, make_llama_layer},
    Family{ArchFamily::kQwenMoe, check_llama_config, make_qwen_moe_layer},
    Family{ArchFamily::kMixtral, check_llama_config, make_mixtral_layer},
    Family{ArchFamily::kDeepseekV3, check_deepseek_v3_config, make_deepseek_v3_layer},
    Family{ArchFamily::kKimiLinear, check_kimi_linear_config, make_kimi_linear_layer},
    Family{ArchFamily::kGlm4Moe, check_glm4_moe_config, make_glm4_moe_layer},
    Family{ArchFamily::kMiniMaxM2, check_minimax_m2_config, make_minimax_m2_layer},
    Family{ArchFamily::kGptOss, check_gpt_oss_config, make_gpt_oss_layer},
    Family{ArchFamily::kQwen3Next, check_qwen3_next_config, make_qwen3_next_layer, 1.0f},
    Family{ArchFamily::kQwen35Moe, check_qwen3_next_config, make_qwen3_next_layer, 1.0f},
};

}  // namespace

const Family& family_of(const ModelConfig& config) {
  const ArchFamily family = resolve_arch(config).family;
  for (const Family& f : kFamilies) {
    if (f.family == family) return f;
  }
  std::string supported;
  for (const Family& f : kFamilies)
    supported += (supported.empty() ? "" : ", ") + std::string(arch_family_name(f.family));
  fail(config.path, ": the forward pass for model_type '", config.text_model_type, "' (family ",
       arch_family_name(family), ") is not implemented yet; families with a forward: ", supported);
}

}  // namespace strata::model
