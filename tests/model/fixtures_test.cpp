// The classifier on checkpoints saved by transformers itself (tests/fixtures/models/, made by
// tests/fixtures/make_fixtures.py): every tensor name must be recognised, and the layers that
// hold experts or a dense MLP must be the ones the config makes MoE or dense.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "model/arch.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

TEST(ArchFixtures, TransformersNamesAreRecognised) {
  const fs::path root = fs::path(STRATA_SOURCE_DIR) / "tests/fixtures/models";
  int checked = 0;
  for (const auto& d : fs::directory_iterator(root)) {
    if (!fs::exists(d.path() / "config.json")) continue;
    const std::string dir = d.path().string();
    SCOPED_TRACE(dir);
    ModelConfig config = read_model_config(dir);
    ArchInfo arch = resolve_arch(config);
    Checkpoint ckpt = Checkpoint::open(dir);
    resolve_wrapper_prefixes(arch, ckpt.tensor_names(), dir);  // Qwen3.5's wrapper
    int routed = 0;
    for (const std::string& name : ckpt.tensor_names()) {
      TensorClass c = classify_tensor(arch, name);
      EXPECT_NE(c.kind, TensorKind::kUnrecognized) << name;
      if (c.kind == TensorKind::kRoutedExperts || c.kind == TensorKind::kRouter ||
          c.kind == TensorKind::kSharedExperts) {
        EXPECT_TRUE(layer_is_moe(arch, config, c.layer)) << name;
        routed += c.kind == TensorKind::kRoutedExperts;
      }
      if (c.kind == TensorKind::kDenseMlp) {
        EXPECT_FALSE(layer_is_moe(arch, config, c.layer)) << name;
      }
      if (c.layer >= 0) {
        EXPECT_LT(c.layer, arch.num_hidden_layers) << name;
      }
    }
    EXPECT_EQ(routed > 0, config.num_experts > 0);
    ++checked;
  }
  EXPECT_GE(checked, 1) << "no fixtures under " << root;
}

}  // namespace
}  // namespace strata
