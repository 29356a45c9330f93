// The pure steps of run_quantize (engine/quantize_steps.h). Every expected value is worked out by
// hand from the rule in the header, the working in the comments.
#include "engine/quantize_steps.h"

#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/safetensors_writer.h"

namespace strata {
namespace {

// Sequences of lengths 3, 1, 4, 1, 5; the token ids are the sequence's index.
std::vector<std::vector<int32_t>> five_sequences() {
  return {{0, 0, 0}, {1}, {2, 2, 2, 2}, {3}, {4, 4, 4, 4, 4}};
}

TEST(GroupMicroBatches, ConsecutiveSequencesBatchSizeAtATime) {
  // batch 2: {3,1} {4,1} {5} -> tokens 4, 5, 5; longest sequence 5.
  const MicroBatches mb = group_micro_batches(five_sequences(), 2);
  ASSERT_EQ(mb.groups.size(), 3u);
  EXPECT_EQ(mb.tokens, (std::vector<int64_t>{4, 5, 5}));
  EXPECT_EQ(mb.longest, 5);
  ASSERT_EQ(mb.groups[1].size(), 2u);
  EXPECT_EQ(mb.groups[1][0], (std::vector<int32_t>{2, 2, 2, 2}));
  EXPECT_EQ(mb.groups[1][1], (std::vector<int32_t>{3}));
  ASSERT_EQ(mb.groups[2].size(), 1u);
  EXPECT_EQ(mb.groups[2][0][0], 4);
}

TEST(GroupMicroBatches, EdgeSizes) {
  // batch 0 counts as 1: one micro-batch per sequence.
  EXPECT_EQ(group_micro_batches(five_sequences(), 0).tokens, (std::vector<int64_t>{3, 1, 4, 1, 5}));
  // batch larger than the count: one micro-batch of 3+1+4+1+5 = 14 tokens.
  const MicroBatches one = group_micro_batches(five_sequences(), 10);
  EXPECT_EQ(one.tokens, (std::vector<int64_t>{14}));
  EXPECT_EQ(one.groups.size(), 1u);
  // No sequences (weight-only): nothing.
  const MicroBatches none = group_micro_batches({}, 8);
  EXPECT_TRUE(none.groups.empty());
  EXPECT_TRUE(none.tokens.empty());
  EXPECT_EQ(none.longest, 0);
}

// The names a run asks into the page cache before its plan exists: the embedding, final norm and
// lm_head, and layer 0's tensors, at the start of a name or after a dot (wrappers); not layer 1,
// 10 or 30, nor a norm inside a layer other than 0.
TEST(FirstStepTensors, TheHeadAndLayerZeroByName) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("strata_first_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::vector<std::string> taken = {"model.embed_tokens.weight",
                                          "lm_head.weight",
                                          "model.norm.weight",
                                          "model.layers.0.self_attn.q_proj.weight",
                                          "model.layers.0.linear_attn.norm.weight",
                                          "language_model.model.layers.0.mlp.gate.weight",
                                          "language_model.model.embed_tokens.weight",
                                          "layers.0.attention.wq.weight"};
  const std::vector<std::string> left = {
      "model.layers.1.self_attn.q_proj.weight", "model.layers.10.mlp.gate.weight",
      "model.layers.30.input_layernorm.weight", "model.layers.3.linear_attn.norm.weight",
      "vision_tower.blocks.0.norm.weight",      "model.xlayers.0.weight"};
  NamedTensors tensors;
  for (const auto* list : {&taken, &left}) {
    for (const std::string& n : *list)
      tensors.emplace_back(n, Tensor::scalar_f32(1.0f));
  }
  write_safetensors((dir / "model.safetensors").string(), tensors);
  const Checkpoint ckpt = Checkpoint::open(dir.string());
  std::vector<std::string> want = taken;
  std::sort(want.begin(), want.end());
  std::vector<std::string> got = first_step_tensors(ckpt);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, want);
  std::filesystem::remove_all(dir);
}

TEST(UseExpertParallel, OnlyWithRanksAForwardOnTheCpuAndExperts) {
  EXPECT_TRUE(use_expert_parallel(true, 2, true, false, 8));
  EXPECT_FALSE(use_expert_parallel(false, 2, true, false, 8));  // not asked
  EXPECT_FALSE(use_expert_parallel(true, 1, true, false, 8));   // one process
  EXPECT_FALSE(use_expert_parallel(true, 2, false, false, 8));  // weight-only
  EXPECT_FALSE(use_expert_parallel(true, 2, true, true, 8));    // GPU forward without NCCL
  EXPECT_FALSE(use_expert_parallel(true, 2, true, false, 0));   // dense model
}

// fixed = 2 x (100 + 10) + 5 + 3 + 2 + 0 = 230 calibrating; all micro-batches 1000, one 300:
// total 1230 in memory, least 230 + 300 = 530 spilled.
MemoryEstimate calibrated_estimate() {
  MemoryEstimate m;
  m.layer_weights = 100;
  m.layer_source = 10;
  m.quantizer = 5;
  m.outside_pages = 3;
  m.working = 2;
  m.baseline = 0;
  m.activations_all = 1000;
  m.activations_one = 300;
  m.activations = 1000;
  m.calibrated = true;
  return m;
}

TEST(FitMemoryCap, SpillsWhenTheStoreDoesNotFitBesideTheRest) {
  ASSERT_EQ(calibrated_estimate().fixed(), 230u);
  // No cap: in memory.
  MemoryEstimate m = fit_memory_cap(calibrated_estimate(), 0, std::nullopt);
  EXPECT_FALSE(m.spilled);
  EXPECT_EQ(m.total(), 1230u);
  // cap 1230 leaves 1000 for the store: it fits exactly.
  m = fit_memory_cap(calibrated_estimate(), 1230, std::nullopt);
  EXPECT_FALSE(m.spilled);
  EXPECT_EQ(m.activations, 1000u);
  // cap 1229 leaves 999: spilled, one micro-batch held, total 530.
  m = fit_memory_cap(calibrated_estimate(), 1229, std::nullopt);
  EXPECT_TRUE(m.spilled);
  EXPECT_EQ(m.activations, 300u);
  EXPECT_EQ(m.total(), 530u);
  // cap 530 is the least: still runs, spilled.
  EXPECT_TRUE(fit_memory_cap(calibrated_estimate(), 530, std::nullopt).spilled);
  // The test budget replaces the cap's: 999 < 1000 spills without a cap, 1000 does not.
  EXPECT_TRUE(fit_memory_cap(calibrated_estimate(), 0, 999).spilled);
  EXPECT_FALSE(fit_memory_cap(calibrated_estimate(), 0, 1000).spilled);
}

TEST(FitMemoryCap, RefusesACapBelowTheLeast) {
  try {
    fit_memory_cap(calibrated_estimate(), 529, std::nullopt);
    FAIL() << "a cap of 529 bytes below the least, 530, was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--max_cpu_memory_gb"), std::string::npos) << what;
    EXPECT_NE(what.find("below the least this run needs, 530 B with the activation store spilled"),
              std::string::npos)
        << what;
  }
  // Weight-only: fixed = 1 x (100 + 10) + 5 + 3 + 2 = 120, no store; never spilled.
  MemoryEstimate w = calibrated_estimate();
  w.calibrated = false;
  w.activations_all = w.activations_one = w.activations = 0;
  const MemoryEstimate fits = fit_memory_cap(w, 120, std::nullopt);
  EXPECT_FALSE(fits.spilled);
  EXPECT_EQ(fits.total(), 120u);
  try {
    fit_memory_cap(w, 119, std::nullopt);
    FAIL() << "a cap of 119 bytes below the least, 120, was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("below the least this run needs, 120 B: "), std::string::npos) << what;
  }
}

TEST(MemoryEstimate, CountsTheMeasuredBaselineAndTheStartUpPeak) {
  // A baseline of 70 adds to every term: fixed 300, total 1300, least 300 + 300 = 600.
  MemoryEstimate m = calibrated_estimate();
  m.baseline = 70;
  EXPECT_EQ(m.fixed(), 300u);
  EXPECT_EQ(m.total(), 1300u);
  EXPECT_EQ(m.minimum(), 600u);
  EXPECT_NE(m.describe().find("process baseline 70 B"), std::string::npos) << m.describe();
  // A start-up that peaked above the rest is the bound: never below what was already reached.
  m.startup_peak = 2000;
  EXPECT_EQ(m.total(), 2000u);
  EXPECT_EQ(m.minimum(), 2000u);
  EXPECT_NE(m.describe().find("start-up peaked at 1.95 KiB"), std::string::npos) << m.describe();
  // Three exporter workers quantize three modules at once: 3 x 5 instead of 5; threads 8 more:
  // fixed 300 + 10 + 8 = 318.
  m.startup_peak = 0;
  m.workers = 3;
  m.threads = 8;
  EXPECT_EQ(m.fixed(), 318u);
  EXPECT_NE(m.describe().find("3 x quantizer temporaries 5 B"), std::string::npos) << m.describe();
}

// The GPU path before the context: codes at half the fp32 weights (50), pinned = 2 x 40 blob +
// one micro-batch 300 = 380, the allowance: fixed = 2 x (50 + 10) + 5 + 3 + 2 + 380 + allowance =
// 510 + allowance. The least checked up front leaves the allowance out: 510 + 300 = 810.
TEST(FitMemoryCap, GpuPathCountsPinnedBuffersAndTheContextAllowance) {
  const MemoryEstimate g = with_gpu_host_memory(calibrated_estimate(), 40);
  EXPECT_EQ(g.layer_weights, 50u);
  EXPECT_EQ(g.pinned, 380u);
  EXPECT_EQ(g.device_context, kCudaContextAllowance);
  EXPECT_EQ(g.fixed(), 510u + kCudaContextAllowance);
  // cap 810: accepted, and spilled (the allowance leaves the store no room).
  EXPECT_TRUE(fit_memory_cap(g, 810, std::nullopt).spilled);
  // No cap: the store stays (pinned host memory or the device).
  EXPECT_FALSE(fit_memory_cap(g, 0, std::nullopt).spilled);
  try {
    fit_memory_cap(g, 809, std::nullopt);
    FAIL() << "a cap of 809 bytes below the least before the context, 810, was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("below the least this run needs, 810 B with the activation store spilled, "
                        "before the CUDA context's"),
              std::string::npos)
        << what;
  }
}

// Once the placement exists: RSS 5000 measured, baseline 70, pinned blobs and stage 150; L the
// lazy-loading allowance. Hidden states on the device: context = 5000 - 70 - 150 + L = 4780 + L;
// total = 70 + 2 x (50 + 10) + 5 + 3 + 2 + 150 + 4780 + L = 5130 + L = the RSS measured + the
// terms still to come (120 + 10) + L. Hidden states pinned (1000): context 3780 + L, the same
// total; least without them 4130 + L.
TEST(FitMemoryCap, GpuPathTakesTheMeasuredContext) {
  const uint64_t L = kCudaLazyLoadingAllowance;
  MemoryEstimate g = with_gpu_host_memory(calibrated_estimate(), 40);
  g.baseline = 70;
  const MemoryEstimate dev = with_measured_context(g, 5000, 150, 0);
  EXPECT_TRUE(dev.context_measured);
  EXPECT_EQ(dev.device_context, 4780u + L);
  EXPECT_EQ(dev.total(), 5130u + L);
  EXPECT_EQ(dev.minimum(), 5130u + L);
  EXPECT_NE(dev.describe().find(" (measured, + lazy loading)"), std::string::npos)
      << dev.describe();
  const MemoryEstimate pinned = with_measured_context(g, 5000, 150, 1000);
  EXPECT_EQ(pinned.device_context, 3780u + L);
  EXPECT_EQ(pinned.total(), 5130u + L);
  EXPECT_EQ(pinned.minimum(), 4130u + L);
  // An RSS below what is known (the buffers not yet resident) gives no negative context.
  EXPECT_EQ(with_measured_context(g, 100, 150, 0).device_context, L);
  check_memory_cap(dev, 5130 + L, "once the CUDA context exists");
  check_memory_cap(dev, 0, "once the CUDA context exists");
  try {
    check_memory_cap(dev, 5129 + L, "once the CUDA context exists");
    FAIL() << "a cap of 1 byte below the measured bound was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("is below this run's memory bound once the CUDA context exists, " +
                        human_bytes(static_cast<double>(5130 + L))),
              std::string::npos)
        << what;
  }
}

TEST(FitMemoryCap, CheckBeforeTheContextLeavesTheAllowanceOut) {
  // Spilled under a cap of 810: 510 + 300 (one micro-batch) + the allowance; the check before
  // the context holds 810 to the cap.
  const MemoryEstimate g =
      fit_memory_cap(with_gpu_host_memory(calibrated_estimate(), 40), 810, std::nullopt);
  ASSERT_TRUE(g.spilled);
  check_memory_cap(g, 810, "once the exporter exists");
  try {
    check_memory_cap(g, 809, "once the exporter exists");
    FAIL() << "a cap of 809 bytes below 810 was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("below this run's memory bound once the exporter exists, 810 B before the "
                        "CUDA context's"),
              std::string::npos)
        << what;
  }
}

std::map<std::string, std::string> identity(const std::string& recipe) {
  return {{"source", "a"},
          {"recipe", recipe},
          {"calibration", "c"},
          {"options", "o"},
          {"version", "v"}};
}

TEST(ResumedState, FreshWithoutAManifest) {
  EXPECT_FALSE(resumed_state(std::nullopt, identity("r"), 6, "m.json").has_value());
}

TEST(ResumedState, ResumesTheSameJob) {
  ResumeState prev;
  prev.identity = identity("r");
  prev.steps = 6;
  prev.next_step = 3;
  prev.hidden_file = "hidden-3.safetensors";
  const std::optional<ResumeState> s = resumed_state(prev, identity("r"), 6, "m.json");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->next_step, 3);
  EXPECT_EQ(s->hidden_file, "hidden-3.safetensors");
}

TEST(ResumedState, RefusesAnotherJobNamingThePart) {
  ResumeState prev;
  prev.identity = identity("r");
  prev.steps = 6;
  try {
    resumed_state(prev, identity("other"), 6, "m.json");
    FAIL() << "a manifest of another recipe was resumed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("m.json records an interrupted run of another job "
                                         "(changed: recipe)"),
              std::string::npos)
        << e.what();
  }
  prev.steps = 5;
  try {
    resumed_state(prev, identity("r"), 6, "m.json");
    FAIL() << "a manifest of 5 steps was resumed by a run of 6";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("malformed resume manifest (5 steps, this run has 6)"),
              std::string::npos)
        << e.what();
  }
}

TEST(QuantizeSteps, ExpertRanges) {
  // 8 over 2: [0, 4) and [4, 8).
  EXPECT_EQ(expert_ranges(8, 2), "rank 0: 0-3, rank 1: 4-7");
  // 10 over 3: floor(10r/3) = 0, 3, 6, 10.
  EXPECT_EQ(expert_ranges(10, 3), "rank 0: 0-2, rank 1: 3-5, rank 2: 6-9");
}

TEST(QuantizeSteps, ResumePointAndFirstLayer) {
  // 4 layers: step 0 the head, 1..4 the layers 0..3, then the config files (next step 5).
  EXPECT_EQ(resume_point(1, 4), "layer 1/4");
  EXPECT_EQ(resume_point(4, 4), "layer 4/4");
  EXPECT_EQ(resume_point(5, 4), "the config files");
  EXPECT_EQ(first_layer_to_run(0, 4), 0);
  EXPECT_EQ(first_layer_to_run(1, 4), 0);
  EXPECT_EQ(first_layer_to_run(3, 4), 2);
  EXPECT_EQ(first_layer_to_run(5, 4), 4);
}

TEST(QuantizeSteps, ResumeFolderAndManifestNames) {
  QuantizeJob job;
  job.export_path = "/x/out";
  EXPECT_EQ(resume_dir_of(job), "/x/out.strata_resume");
  job.resume_dir = "/r";
  EXPECT_EQ(resume_dir_of(job), "/r");
  EXPECT_EQ(manifest_name("/r/hidden-3.safetensors", "/r"), "hidden-3.safetensors");
  EXPECT_EQ(manifest_name("/spill/hidden-3.safetensors", "/r"), "/spill/hidden-3.safetensors");
}

TEST(QuantizeSteps, LockstepRounds) {
  // Expert parallel, 5 micro-batches over 2 ranks: 3 rounds; rank 1 runs 1, 3, then 5 (none).
  EXPECT_EQ(lockstep_rounds(5, true, 2), 3u);
  EXPECT_EQ(round_micro_batch(0, true, 2, 1), 1u);
  EXPECT_EQ(round_micro_batch(1, true, 2, 1), 3u);
  EXPECT_EQ(round_micro_batch(2, true, 2, 1), 5u);
  EXPECT_EQ(round_micro_batch(2, true, 2, 0), 4u);
  // Otherwise every micro-batch is a round, whatever the ranks.
  EXPECT_EQ(lockstep_rounds(5, false, 2), 5u);
  EXPECT_EQ(round_micro_batch(3, false, 2, 1), 3u);
}

TEST(QuantizeSteps, HumanBytes) {
  EXPECT_EQ(human_bytes(512), "512 B");
  EXPECT_EQ(human_bytes(1536), "1.50 KiB");             // 1536 / 1024
  EXPECT_EQ(human_bytes(3.0 * (1 << 30)), "3.00 GiB");  // 3 x 1024^3
}

TEST(QuantizeSteps, NeedsActivations) {
  QuantPlan plan;
  plan.recipe.kv_cache = KvCacheFormat::kNone;
  PlannedModule m;
  m.format = QFormat::kMxfp8;
  plan.modules.push_back(m);
  m.format = QFormat::kW4A16Nvfp4;
  plan.modules.push_back(m);
  EXPECT_FALSE(needs_activations(plan));  // weight-only formats
  plan.recipe.kv_cache = KvCacheFormat::kFp8;
  EXPECT_TRUE(needs_activations(plan));  // k/v scales
  plan.recipe.kv_cache = KvCacheFormat::kNone;
  m.format = QFormat::kFp8;
  plan.modules.push_back(m);
  EXPECT_TRUE(needs_activations(plan));  // an input scale
}

// local_hessian's device bytes: 16 doubles per input feature of each tracked module, the largest
// layer's; a routed projection counts every expert of the layer once any of them is tracked.
TEST(QuantizeSteps, LocalHessianDeviceBytes) {
  QuantPlan plan;
  auto add = [&](const std::string& name, int64_t layer, QFormat f, int64_t in) {
    PlannedModule m;
    m.module = name;
    m.layer = layer;
    m.format = f;
    m.shape = {8, in};
    plan.modules.push_back(m);
  };
  const std::string l0 = "model.layers.0.", l1 = "model.layers.1.";
  add(l0 + "self_attn.q_proj", 0, QFormat::kNvfp4, 64);
  add(l0 + "self_attn.o_proj", 0, QFormat::kFp8, 128);  // not searched: not counted
  add(l1 + "self_attn.q_proj", 1, QFormat::kW4A16Nvfp4, 64);
  add(l1 + "mlp.experts.3.gate_proj", 1, QFormat::kNvfp4, 64);
  add(l1 + "mlp.experts.5.gate_proj", 1, QFormat::kNvfp4, 64);  // the same projection
  add(l1 + "mlp.experts.3.down_proj", 1, QFormat::kNvfp4, 32);
  plan.num_layers = 2;
  EXPECT_EQ(local_hessian_device_bytes(plan, 0, 10), 0u);  // max calibration
  plan.recipe.algorithm.method = WeightCalib::Method::kLocalHessian;
  // Layer 1: 64 + 10 x 64 (gate) + 10 x 32 (down) features; layer 0: 64.
  EXPECT_EQ(local_hessian_device_bytes(plan, 0, 10), (64u + 640u + 320u) * 16 * 8);
  EXPECT_EQ(local_hessian_device_bytes(plan, 0, 0), (64u + 64u + 32u) * 16 * 8);
}

}  // namespace
}  // namespace strata
