// The GPU forward's observers, checked without a GPU: the CUDA backend's sizing run registers one
// slot per observed input of a layer; the names must be exactly the ones the CPU forward reports
// when it runs the fixture's tokens (the calibrator keys on them), every routed expert included;
// under both calibration precisions (bf16_ops runs the sizing backend's rounding paths too).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/cuda/gpu_forward.h"
#include "model/forward.h"

namespace strata {
namespace {

const std::string kFixtures = std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/";

class NameObserver : public Observer {
 public:
  void observe(std::string_view name, const float*, int64_t, int64_t) override {
    names.insert(std::string(name));
  }
  std::set<std::string> names;
};

class GpuObservers : public testing::TestWithParam<std::string> {};

TEST_P(GpuObservers, MatchTheCpuForwardsNames) {
  const std::string dir = kFixtures + GetParam();
  const Checkpoint ckpt = Checkpoint::open(dir);
  const ModelConfig config = read_model_config(dir);
  for (const bool bf16_ops : {false, true}) {
    ForwardOptions options;
    options.bf16_ops = bf16_ops;
    auto fwd = ModelForward::create(config, ckpt, options);
    // Two sequences of a few tokens reach every input of every layer (routed experts report
    // even when no token reaches them).
    const Batch batch = Batch::from_sequences({{1, 2, 3, 4, 5}, {6, 7, 8}});
    std::vector<float> x(static_cast<size_t>(batch.n_tokens() * fwd->hidden_size()));
    fwd->embed(batch, x.data());
    gpu::GpuForwardOptions gpu_options;
    gpu_options.bf16_ops = bf16_ops;
    for (int64_t l = 0; l < fwd->num_layers(); ++l) {
      NameObserver cpu;
      fwd->layer(l)->forward(batch, x.data(), &cpu);
      std::set<std::string> gpu;
      for (const auto& slot : gpu::GpuForward::observed_inputs(config, ckpt, l, gpu_options)) {
        ASSERT_FALSE(slot.empty());
        for (const std::string& n : slot)
          EXPECT_TRUE(gpu.insert(n).second) << n << " observed in two GPU slots";
      }
      EXPECT_EQ(gpu, cpu.names) << GetParam() << " layer " << l << " bf16_ops " << bf16_ops;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuObservers,
                         testing::Values("llama", "qwen3", "qwen3_moe", "qwen3_moe_nonorm",
                                         "deepseek_v3", "deepseek_v3_noqlora", "kimi_linear",
                                         "mixtral", "gpt_oss", "gpt_oss_mxfp4", "glm4_moe",
                                         "minimax_m2", "qwen3_next", "qwen3_5_moe",
                                         "deepseek_v32"));

// GpuForward::unsupported on the CPU: every fixture family runs on the device (its sizing run
// passes), and a checkpoint with layer tensors of a dtype the device cannot read is refused
// naming the first of them in name order (the tensors are checked on several threads).
TEST(GpuUnsupported, FixturesRunAndTheFirstUnreadableTensorIsNamed) {
  for (const char* m : {"llama", "qwen3_moe", "deepseek_v3", "kimi_linear", "gpt_oss_mxfp4",
                        "qwen3_next", "deepseek_v32", "kimi_k25_int4", "deepseek_v3_fp8"}) {
    const std::string dir = kFixtures + m;
    EXPECT_EQ(gpu::GpuForward::unsupported(read_model_config(dir), Checkpoint::open(dir)), "") << m;
  }
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("strata_gpu_unsupported_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::copy(kFixtures + "qwen3_moe", dir);
  const std::set<std::string> as_i8 = {"model.layers.1.self_attn.q_norm.weight",
                                       "model.layers.0.mlp.experts.3.up_proj.weight"};
  {
    SafetensorsFile f = SafetensorsFile::open((dir / "model.safetensors").string());
    NamedTensors out;
    for (const TensorEntry& e : f.entries()) {
      if (!as_i8.count(e.name)) {
        out.emplace_back(e.name, f.tensor(e).clone());
        continue;
      }
      out.emplace_back(e.name, Tensor::zeros(DType::kI8, e.shape));
    }
    write_safetensors((dir / "model.safetensors").string(), out);
  }
  EXPECT_EQ(
      gpu::GpuForward::unsupported(read_model_config(dir.string()), Checkpoint::open(dir.string())),
      "tensor 'model.layers.0.mlp.experts.3.up_proj.weight' has dtype i8 (the GPU forward "
      "reads F32, F16 and BF16 weights, DeepSeek FP8 blocks, INT4 pack-quantized and MXFP4 "
      "weights)");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace strata
