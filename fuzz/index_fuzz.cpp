// Fuzzes the JSON readers of a checkpoint directory: the same text goes to the safetensors index
// parser and to the config.json parser. Each must succeed or throw strata::Error; a crash, a
// sanitizer report or any other exception (InternalError included) is a finding.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "io/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto index = strata::parse_safetensors_index(text, "fuzz.index.json");
    for (const auto& [tensor, shard] : index) {
      // Promised: shard names are plain file names.
      if (shard.empty() || shard.find('/') != std::string::npos) __builtin_trap();
    }
  } catch (const strata::Error&) {
  }
  try {
    const strata::Json j = strata::json_parse_strict(text, "fuzz.config.json");
    const strata::ModelConfig c = strata::parse_model_config(j, "fuzz.config.json");
    if (c.num_key_value_heads < 0 || c.head_dim < 0) __builtin_trap();
  } catch (const strata::Error&) {
  }
  return 0;
}
