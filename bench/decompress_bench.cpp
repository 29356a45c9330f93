// Decompression speed of compressed source weights (io/source_weights.h), one core, on one
// Kimi-K2-sized expert projection [2048, 7168] of seeded random data; prints M values/s per layout.
#include <chrono>
#include <cstdio>
#include <random>
#include "io/source_weights.h"
using namespace strata;
int main() {
  const int64_t out = 2048, in = 7168;  // one K2 expert projection
  std::mt19937 rng(1);
  Tensor p = Tensor::zeros(DType::kI32, {out, in / 8});
  for (int64_t i = 0; i < p.numel(); ++i)
    p.mutable_data<uint32_t>()[i] = rng();
  Tensor s = Tensor::zeros(DType::kBF16, {out, in / 32});
  for (int64_t i = 0; i < s.numel(); ++i)
    s.mutable_data<uint16_t>()[i] = 0x3C00 + (rng() & 0xFF);
  Tensor w8 = Tensor::zeros(DType::kF8E4M3, {out, in});
  for (int64_t i = 0; i < w8.numel(); ++i)
    w8.mutable_data<uint8_t>()[i] = rng() & 0x77;
  Tensor si = Tensor::zeros(DType::kF32, {16, 56});
  for (int64_t i = 0; i < si.numel(); ++i)
    si.mutable_data<float>()[i] = 0.01f;
  Tensor b = Tensor::zeros(DType::kU8, {out, in / 32, 16});
  for (int64_t i = 0; i < b.numel(); ++i)
    b.mutable_data<uint8_t>()[i] = rng();
  Tensor sc = Tensor::zeros(DType::kU8, {out, in / 32});
  for (int64_t i = 0; i < sc.numel(); ++i)
    sc.mutable_data<uint8_t>()[i] = 120;
  auto t = [&](const char* n, auto f) {
    auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < 3; ++r)
      f();
    double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 3;
    std::printf("%-10s %.1f M values/s (%.3f s per [2048, 7168])\n", n, out * in / sec / 1e6, sec);
  };
  t("int4", [&] { decompress_int4_pack(p, s, out, in, 32, "x"); });
  t("fp8", [&] { decompress_fp8_block(w8, si, 128, "x"); });
  t("mxfp4", [&] { decompress_mxfp4(b, sc, "x"); });
}
