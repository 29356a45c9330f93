// Data parallelism (engine/parallel.h): statistics combined over ranks equal one process's, and
// the activation store's files written by ranks equal one process's file.
#include "engine/parallel.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include <unistd.h>

#include "core/crc32c.h"
#include "core/error.h"
#include "engine/activation_store.h"
#include "engine/quantize.h"
#include "export/plan.h"
#include "io/hf_config.h"
#include "quant/recipe.h"
#include "tests/engine/fake_comm.h"

namespace strata {
namespace {

TEST(Parallel, MicroBatchesGoRoundRobin) {
  const std::vector<bool> r1 = owned_batches(FakeRank(1, 3), 8);
  EXPECT_EQ(r1, (std::vector<bool>{false, true, false, false, true, false, false, true}));
  const std::vector<bool> r0 = owned_batches(SingleComm(), 3);
  EXPECT_EQ(r0, (std::vector<bool>{true, true, true}));
}

TEST(Parallel, RoutedExpertOfNames) {
  EXPECT_EQ(routed_expert_of("model.layers.3.mlp.experts.17.down_proj.weight"), 17);
  EXPECT_EQ(routed_expert_of("model.layers.3.mlp.experts.0.gate_proj.weight_scale_inv"), 0);
  EXPECT_EQ(routed_expert_of("language_model.model.layers.1.mlp.experts.5.up_proj.weight_packed"),
            5);
  EXPECT_EQ(routed_expert_of("model.layers.2.block_sparse_moe.experts.31.w1.weight"), 31);
  // Not routed experts: shared experts, the router, fused [E, ...] tensors, other layers.
  EXPECT_EQ(routed_expert_of("model.layers.3.mlp.shared_experts.down_proj.weight"), -1);
  EXPECT_EQ(routed_expert_of("model.layers.3.mlp.shared_expert.up_proj.weight"), -1);
  EXPECT_EQ(routed_expert_of("model.layers.3.mlp.gate.weight"), -1);
  EXPECT_EQ(routed_expert_of("model.layers.3.mlp.experts.gate_up_proj"), -1);
  EXPECT_EQ(routed_expert_of("model.layers.3.self_attn.q_proj.weight"), -1);
  EXPECT_EQ(routed_expert_of("model.layers.3.mlp.experts.12"), -1);
}

// With expert parallelism the memory bound counts a rank's share of the routed experts: the
// largest layer's weights in fp32, with only ceil(E / ranks) experts of each MoE layer.
TEST(Parallel, MemoryBoundCountsTheRanksExperts) {
  const std::string dir = std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/qwen3_moe";
  const ModelConfig config = read_model_config(dir);
  const Checkpoint ckpt = Checkpoint::open(dir);
  const QuantPlan plan = make_plan(config, ckpt, load_recipe("nvfp4-kv_fp8"));
  const int64_t E = config.num_experts;
  ASSERT_GE(E, 3);
  for (int ranks : {1, 2, 3}) {
    const int64_t held = (E + ranks - 1) / ranks;
    // Independently: the 2-D weights of each decoder layer from the checkpoint's headers.
    uint64_t want = 0;
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      const std::string prefix = "model.layers." + std::to_string(l) + ".";
      uint64_t params = 0, experts = 0;
      for (const std::string& n : ckpt.tensor_names()) {
        const TensorEntry& e = ckpt.entry(n);
        if (!n.starts_with(prefix) || e.shape.size() != 2) continue;
        const uint64_t k = static_cast<uint64_t>(e.shape[0] * e.shape[1]);
        if (routed_expert_of(n) >= 0) {
          experts += k;
        } else {
          params += k;
        }
      }
      params += experts * static_cast<uint64_t>(held) / static_cast<uint64_t>(E);
      want = std::max(want, params * 4);
    }
    const MemoryEstimate m =
        estimate_memory(plan, ckpt, {64}, 32, config.hidden_size, true, ranks, E);
    EXPECT_EQ(m.layer_weights, want) << ranks << " ranks";
  }
}

// nvfp4_act_headroom histograms travel with the statistics and add (calib/max_calib.h).
TEST(Parallel, MergedHistogramsAdd) {
  MaxCalibrator a(true), b(true);
  std::vector<float> x(16, 0.0f), y(16, 0.0f);
  x[0] = 1.0f;  // bin 256
  y[3] = 3.0f;  // bin 266
  a.observe("m", x.data(), 1, 16);
  b.observe("m", y.data(), 1, 16);
  b.observe("m", x.data(), 1, 16);
  MaxCalibrator m(true);
  merge_calibration(encode_calibration(a), m);
  merge_calibration(encode_calibration(b), m);
  std::vector<int64_t> want(kHeadroomBins, 0);
  want[256] = 2;
  want[266] = 1;
  EXPECT_EQ(m.find("m")->hist, want);
  EXPECT_EQ(m.find("m")->rows, 3);
  EXPECT_EQ(m.find("m")->amax, 3.0f);
  MaxCalibrator plain;  // no histograms: none encoded
  plain.observe("m", x.data(), 1, 16);
  MaxCalibrator n;
  merge_calibration(encode_calibration(plain), n);
  EXPECT_TRUE(n.find("m")->hist.empty());
}

// Hand-worked: rank A saw a (|x| up to 1.5, 3 rows) and b; rank B saw a (4, 2 rows) and c (NaN).
TEST(Parallel, MergedStatisticsHandWorked) {
  MaxCalibrator a, b;
  const float xa[] = {1.0f, -1.5f, 0.5f}, xb[] = {2.0f}, ya[] = {-4.0f, 3.0f}, yc[] = {NAN};
  a.observe("a", xa, 3, 1);
  a.observe("b", xb, 1, 1);
  b.observe("a", ya, 2, 1);
  b.observe("c", yc, 1, 1);
  MaxCalibrator m;
  merge_calibration(encode_calibration(a), m);
  merge_calibration(encode_calibration(b), m);
  ASSERT_EQ(m.stats().size(), 3u);
  EXPECT_EQ(m.find("a")->amax, 4.0f);
  EXPECT_EQ(m.find("a")->rows, 5);
  EXPECT_EQ(m.find("b")->amax, 2.0f);
  EXPECT_EQ(m.find("b")->rows, 1);
  EXPECT_TRUE(std::isnan(m.find("c")->amax));
}

// Random observations dealt to 3 ranks, merged, equal one calibrator observing them all.
TEST(Parallel, MergedStatisticsEqualOneProcess) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 3.0f);
  MaxCalibrator one, ranks[3];
  for (int i = 0; i < 60; ++i) {
    const std::string name = "m" + std::to_string(rng() % 7);
    const int64_t rows = 1 + static_cast<int64_t>(rng() % 4);
    std::vector<float> x(static_cast<size_t>(rows * 5));
    for (float& v : x)
      v = d(rng);
    one.observe(name, x.data(), rows, 5);
    ranks[i % 3].observe(name, x.data(), rows, 5);
  }
  MaxCalibrator m;
  for (const MaxCalibrator& r : ranks)
    merge_calibration(encode_calibration(r), m);
  ASSERT_EQ(m.stats().size(), one.stats().size());
  for (const auto& [name, s] : one.stats()) {
    ASSERT_NE(m.find(name), nullptr) << name;
    EXPECT_EQ(m.find(name)->amax, s.amax) << name;
    EXPECT_EQ(m.find(name)->rows, s.rows) << name;
  }
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Three ranks' stores, each writing its micro-batches into the shared file, give the bytes of one
// store writing them all; spilled and in memory. A store of another rank count reads them back.
TEST(Parallel, RanksWriteOneProcessesHiddenFile) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("strata_parallel_" + std::to_string(::getpid()));
  const std::vector<int64_t> rows = {3, 1, 2, 3, 2};
  const int64_t H = 4;
  auto value = [](size_t b, int64_t i) {
    return static_cast<float>(b * 16 + static_cast<size_t>(i)) * 0.25f;
  };  // bf16-exact };
  for (bool spill : {false, true}) {
    fs::remove_all(dir);
    fs::create_directories(dir / "one");
    fs::create_directories(dir / "ranks");
    std::string one_path, ranks_path;
    std::vector<uint32_t> one_sums, rank_sums(rows.size(), 0);
    {
      ActivationStore one(rows, H, DType::kBF16, spill, (dir / "one").string());
      one.begin(2);
      for (size_t b = 0; b < rows.size(); ++b) {
        std::vector<float> x(static_cast<size_t>(rows[b] * H));
        for (int64_t i = 0; i < rows[b] * H; ++i)
          x[static_cast<size_t>(i)] = value(b, i);
        one.write(b, x.data());
      }
      one_path = one.commit((dir / "one").string(), true);
      one_sums = one.input_sums();
    }
    for (int r = 2; r >= 0; --r) {
      ActivationStore st(rows, H, DType::kBF16, spill, (dir / "ranks").string(),
                         owned_batches(FakeRank(r, 3), rows.size()));
      st.begin(2);
      for (size_t b = 0; b < rows.size(); ++b) {
        if (!st.owns(b)) continue;
        std::vector<float> x(static_cast<size_t>(rows[b] * H));
        for (int64_t i = 0; i < rows[b] * H; ++i)
          x[static_cast<size_t>(i)] = value(b, i);
        st.write(b, x.data());
      }
      ranks_path = st.commit((dir / "ranks").string(), true);
      for (size_t b = 0; b < rows.size(); ++b)
        rank_sums[b] += st.input_sums()[b];  // 0 for another rank's micro-batches
    }
    EXPECT_EQ(slurp(ranks_path), slurp(one_path)) << "spill " << spill;
    // The checksums: the CRC-32C of each micro-batch's bf16 values (the upper halves of the
    // exact fp32 values), summed over the ranks the same as one process's.
    for (size_t b = 0; b < rows.size(); ++b) {
      std::vector<uint16_t> bf16(static_cast<size_t>(rows[b] * H));
      for (int64_t i = 0; i < rows[b] * H; ++i)
        bf16[static_cast<size_t>(i)] =
            static_cast<uint16_t>(std::bit_cast<uint32_t>(value(b, i)) >> 16);
      EXPECT_EQ(one_sums[b], crc32c(bf16.data(), bf16.size() * 2)) << b;
    }
    EXPECT_EQ(rank_sums, one_sums);
    ActivationStore back(rows, H, DType::kBF16, spill, (dir / "back").string(),
                         owned_batches(FakeRank(1, 2), rows.size()));
    back.load(ranks_path);
    std::vector<float> x(12);
    back.read(3, x.data());
    for (int64_t i = 0; i < rows[3] * H; ++i)
      EXPECT_EQ(x[static_cast<size_t>(i)], value(3, i));
    // check(): the file as written passes; a flipped byte, a short file, a missing file and
    // checksums of another count do not.
    const ActivationStore layout(rows, H, DType::kBF16, true, dir.string());
    EXPECT_EQ(layout.check(ranks_path, one_sums), "");
    std::string bytes = slurp(ranks_path);
    const std::string good = bytes;
    bytes[bytes.size() - 1] = static_cast<char>(bytes.back() ^ 0x01);
    std::ofstream(ranks_path, std::ios::binary) << bytes;
    EXPECT_NE(layout.check(ranks_path, one_sums).find("fails its checksum in micro-batch 4"),
              std::string::npos);
    std::ofstream(ranks_path, std::ios::binary) << good.substr(0, good.size() - 2);
    EXPECT_EQ(
        layout.check(ranks_path, one_sums),
        str("is ", good.size() - 2, " bytes, ", good.size(), " expected (truncated or extended)"));
    std::ofstream(ranks_path, std::ios::binary) << good;
    EXPECT_NE(layout.check(ranks_path, {1, 2}).find("2 recorded checksums for 5"),
              std::string::npos);
    fs::remove(ranks_path);
    EXPECT_EQ(layout.check(ranks_path, one_sums), "is missing");
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace strata
