// `strata quantize` as a user runs it: the plan printed by --dry-run (counted here from the
// fixture's config), the end-of-run report, and the refusals that must come before any work.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "io/safetensors.h"
#include "tests/cli/cli_util.h"

namespace {

using namespace strata_cli_test;

// Token ids below the fixtures' vocabulary (384), one sequence per line.
void write_tokens(const fs::path& p) {
  write_file(p, "[1, 2, 3, 4, 5, 6, 7, 8]\n[9, 10, 11, 12, 13]\n[200, 201, 202]\n");
}

TEST(Quantize, DryRunCountsModulesPerKindAndFormat) {
  TempDir tmp;
  // qwen3_moe: 3 layers, layer 1 dense (mlp_only_layers), 8 experts in layers 0 and 2.
  RunResult r = run_strata(
      "quantize --model '" + kFixtures + "qwen3_moe' --qformat nvfp4_experts_only --dry-run",
      tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  // 2 MoE layers x 8 experts x 3 projections; attention 3 x 4; dense MLP 1 x 3; routers 2;
  // lm_head 1.
  EXPECT_NE(r.out.find("routed_experts  48 nvfp4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("attention       12 none"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dense_mlp       3 none"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("router          2 none"), std::string::npos) << r.out;
  // hf_ptq 0.47's default KV mode: cast to FP8 with a constant amax, no k/v scales.
  EXPECT_NE(r.out.find("kv cache    fp8_cast\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("k/v scales"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(tmp.path() / "out"));
}

// The dry run's output estimate against the export's real size, for compressed sources (INT4
// pack-quantized, MXFP4), whose stored weights are smaller than their bf16 shape: the estimate
// subtracts what the checkpoint stores, not the bf16 size (it once underflowed to 16 million TiB
// on a Kimi-K2 INT4 checkpoint).
TEST(Quantize, DryRunEstimatesACompressedSourcesOutput) {
  for (const std::string model : {"kimi_k25_int4", "gpt_oss_mxfp4", "deepseek_v3_fp8"}) {
    TempDir tmp;
    write_tokens(tmp.path() / "t.jsonl");
    const std::string cmd = "quantize --model '" + kFixtures + model +
                            "' --recipe nvfp4_experts_only-kv_fp8 --calib_data '" +
                            (tmp.path() / "t.jsonl").string() + "' --calib_min_tokens 1 -q";
    const std::string out = (tmp.path() / "out").string();
    RunResult dry = run_strata(cmd + " --export_path '" + out + "' --dry-run", tmp.path());
    ASSERT_EQ(dry.rc, 0) << model << ": " << dry.err;
    const size_t at = dry.out.find("output      about ");
    ASSERT_NE(at, std::string::npos) << dry.out;
    std::istringstream line(dry.out.substr(at + 18));
    double value = 0;
    std::string unit;
    line >> value >> unit;
    const std::vector<std::string> units = {"B", "KiB", "MiB", "GiB", "TiB"};
    const auto u = std::find(units.begin(), units.end(), unit);
    ASSERT_NE(u, units.end()) << "unit '" << unit << "' in " << dry.out;
    const double estimate = value * std::pow(1024.0, static_cast<double>(u - units.begin()));
    RunResult run = run_strata(cmd + " --export_path '" + out + "'", tmp.path());
    ASSERT_EQ(run.rc, 0) << model << ": " << run.err;
    double real = 0;
    for (const auto& e : fs::directory_iterator(out))
      if (e.path().extension() == ".safetensors") real += static_cast<double>(fs::file_size(e));
    // Headers, the KV scales and rounding of the printed value apart: within a tenth.
    EXPECT_GT(estimate, 0.9 * real) << model << ": " << dry.out;
    EXPECT_LT(estimate, 1.1 * real) << model << ": " << dry.out;
  }
}

// The summary's disk line: the checkpoint bytes the run read (the line above it) and the bytes of
// every file in the export (summed here from the directory), in decimal units, and their sum over
// the run's seconds.
TEST(Quantize, SummaryGivesTheDisksRateOverTheRun) {
  TempDir tmp;
  write_tokens(tmp.path() / "t.jsonl");
  const std::string out = (tmp.path() / "out").string();
  RunResult run = run_strata(
      "quantize --model '" + kFixtures + "qwen3_moe' --recipe nvfp4-kv_fp8 --calib_data '" +
          (tmp.path() / "t.jsonl").string() + "' --calib_min_tokens 1 --export_path '" + out + "'",
      tmp.path());
  ASSERT_EQ(run.rc, 0) << run.err;
  const size_t r = run.out.find("checkpoint bytes read: ");
  const size_t d = run.out.find("disk: ");
  ASSERT_NE(r, std::string::npos) << run.out;
  ASSERT_NE(d, std::string::npos) << run.out;
  const double read = std::stod(run.out.substr(r + 23));
  double written = 0;
  for (const auto& e : fs::recursive_directory_iterator(out))
    if (e.is_regular_file()) written += static_cast<double>(e.file_size());
  // The fixture is under 1 MB each way: kB with one decimal.
  std::istringstream line(run.out.substr(d + 6));
  double r_kb = 0, w_kb = 0, seconds = 0, rate = 0;
  std::string unit1, w1, w2, unit2, w3, w4, w5, rate_unit;
  line >> r_kb >> unit1 >> w1 >> w2 >> w_kb >> unit2 >> w3 >> w4 >> seconds >> w5 >> rate >>
      rate_unit;
  EXPECT_EQ(unit1, "kB") << run.out;
  EXPECT_EQ(unit2, "kB") << run.out;
  EXPECT_NEAR(r_kb, read / 1e3, 0.051) << run.out;
  EXPECT_NEAR(w_kb, written / 1e3, 0.051) << run.out;
  ASSERT_GT(seconds, 0.0) << run.out;
  // MB/s or kB/s: (read + written) / seconds, within the printed seconds' rounding (0.005 s).
  const double scale = rate_unit == "MB/s" ? 1e6 : rate_unit == "kB/s" ? 1e3 : 0.0;
  ASSERT_GT(scale, 0.0) << run.out;
  EXPECT_GT(rate * scale, (read + written) / (seconds + 0.005) * 0.99) << run.out;
  EXPECT_LT(rate * scale, (read + written) / std::max(seconds - 0.005, 1e-3) * 1.01) << run.out;
}

// A layer whose experts all reached the threshold gets no line; when none has such experts, one
// line says so (a 61-layer run printed 60 lines of "0 of 384").
TEST(Quantize, ExpertSummaryNamesOnlyLayersWithScarceExperts) {
  TempDir tmp;
  write_tokens(tmp.path() / "t.jsonl");
  auto run = [&](int64_t min_tokens, const std::string& out) {
    return run_strata(
        "quantize --model '" + kFixtures + "qwen3_moe' --qformat nvfp4 --calib_data '" +
            (tmp.path() / "t.jsonl").string() +
            "' --calib_size 3 --calib_min_tokens 1 --min_expert_tokens " +
            std::to_string(min_tokens) + " --export_path '" + (tmp.path() / out).string() + "'",
        tmp.path());
  };
  // 16 tokens, top-2, 8 experts: some expert of each MoE layer gets at most 4 slots.
  RunResult r = run(1, "a");
  ASSERT_EQ(r.rc, 0) << r.err;
  const bool any_idle = r.out.find("layer   0:") != std::string::npos ||
                        r.out.find("layer   2:") != std::string::npos;
  // Either some layer has an expert without tokens (and is listed), or the one line says none.
  EXPECT_EQ(r.out.find("every routed expert of every MoE layer reached at least 1 calibration") ==
                std::string::npos,
            any_idle)
      << r.out;
  RunResult all = run(1000, "b");
  ASSERT_EQ(all.rc, 0) << all.err;
  EXPECT_NE(all.out.find("in the 2 MoE layers that have any"), std::string::npos) << all.out;
  EXPECT_EQ(all.out.find("every routed expert"), std::string::npos) << all.out;
}

TEST(Quantize, MixtralDryRun) {
  TempDir tmp;
  // mixtral: 3 layers, all MoE, 8 experts of w1/w3/w2 under block_sparse_moe, no dense MLP.
  RunResult r =
      run_strata("quantize --model '" + kFixtures +
                     "mixtral' --qformat nvfp4_experts_only --kv_cache_qformat fp8 --dry-run",
                 tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  // 3 MoE layers x 8 experts x 3 projections; attention 3 x 4; routers (block_sparse_moe.gate) 3.
  EXPECT_NE(r.out.find("routed_experts  72 nvfp4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("attention       12 none"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("router          3 none"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("dense_mlp"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("k/v scales for 3 attention layers"), std::string::npos) << r.out;
}

TEST(Quantize, ReportsExpertsWithoutTokens) {
  TempDir tmp;
  write_tokens(tmp.path() / "t.jsonl");
  RunResult r =
      run_strata("quantize --model '" + kFixtures + "qwen3_moe' --qformat nvfp4 --calib_data '" +
                     (tmp.path() / "t.jsonl").string() +
                     "' --calib_size 3 --calib_min_tokens 1 --export_path '" +
                     (tmp.path() / "out").string() + "'",
                 tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("calibration: 3 sequences, 16 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("experts that fewer than 16 calibration tokens reached, in the 2 MoE "
                       "layers that have any"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("layer   0:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layer   2:"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("layer   1:"), std::string::npos) << r.out;  // dense
  EXPECT_TRUE(fs::exists(tmp.path() / "out" / "hf_quant_config.json"));
}

// With --min_expert_tokens above any count every routed expert is listed with its tokens, and
// each MoE layer's counts add up to the calibration tokens times num_experts_per_tok (2 in the
// fixture's config.json): each token reaches that many experts. 0 is refused.
TEST(Quantize, ListsEveryExpertsTokensUnderTheThreshold) {
  TempDir tmp;
  write_tokens(tmp.path() / "t.jsonl");
  const std::string base =
      "quantize --model '" + kFixtures + "qwen3_moe' --qformat nvfp4 --calib_data '" +
      (tmp.path() / "t.jsonl").string() + "' --calib_size 3 --calib_min_tokens 1 --export_path '";
  RunResult bad =
      run_strata(base + (tmp.path() / "bad").string() + "' --min_expert_tokens 0", tmp.path());
  EXPECT_EQ(bad.rc, 1);
  EXPECT_NE(bad.err.find("--min_expert_tokens must be at least 1"), std::string::npos) << bad.err;
  RunResult r = run_strata(base + (tmp.path() / "out").string() + "' --min_expert_tokens 1000000",
                           tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_NE(r.out.find("calibration: 3 sequences, 16 tokens"), std::string::npos) << r.out;
  int layers = 0;
  for (const std::string layer : {"layer   0: ", "layer   2: "}) {
    const size_t at = r.out.find(layer);
    ASSERT_NE(at, std::string::npos) << r.out;
    const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
    ASSERT_EQ(line.find(": 8 of 8 ("), layer.size() - 2) << line;
    // "layer   0: 8 of 8 (k without any): 0 (t0), 1 (t1), ..."
    int64_t sum = 0, listed = 0;
    for (size_t p = line.find("): ") + 3; p < line.size();) {
      const size_t open = line.find(" (", p), close = line.find(')', open);
      EXPECT_EQ(std::stoll(line.substr(p, open - p)), listed) << line;
      sum += std::stoll(line.substr(open + 2, close - open - 2));
      ++listed;
      p = close + 3;
    }
    EXPECT_EQ(listed, 8) << line;
    EXPECT_EQ(sum, 16 * 2) << line;
    ++layers;
  }
  EXPECT_EQ(layers, 2);
}

TEST(Quantize, RefusalsComeBeforeAnyWork) {
  TempDir tmp;
  write_tokens(tmp.path() / "t.jsonl");
  fs::create_directories(tmp.path() / "full");
  write_file(tmp.path() / "full" / "keep.txt", "user data");
  const std::string base = "quantize --model '" + kFixtures + "llama' --calib_data '" +
                           (tmp.path() / "t.jsonl").string() +
                           "' --calib_size 3 --calib_min_tokens 1 ";
  struct Case {
    std::string args, needle;
  } cases[] = {
      {base + "--export_path '" + (tmp.path() / "full").string() + "'", "is not empty"},
      {base + "--qformat int4_awq --export_path x", "int4_awq"},
      {base + "--recipe no_such_recipe --export_path x", "no_such_recipe"},
      {"quantize --model '" + kFixtures + "llama' --export_path '" + (tmp.path() / "o").string() +
           "'",
       "needs the model's tokenizer"},
      {base + "--export_path '" + kFixtures + "llama'", "is the source checkpoint"},
      {base + "--gpu_gemm fp16 --export_path x", "--gpu_gemm must be bf16|fp32, not 'fp16'"},
      {base + "--calib_precision bf16 --export_path x",
       "--calib_precision must be fp32_layers|bf16_ops, not 'bf16'"},
      {base + "--gpu_weight_buffers 3 --export_path x",
       "--gpu_weight_buffers must be auto|1|2, not '3'"},
      {base + "--test_fail_rank 1 --export_path x",
       "--test_fail_rank and --test_fail_layer go together"},
      {base + "--resume_every -1 --export_path x",
       "--resume_every must be a number of seconds, 0 or more"},
      {base + "--test_writeback often --export_path x",
       "--test_writeback must be layer|none, not 'often'"},
      {base + "--test_first_reads fast --export_path x",
       "--test_first_reads must be gentle|streams, not 'fast'"},
      {base + "--test_gpu_read 8:fast --export_path x",
       "--test_gpu_read takes "
       "THREADS[:none|sequential|willneed[:PIECE_MiB[:READ_KiB]]][:wait|nowait]"},
  };
  for (const Case& c : cases) {
    RunResult r = run_strata(c.args, tmp.path());
    EXPECT_EQ(r.rc, 1) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  EXPECT_EQ(read_file(tmp.path() / "full" / "keep.txt"), "user data");
  EXPECT_FALSE(fs::exists(tmp.path() / "o"));
}

// An INT4 source's shapes come from the packed tensors' headers (io/source_weights.h); each
// module's own weight_shape is read beside the run's start and compared. One that disagrees (here
// the fixture's first expert says 8 inputs fewer than its codes hold) stops quantize before any
// layer is recorded, with one line naming the tensor, and no finished export; --dry-run and
// inspect name it too.
TEST(Quantize, Int4WeightShapeDisagreeingWithItsCodesIsRefused) {
  TempDir tmp;
  write_tokens(tmp.path() / "t.jsonl");
  const fs::path model = tmp.path() / "kimi";
  fs::copy(kFixtures + "kimi_k25_int4", model);
  const std::string file = (model / "model.safetensors").string();
  const std::string bad = "language_model.model.layers.1.mlp.experts.0.down_proj.weight_shape";
  int32_t shape[2];
  uint64_t at = 0;
  {
    const strata::SafetensorsFile f = strata::SafetensorsFile::open(file);
    const strata::TensorEntry* e = f.find(bad);
    ASSERT_NE(e, nullptr);
    std::memcpy(shape, f.tensor(*e).data<int32_t>(), 8);
    at = f.header().data_offset + e->begin;
  }
  ASSERT_EQ(shape[1] % 8, 0);
  const int32_t wrong[2] = {shape[0], shape[1] - 8};
  {
    std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(at));
    io.write(reinterpret_cast<const char*>(wrong), 8);
    ASSERT_TRUE(io.good());
  }
  const std::string needle = "'" + bad + "' is (" + std::to_string(shape[0]) + ", " +
                             std::to_string(shape[1] - 8) + ") but";
  const std::string cmd = "quantize --model '" + model.string() +
                          "' --recipe nvfp4_experts_only-kv_fp8 --device cpu --calib_data '" +
                          (tmp.path() / "t.jsonl").string() +
                          "' --calib_size 3 --calib_min_tokens 1 -q";
  const fs::path out = tmp.path() / "out";
  for (const std::string& extra : {std::string(" --dry-run"), std::string()}) {
    RunResult r = run_strata(cmd + " --export_path '" + out.string() + "'" + extra, tmp.path());
    EXPECT_EQ(r.rc, 1) << extra << ": " << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("the checkpoint may be damaged"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  // Nothing that looks finished: no config, index or run record, no shard under its final name.
  for (const char* f : {"config.json", "hf_quant_config.json", "strata_run.json"})
    EXPECT_FALSE(fs::exists(out / f)) << f;
  for (const auto& e : fs::directory_iterator(out))
    EXPECT_NE(e.path().extension(), ".safetensors") << e.path();
  RunResult i = run_strata("inspect '" + model.string() + "' --json", tmp.path());
  ASSERT_EQ(i.rc, 0) << i.err;
  EXPECT_NE(i.out.find("\"tensor\": \"" + bad + "\""), std::string::npos) << i.out;
}

// The GPU switches are documented flags; the test hooks parse but stay out of --help.
TEST(Quantize, HelpListsGpuSwitchesNotTestHooks) {
  TempDir tmp;
  RunResult r = run_strata("quantize --help", tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  for (const char* flag :
       {"--gpu_gemm bf16|fp32", "--gpu_weight_buffers auto|1|2", "--gpu_quantize on|off",
        "--gpu_attention auto|warp", "--gpu_profile", "--resume_every SECONDS"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag << "\n" << r.out;
  EXPECT_EQ(r.out.find("--test_"), std::string::npos) << r.out;
}

// --calib_precision: bf16_ops changes only the calibrated scales; it is part of the run's identity
// (strata_run.json's options), so an export of one precision is not taken as the other's.
TEST(Quantize, CalibPrecisionChangesScalesOnlyAndTheIdentity) {
  TempDir tmp;
  write_tokens(tmp.path() / "t.jsonl");
  const std::string base = "quantize -q --model '" + kFixtures + "llama' --recipe nvfp4-kv_fp8 " +
                           "--calib_data '" + (tmp.path() / "t.jsonl").string() +
                           "' --calib_size 3 --calib_min_tokens 1 --device cpu ";
  RunResult help = run_strata("quantize --help", tmp.path());
  EXPECT_NE(help.out.find("--calib_precision fp32_layers|bf16_ops"), std::string::npos) << help.out;
  const fs::path a = tmp.path() / "fp32_layers", b = tmp.path() / "bf16_ops";
  RunResult ra = run_strata(base + "--export_path '" + a.string() + "'", tmp.path());
  ASSERT_EQ(ra.rc, 0) << ra.err;
  RunResult rb = run_strata(base + "--calib_precision bf16_ops --export_path '" + b.string() + "'",
                            tmp.path());
  ASSERT_EQ(rb.rc, 0) << rb.err;
  EXPECT_EQ(read_file(a / "config.json"), read_file(b / "config.json"));
  EXPECT_EQ(read_file(a / "hf_quant_config.json"), read_file(b / "hf_quant_config.json"));
  // Every tensor byte-identical but the calibrated scales, some of which differ.
  const strata::SafetensorsFile fa =
      strata::SafetensorsFile::open((a / "model.safetensors").string());
  const strata::SafetensorsFile fb =
      strata::SafetensorsFile::open((b / "model.safetensors").string());
  ASSERT_EQ(fa.entries().size(), fb.entries().size());
  int scales_differ = 0;
  for (const strata::TensorEntry& e : fa.entries()) {
    const strata::TensorEntry* o = fb.find(e.name);
    ASSERT_NE(o, nullptr) << e.name;
    const strata::Tensor x = fa.tensor(e), y = fb.tensor(*o);
    const bool same =
        x.nbytes() == y.nbytes() && std::equal(x.bytes(), x.bytes() + x.nbytes(), y.bytes());
    if (e.name.ends_with("input_scale") || e.name.ends_with("k_scale") ||
        e.name.ends_with("v_scale")) {
      scales_differ += !same;
    } else {
      EXPECT_TRUE(same) << e.name;
    }
  }
  EXPECT_GT(scales_differ, 0);
  // The default again on the bf16_ops export: another job's finished export, refused.
  RunResult again = run_strata(base + "--export_path '" + b.string() + "'", tmp.path());
  EXPECT_EQ(again.rc, 1);
  EXPECT_NE(again.err.find("holds the finished export of another job (changed: options)"),
            std::string::npos)
      << again.err;
}

TEST(Quantize, UnmatchedRecipeRuleWarns) {
  TempDir tmp;
  write_file(tmp.path() / "r.yaml",
             "description: test\nkv_cache: none\nrules:\n  - {pattern: \"*.mlp.*\", format: fp8}\n"
             "  - {pattern: \"*.experts.*\", format: nvfp4}\n");
  RunResult r = run_strata("quantize --model '" + kFixtures + "llama' --recipe '" +
                               (tmp.path() / "r.yaml").string() + "' --dry-run",
                           tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("rule 2: pattern '*.experts.*' matches no linear module"), std::string::npos)
      << r.out;
}

}  // namespace

// --eval_data FILE: after the run, the comparison of `strata compare MODEL EXPORT --tokens FILE`,
// its headline printed in the summary; the numbers equal those of strata compare run apart on
// the same files (the same code path and data: exactly, and --eval_json byte for byte).
TEST(Quantize, EvalDataPrintsWhatCompareFinds) {
  TempDir tmp;
  write_tokens(tmp.path() / "t.jsonl");
  const fs::path out = tmp.path() / "out", tokens = tmp.path() / "t.jsonl";
  RunResult r = run_strata("quantize -q --device cpu --model '" + kFixtures +
                               "qwen3_moe' --recipe nvfp4-kv_fp8 --calib_data '" + tokens.string() +
                               "' --calib_size 3 --export_path '" + out.string() +
                               "' --eval_data '" + tokens.string() + "' --eval_json '" +
                               (tmp.path() / "eval.json").string() + "'",
                           tmp.path());
  ASSERT_EQ(r.rc, 0) << r.err;
  RunResult c =
      run_strata("compare -q '" + kFixtures + "qwen3_moe' '" + out.string() + "' --tokens '" +
                     tokens.string() + "' --json '" + (tmp.path() / "compare.json").string() + "'",
                 tmp.path());
  ASSERT_EQ(c.rc, 0) << c.err;
  // compare's headline: from "KL divergence" to the perplexity line.
  const size_t from = c.out.find("KL divergence (source || quantized) per position\n");
  const size_t to = c.out.find('\n', c.out.find("perplexity  source"));
  ASSERT_NE(from, std::string::npos) << c.out;
  ASSERT_NE(to, std::string::npos) << c.out;
  const std::string headline = c.out.substr(from, to + 1 - from);
  EXPECT_NE(r.out.find("--tokens " + tokens.string() +
                       ", layers on the CPU): 3 sequences, 16 tokens\n" + headline),
            std::string::npos)
      << "quantize:\n"
      << r.out << "\ncompare:\n"
      << c.out;
  EXPECT_EQ(read_file(tmp.path() / "eval.json"), read_file(tmp.path() / "compare.json"));
}

// A bad --eval_data fails with one line before any work: no export folder is made.
TEST(Quantize, BadEvalDataFailsBeforeAnyWork) {
  TempDir tmp;
  write_tokens(tmp.path() / "t.jsonl");
  write_file(tmp.path() / "bad.jsonl", "[1, 2, 3]\n[4, \"x\"]\n");
  write_file(tmp.path() / "text.txt", "some text to compare on\n");
  const std::string base = "quantize --device cpu --model '" + kFixtures +
                           "qwen3_moe' --calib_data '" + (tmp.path() / "t.jsonl").string() +
                           "' --calib_size 3 --export_path '" + (tmp.path() / "o").string() + "' ";
  struct Case {
    std::string args, needle;
  } cases[] = {
      {"--eval_data '" + (tmp.path() / "missing.jsonl").string() + "'",
       "missing.jsonl: --eval_data does not exist"},
      {"--eval_data '" + (tmp.path() / "bad.jsonl").string() + "'", "bad.jsonl"},
      {"--eval_data '" + (tmp.path() / "text.txt").string() + "'",
       "--eval_data is text, and " + kFixtures + "qwen3_moe has no tokenizer"},
      {"--eval_json x.json", "--eval_json needs --eval_data"},
      {"--eval_data '" + (tmp.path() / "t.jsonl").string() + "' --eval_json '" +
           (tmp.path() / "no" / "e.json").string() + "'",
       "--eval_json's folder"},
  };
  for (const Case& c : cases) {
    RunResult r = run_strata(base + c.args, tmp.path());
    EXPECT_EQ(r.rc, 1) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(tmp.path() / "o")) << c.args;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  RunResult help = run_strata("quantize --help", tmp.path());
  EXPECT_NE(help.out.find("--eval_data FILE"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("on --device with --max_gpu_memory_gb"), std::string::npos) << help.out;
}
