// CPU quantization speed of the scalar references (core/dtype.h conversions) and of the fast
// bit-identical encoders (quant/encode.h), in MB/s of bf16 input on one core, for a [4096, 4096]
// weight; then what a large zeroed tensor costs until it is written. Usage: quant_bench [rows cols]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "core/dtype.h"
#include "core/tensor.h"
#include "quant/fp8.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"

namespace {

using strata::quant_detail::Encoders;

// Runs `fn` until at least half a second has passed (at least once); returns seconds per run.
double time_it(const std::function<void()>& fn) {
  using clock = std::chrono::steady_clock;
  int runs = 0;
  const auto start = clock::now();
  double elapsed = 0;
  do {
    fn();
    ++runs;
    elapsed = std::chrono::duration<double>(clock::now() - start).count();
  } while (elapsed < 0.5);
  return elapsed / runs;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 2 ? std::atoll(argv[1]) : 4096;
  const int64_t cols = argc > 2 ? std::atoll(argv[2]) : 4096;
  strata::Tensor w = strata::Tensor::zeros(strata::DType::kBF16, {rows, cols});
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  auto* p = w.mutable_data<uint16_t>();
  float amax = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    p[i] = strata::f32_to_bf16(normal(rng));
    amax = std::max(amax, std::fabs(strata::bf16_to_f32(p[i])));
  }
  const double mb = static_cast<double>(w.nbytes()) / 1e6;
  std::printf("bf16 weight [%lld, %lld] = %.1f MB, single thread\n", static_cast<long long>(rows),
              static_cast<long long>(cols), mb);
  std::printf("%-6s %14s %14s\n", "format", "reference MB/s", "fast MB/s");
  struct Row {
    const char* name;
    std::function<void(Encoders)> run;
  };
  const Row table[] = {
      {"nvfp4", [&](Encoders e) { strata::quant_detail::nvfp4_quantize_with(e, w, amax, "w"); }},
      {"fp8", [&](Encoders e) { strata::quant_detail::fp8_quantize_with(e, w, amax, "w"); }},
      {"mxfp8", [&](Encoders e) { strata::quant_detail::mxfp8_quantize_with(e, w, "w"); }},
  };
  for (const Row& row : table) {
    const double ref = time_it([&] { row.run(Encoders::kReference); });
    const double fast = time_it([&] { row.run(Encoders::kFast); });
    std::printf("%-6s %14.1f %14.1f\n", row.name, mb / ref, mb / fast);
  }
  // The encoders' outputs and the writer's fused tensors are zeroed tensors that are then
  // overwritten: what a fresh 330 MB Tensor::zeros costs until two threads have written it,
  // against the zero-filling allocation it replaced (aligned_alloc + memset).
  const size_t big = 330u << 20;
  auto fill = [&](uint8_t* p) {
    std::thread other([&] { std::memset(p, 1, big / 2); });
    std::memset(p + big / 2, 1, big - big / 2);
    other.join();
  };
  const double memset_first = time_it([&] {
    void* p = std::aligned_alloc(64, big);
    std::memset(p, 0, big);
    fill(static_cast<uint8_t*>(p));
    std::free(p);
  });
  const double zeros = time_it([&] {
    strata::Tensor t = strata::Tensor::zeros(strata::DType::kU8, {static_cast<int64_t>(big)});
    fill(t.mutable_data<uint8_t>());
  });
  std::printf(
      "a 330 MiB zeroed tensor, then written by 2 threads: %.3f s (zero-filled first: "
      "%.3f s)\n",
      zeros, memset_first);
  return 0;
}
