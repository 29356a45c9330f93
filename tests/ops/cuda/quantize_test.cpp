// The CUDA backend's weight quantization (weight_amaxes, quantize_weight) against the CPU
// backend's, byte for byte, on the same bf16 weights; the amaxes also against a max computed here.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/cpu_backend.h"
#include "ops/cuda/cuda_backend.h"
#include "quant/scale_search.h"
#include "tests/ops/cuda/cuda_test_util.h"

namespace strata::ops::cuda {
namespace {

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.bytes(), b.bytes(), a.nbytes()) == 0;
}

TEST_F(CudaOps, WeightQuantizationIsTheCpuBackends) {
  const int64_t R = 96, C = 256;
  std::vector<std::vector<uint16_t>> host;
  for (float sd : {0.02f, 1.5f, 300.0f}) {
    std::vector<uint16_t> v;
    for (float x : normal(static_cast<size_t>(R * C), sd))
      v.push_back(f32_to_bf16(x));
    host.push_back(std::move(v));
  }
  std::vector<gpu::DeviceBuffer> dev;
  for (const auto& v : host)
    dev.push_back(up(v));
  CudaBackend gpu_be(budget(), s(), CudaBackendOptions{}, 4, 0);
  gpu_be.reserve_scratch(static_cast<uint64_t>(R * C + R * C / 16));
  gpu_be.use_for_quantization(0);
  CpuBackend cpu_be(nullptr, nullptr);
  auto on = [&](bool device, size_t i) {
    return StoredWeight{device ? dev[i].data() : static_cast<const void*>(host[i].data()),
                        DType::kBF16, R, C};
  };
  // Groups {0, 1}, {2}, {1, 2, 0}.
  const std::vector<std::vector<size_t>> groups = {{0, 1}, {2}, {1, 2, 0}};
  std::vector<std::vector<StoredWeight>> gd, gh;
  for (const auto& g : groups) {
    gd.emplace_back();
    gh.emplace_back();
    for (size_t i : g) {
      gd.back().push_back(on(true, i));
      gh.back().push_back(on(false, i));
    }
  }
  float ad[3], ah[3];
  gpu_be.weight_amaxes(gd, ad);
  cpu_be.weight_amaxes(gh, ah);
  for (size_t g = 0; g < groups.size(); ++g) {
    float want = 0.0f;
    for (size_t i : groups[g])
      for (uint16_t b : host[i])
        want = std::max(want, std::fabs(strata::bf16_to_f32(b)));
    EXPECT_EQ(bits_of(ad[g]), bits_of(want)) << g;
    EXPECT_EQ(bits_of(ah[g]), bits_of(want)) << g;
  }
  for (size_t i = 0; i < host.size(); ++i) {
    const float a = ah[2];
    const QuantizedWeight n4d = gpu_be.quantize_weight(on(true, i), QFormat::kNvfp4, a, "w");
    const QuantizedWeight n4h = cpu_be.quantize_weight(on(false, i), QFormat::kNvfp4, a, "w");
    EXPECT_TRUE(same_bytes(n4d.nvfp4->packed, n4h.nvfp4->packed)) << i;
    EXPECT_TRUE(same_bytes(n4d.nvfp4->block_scale, n4h.nvfp4->block_scale)) << i;
    EXPECT_EQ(n4d.nvfp4->global_scale.item_f32(0), n4h.nvfp4->global_scale.item_f32(0)) << i;
    for (const bool fp32_quotient : {false, true}) {  // 2-D, and a stacked (gpt-oss) expert
      StoredWeight wd = on(true, i), wh = on(false, i);
      wd.fp32_quotient = wh.fp32_quotient = fp32_quotient;
      const QuantizedWeight f8d = gpu_be.quantize_weight(wd, QFormat::kFp8, a, "w");
      const QuantizedWeight f8h = cpu_be.quantize_weight(wh, QFormat::kFp8, a, "w");
      EXPECT_TRUE(same_bytes(f8d.fp8->weight, f8h.fp8->weight)) << i << " " << fp32_quotient;
      EXPECT_EQ(f8d.fp8->scale.item_f32(0), f8h.fp8->scale.item_f32(0)) << i;
    }
    const QuantizedWeight mxd = gpu_be.quantize_weight(on(true, i), QFormat::kMxfp8, 0.0f, "w");
    const QuantizedWeight mxh = cpu_be.quantize_weight(on(false, i), QFormat::kMxfp8, 0.0f, "w");
    EXPECT_TRUE(same_bytes(mxd.mxfp8->weight, mxh.mxfp8->weight)) << i;
    EXPECT_TRUE(same_bytes(mxd.mxfp8->scale, mxh.mxfp8->scale)) << i;
  }
}

// quantize_weights, the batch the device quantizer hands a layer to: a run of NVFP4 weights larger
// than the pinned stage (so brought back in several synchronizations), FP8 and MXFP8 jobs and
// searched NVFP4 ones among them, gives each job the CPU backend's quantize_weight bytes; with
// failing jobs, the first one's error is thrown, whether a later one fails on the device (|W|
// above its amax) or already on the host (amax 0).
TEST_F(CudaOps, BatchedWeightQuantizationIsTheCpuBackends) {
  const int64_t R = 256, C = 1024;  // 147 KB of NVFP4 codes a weight: 300 of them fill 44 MB
  std::vector<std::vector<uint16_t>> host;
  std::vector<float> amax;
  for (float sd : {0.02f, 0.7f, 40.0f, 3.0f}) {
    std::vector<uint16_t> v;
    float m = 0.0f;
    for (float x : normal(static_cast<size_t>(R * C), sd)) {
      v.push_back(f32_to_bf16(x));
      m = std::max(m, std::fabs(strata::bf16_to_f32(v.back())));
    }
    host.push_back(std::move(v));
    amax.push_back(m);
  }
  std::vector<gpu::DeviceBuffer> dev;
  for (const auto& v : host)
    dev.push_back(up(v));
  CudaBackend gpu_be(budget(), s(), CudaBackendOptions{}, 4, 0);
  gpu_be.reserve_scratch(static_cast<uint64_t>(R * C + R * C / 16));
  gpu_be.use_for_quantization(0);
  CpuBackend cpu_be(nullptr, nullptr);
  WeightCalib mse;
  mse.method = WeightCalib::Method::kMse;
  const WeightSearch search{mse, {}};
  const int n = 300;
  std::vector<std::string> names;
  for (int i = 0; i < n; ++i)
    names.push_back("w" + std::to_string(i));
  std::vector<WeightJob> gd, gh;
  for (int i = 0; i < n; ++i) {
    const size_t w = static_cast<size_t>(i) % host.size();
    WeightJob j{StoredWeight{dev[w].data(), DType::kBF16, R, C}, QFormat::kNvfp4, amax[w] * 1.25f,
                names[static_cast<size_t>(i)]};
    if (i % 37 == 5) j.format = QFormat::kFp8;
    if (i == 123) j.format = QFormat::kMxfp8;
    if (i % 41 == 7) j.search = &search;
    gd.push_back(j);
    j.weight.data = host[w].data();
    gh.push_back(j);
  }
  const std::vector<QuantizedWeight> d = gpu_be.quantize_weights(gd);
  ASSERT_EQ(d.size(), gd.size());
  int checked = 0;
  for (int i = 0; i < n; ++i) {
    const WeightJob& j = gh[static_cast<size_t>(i)];
    const QuantizedWeight h = cpu_be.quantize_weight(j.weight, j.format, j.amax, j.name, j.search);
    const QuantizedWeight& g = d[static_cast<size_t>(i)];
    if (j.format == QFormat::kNvfp4) {
      ASSERT_TRUE(g.nvfp4.has_value()) << i;
      EXPECT_TRUE(same_bytes(g.nvfp4->packed, h.nvfp4->packed)) << i;
      EXPECT_TRUE(same_bytes(g.nvfp4->block_scale, h.nvfp4->block_scale)) << i;
      EXPECT_EQ(bits_of(g.nvfp4->global_scale.item_f32(0)),
                bits_of(h.nvfp4->global_scale.item_f32(0)))
          << i;
    } else if (j.format == QFormat::kFp8) {
      ASSERT_TRUE(g.fp8.has_value()) << i;
      EXPECT_TRUE(same_bytes(g.fp8->weight, h.fp8->weight)) << i;
    } else {
      ASSERT_TRUE(g.mxfp8.has_value()) << i;
      EXPECT_TRUE(same_bytes(g.mxfp8->weight, h.mxfp8->weight)) << i;
      EXPECT_TRUE(same_bytes(g.mxfp8->scale, h.mxfp8->scale)) << i;
    }
    ++checked;
  }
  EXPECT_EQ(checked, n);

  auto message = [&](const std::vector<WeightJob>& jobs) {
    try {
      gpu_be.quantize_weights(jobs);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::vector<WeightJob> bad = gd;
  bad[150].amax = amax[150 % host.size()] / 4;  // |W| above it: found on the device
  bad[250].amax = amax[250 % host.size()] / 4;
  std::string e = message(bad);
  EXPECT_NE(e.find("w150 has |W| above the weight amax"), std::string::npos) << e;
  bad[200].amax = 0.0f;  // refused on the host, after job 150 was queued
  e = message(bad);
  EXPECT_NE(e.find("w150 has |W| above the weight amax"), std::string::npos) << e;
  bad[150].amax = gd[150].amax;
  e = message(bad);
  EXPECT_NE(e.find("weight amax 0 of w200"), std::string::npos) << e;
  // And the batch still works after errors.
  const std::vector<QuantizedWeight> again = gpu_be.quantize_weights(gd);
  EXPECT_TRUE(same_bytes(again[299].nvfp4->packed, d[299].nvfp4->packed));
}

// Searched NVFP4 block scales (mse's multipliers, fp8_scale_sweep, a narrower multiplier range)
// on the device are the CPU reference's (quant/scale_search.h), codes and scale bytes, for bf16
// and fp32 weights; the searches choose other scales than max calibration for some blocks (so the
// comparison is not of two max encodings); local_hessian's (ScaleSearchWithInputStatistics...).
TEST_F(CudaOps, ScaleSearchIsTheCpuBackends) {
  const int64_t R = 64, C = 512;
  std::vector<float> f32 = normal(static_cast<size_t>(R * C), 0.05f);
  for (size_t i = 0; i < f32.size(); i += 37)
    f32[i] *= 9.0f;  // outliers, so that blocks' best scales are not their own amax's
  std::vector<uint16_t> bf16;
  for (float x : f32)
    bf16.push_back(f32_to_bf16(x));
  float amax = 0.0f;
  for (float x : f32)
    amax = std::max(amax, std::fabs(x));
  gpu::DeviceBuffer d_bf16 = up(bf16), d_f32 = up(f32);
  CudaBackend gpu_be(budget(), s(), CudaBackendOptions{}, 4, 0);
  gpu_be.reserve_scratch(static_cast<uint64_t>(R * C + R * C / 16));
  gpu_be.use_for_quantization(0);
  CpuBackend cpu_be(nullptr, nullptr);
  WeightCalib mse;
  mse.method = WeightCalib::Method::kMse;
  WeightCalib sweep = mse;
  sweep.fp8_scale_sweep = true;
  WeightCalib narrow = mse;
  narrow.start_multiplier = 0.5;
  narrow.stop_multiplier = 1.5;
  narrow.step_size = 0.01;  // 101 multipliers
  for (const WeightCalib& calib : {mse, sweep, narrow}) {
    const WeightSearch search{calib, {}};
    for (const bool f : {false, true}) {
      const StoredWeight wd{f ? d_f32.data() : d_bf16.data(), f ? DType::kF32 : DType::kBF16, R, C};
      const StoredWeight wh{f ? static_cast<const void*>(f32.data()) : bf16.data(), wd.dtype, R, C};
      const std::string what = weight_calib_description(calib) + (f ? " f32" : " bf16");
      const QuantizedWeight d = gpu_be.quantize_weight(wd, QFormat::kNvfp4, amax, "w", &search);
      const QuantizedWeight h = cpu_be.quantize_weight(wh, QFormat::kNvfp4, amax, "w", &search);
      EXPECT_TRUE(same_bytes(d.nvfp4->packed, h.nvfp4->packed)) << what;
      EXPECT_TRUE(same_bytes(d.nvfp4->block_scale, h.nvfp4->block_scale)) << what;
      EXPECT_EQ(bits_of(d.nvfp4->global_scale.item_f32(0)),
                bits_of(h.nvfp4->global_scale.item_f32(0)));
      const QuantizedWeight plain = cpu_be.quantize_weight(wh, QFormat::kNvfp4, amax, "w");
      int64_t other = 0;
      for (int64_t b = 0; b < R * C / 16; ++b)
        other += plain.nvfp4->block_scale.bytes()[b] != d.nvfp4->block_scale.bytes()[b];
      EXPECT_GT(other, 0) << what << ": the search chose every block's max scale";
    }
  }
}

// local_hessian on the device: the block error weighted by the module's input statistics
// (BlockHessian::normalized() of correlated inputs), under the sweep (its default) and the
// multipliers, gives the CPU reference's codes and scale bytes; more rows than one launch group
// (256) and several column blocks; the statistics change the choice (not the squared error's);
// statistics of the wrong width are refused.
TEST_F(CudaOps, ScaleSearchWithInputStatisticsIsTheCpuBackends) {
  const int64_t R = 300, C = 96, tokens = 40;
  std::vector<float> f32 = normal(static_cast<size_t>(R * C), 0.05f);
  for (size_t i = 0; i < f32.size(); i += 29)
    f32[i] *= 7.0f;
  std::vector<uint16_t> bf16;
  for (float x : f32)
    bf16.push_back(f32_to_bf16(x));
  float amax = 0.0f;
  for (uint16_t b : bf16)
    amax = std::max(amax, std::fabs(strata::bf16_to_f32(b)));
  // Inputs whose features are correlated within blocks and differ in scale between them.
  std::vector<float> x = normal(static_cast<size_t>(tokens * C), 1.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t c = 1; c < C; ++c)
      x[static_cast<size_t>(t * C + c)] += 0.8f * x[static_cast<size_t>(t * C + c - 1)];
    for (int64_t c = 0; c < C; ++c)
      x[static_cast<size_t>(t * C + c)] *= 1.0f + static_cast<float>(c % 16) / 4.0f;
  }
  BlockHessian stats(C);
  stats.accumulate(x.data(), tokens);
  const std::vector<double> h = stats.normalized();
  gpu::DeviceBuffer d_bf16 = up(bf16);
  CudaBackend gpu_be(budget(), s(), CudaBackendOptions{}, 4, 0);
  gpu_be.reserve_scratch(static_cast<uint64_t>(R * C + R * C / 16));
  gpu_be.reserve_hessian(h.size() * sizeof(double));
  gpu_be.use_for_quantization(0);
  CpuBackend cpu_be(nullptr, nullptr);
  WeightCalib sweep;
  sweep.method = WeightCalib::Method::kLocalHessian;
  sweep.fp8_scale_sweep = true;
  WeightCalib mult = sweep;
  mult.fp8_scale_sweep = false;
  const StoredWeight wd{d_bf16.data(), DType::kBF16, R, C};
  const StoredWeight wh{bf16.data(), DType::kBF16, R, C};
  for (const WeightCalib& calib : {sweep, mult}) {
    const WeightSearch search{calib, h}, plain{calib, {}};
    const std::string what = weight_calib_description(calib);
    const QuantizedWeight d = gpu_be.quantize_weight(wd, QFormat::kNvfp4, amax, "w", &search);
    const QuantizedWeight c = cpu_be.quantize_weight(wh, QFormat::kNvfp4, amax, "w", &search);
    EXPECT_TRUE(same_bytes(d.nvfp4->packed, c.nvfp4->packed)) << what;
    EXPECT_TRUE(same_bytes(d.nvfp4->block_scale, c.nvfp4->block_scale)) << what;
    const QuantizedWeight p = cpu_be.quantize_weight(wh, QFormat::kNvfp4, amax, "w", &plain);
    int64_t other = 0;
    for (int64_t b = 0; b < R * C / 16; ++b)
      other += p.nvfp4->block_scale.bytes()[b] != d.nvfp4->block_scale.bytes()[b];
    EXPECT_GT(other, 0) << what << ": the statistics changed no block's choice";
  }
  const std::vector<double> narrow(h.begin(), h.begin() + static_cast<int64_t>(h.size()) / 2);
  const WeightSearch wrong{sweep, narrow};
  EXPECT_THROW(gpu_be.quantize_weight(wd, QFormat::kNvfp4, amax, "w", &wrong), Error);
}

// The device's checks come back with the codes (one synchronization a weight): a NaN, and |W|
// above the amax given, are one-line errors naming the element or row the CPU backend's name;
// the backend quantizes the next weight normally after each.
TEST_F(CudaOps, WeightQuantizationRefusesWhatTheCpuRefuses) {
  const int64_t R = 8, C = 64;
  std::vector<uint16_t> good;
  for (float x : normal(static_cast<size_t>(R * C), 1.0f))
    good.push_back(f32_to_bf16(x));
  float amax = 0.0f;
  for (uint16_t b : good)
    amax = std::max(amax, std::fabs(strata::bf16_to_f32(b)));
  int64_t first_row = -1;  // the first row with |W| above amax / 2
  for (int64_t i = 0; i < R * C && first_row < 0; ++i) {
    if (std::fabs(strata::bf16_to_f32(good[static_cast<size_t>(i)])) > amax / 2) first_row = i / C;
  }
  std::vector<uint16_t> nan = good;
  nan[3 * C + 17] = 0x7FC0;  // flat element 209
  CudaBackend gpu_be(budget(), s(), CudaBackendOptions{}, 4, 0);
  gpu_be.reserve_scratch(static_cast<uint64_t>(R * C));
  gpu_be.use_for_quantization(0);
  CpuBackend cpu_be(nullptr, nullptr);
  auto message = [](const auto& run) {
    try {
      run();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  gpu::DeviceBuffer d_good = up(good), d_nan = up(nan);
  struct Case {
    gpu::DeviceBuffer* dev;
    const std::vector<uint16_t>* host;
    float amax;
    std::string gpu_says, cpu_says;
  } cases[] = {
      {&d_nan, &nan, amax, "NaN or infinite element at flat index 209", "flat element 209"},
      {&d_good, &good, amax / 2, "has |W| above the weight amax",
       "in row " + std::to_string(first_row) + ","},
  };
  for (const Case& c : cases) {
    const std::string cpu = message([&] {
      cpu_be.quantize_weight(StoredWeight{c.host->data(), DType::kBF16, R, C}, QFormat::kNvfp4,
                             c.amax, "w");
    });
    EXPECT_NE(cpu.find(c.cpu_says), std::string::npos) << cpu;
    const std::string gpu = message([&] {
      gpu_be.quantize_weight(StoredWeight{c.dev->data(), DType::kBF16, R, C}, QFormat::kNvfp4,
                             c.amax, "w");
    });
    EXPECT_NE(gpu.find("nvfp4: tensor w has"), std::string::npos) << gpu;
    EXPECT_NE(gpu.find(c.gpu_says), std::string::npos) << gpu;
    if (c.amax < amax) {
      EXPECT_NE(gpu.find("in row " + std::to_string(first_row) + ";"), std::string::npos) << gpu;
    }
    const QuantizedWeight ok = gpu_be.quantize_weight(
        StoredWeight{d_good.data(), DType::kBF16, R, C}, QFormat::kNvfp4, amax, "w");
    const QuantizedWeight ref = cpu_be.quantize_weight(
        StoredWeight{good.data(), DType::kBF16, R, C}, QFormat::kNvfp4, amax, "w");
    EXPECT_TRUE(same_bytes(ok.nvfp4->packed, ref.nvfp4->packed));
    EXPECT_TRUE(same_bytes(ok.nvfp4->block_scale, ref.nvfp4->block_scale));
  }
}

}  // namespace
}  // namespace strata::ops::cuda
