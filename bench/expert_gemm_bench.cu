// The routed experts' GEMMs of one MoE layer's chunk on the GPU, for Kimi-K2-like shapes by
// default (docs/PERFORMANCE.md "The Kimi-K2 INT4 case"): E experts of width I on hidden H, each
// token routed to top-k distinct experts (uniformly, fixed seed), chunks of T tokens. Per chunk
// the forward runs, for every expert e with rows,
//   g_e = x_e . gate_e^T,  u_e = x_e . up_e^T      ([rows_e, I], bf16 inputs, fp32 output)
//   o_e = h_e . down_e^T                           ([rows_e, H])
// Timed per chunk (device time between events, mean over --reps):
//   loop     one cuBLAS call per expert and projection (ops::cuda::gemm), from one host thread:
//            the forward before the grouped launch (it issued them from 4 threads, after one
//            copy of the counts to the host per chunk, which is not counted here)
//   grouped  ops::cuda::expert_plan + expert_gemm for gate/up (one launch) and for down (one):
//            the forward now
// and the largest difference of grouped from loop relative to the largest |loop| value (fp32
// sums in another order: ~1e-6 expected). "61 layers" projects the grouped time onto the Kimi-K2
// benchmark's calibration set (--calib tokens) over --moe_layers MoE layers.
//
//   expert_gemm_bench [--experts 384] [--hidden 1280] [--inter 384] [--topk 8]
//                     [--tokens 16,64,256,1024,4096] [--reps 20] [--calib 262144]
//                     [--moe_layers 60] [--tile 64|128]
// (--tile: the grouped GEMM's rows per tile; by default expert_row_tile's choice.)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/gpu_memory.h"
#include "ops/cuda/expert_gemm.h"
#include "ops/cuda/gemm.h"

namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

__global__ void k_fill(uint16_t* p, int64_t n, uint32_t seed, float scale) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
  h ^= h >> 13;
  h *= 0x5bd1e995u;
  h ^= h >> 15;
  const float v = (static_cast<float>(h & 0xFFFF) / 65536.0f - 0.5f) * scale;
  const __nv_bfloat16 b = __float2bfloat16(v);
  std::memcpy(p + i, &b, 2);
}

void fill(uint16_t* p, int64_t n, uint32_t seed, float scale) {
  if (n > 0) k_fill<<<static_cast<unsigned>((n + 255) / 256), 256>>>(p, n, seed, scale);
}

template <typename T>
T* dalloc(int64_t n) {
  void* p = nullptr;
  ck(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T)), "cudaMalloc");
  return static_cast<T*>(p);
}

std::vector<int> int_list(const std::string& v) {
  std::vector<int> out;
  size_t at = 0;
  while (at < v.size()) {
    const size_t c = v.find(',', at);
    out.push_back(std::stoi(v.substr(at, c - at)));
    at = c == std::string::npos ? v.size() : c + 1;
  }
  return out;
}

double max_rel_diff(const float* a_dev, const float* b_dev, int64_t n) {
  std::vector<float> a(static_cast<size_t>(n)), b(a.size());
  ck(cudaMemcpy(a.data(), a_dev, a.size() * 4, cudaMemcpyDeviceToHost), "copy");
  ck(cudaMemcpy(b.data(), b_dev, b.size() * 4, cudaMemcpyDeviceToHost), "copy");
  double diff = 0, mag = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    mag = std::max(mag, std::fabs(static_cast<double>(a[i])));
  }
  return mag > 0 ? diff / mag : std::nan("");  // all zero: something did not run
}

}  // namespace

int main(int argc, char** argv) {
  int E = 384, H = 1280, I = 384, topk = 8, reps = 20, moe_layers = 60;
  int64_t calib = 262144;
  int force_tile = 0;
  std::vector<int> tokens_list = {16, 64, 256, 1024, 4096};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--experts") {
      E = std::stoi(v);
    } else if (a == "--hidden") {
      H = std::stoi(v);
    } else if (a == "--inter") {
      I = std::stoi(v);
    } else if (a == "--topk") {
      topk = std::stoi(v);
    } else if (a == "--reps") {
      reps = std::stoi(v);
    } else if (a == "--calib") {
      calib = std::stoll(v);
    } else if (a == "--moe_layers") {
      moe_layers = std::stoi(v);
    } else if (a == "--tile") {
      force_tile = std::stoi(v);
    } else if (a == "--tokens") {
      tokens_list = int_list(v);
    } else {
      std::fprintf(stderr, "unknown option %s (see the header of bench/expert_gemm_bench.cu)\n",
                   a.c_str());
      return 2;
    }
  }
  if (topk > E || E <= 0 || topk <= 0) {
    std::fprintf(stderr, "--topk must be between 1 and --experts\n");
    return 2;
  }
  namespace oc = strata::ops::cuda;
  strata::gpu::Stream stream;
  cudaStream_t s = static_cast<cudaStream_t>(stream.handle());
  void* blas = oc::gemm_handle_create(s);
  cudaEvent_t e0, e1;
  ck(cudaEventCreate(&e0), "event");
  ck(cudaEventCreate(&e1), "event");
  // Weights [E, I, H] gate and up, [E, H, I] down, scaled for unit-ish outputs.
  const int64_t per = static_cast<int64_t>(I) * H;
  uint16_t* gate = dalloc<uint16_t>(E * per);
  uint16_t* upw = dalloc<uint16_t>(E * per);
  uint16_t* down = dalloc<uint16_t>(E * per);
  fill(gate, E * per, 1, 0.1f);
  fill(upw, E * per, 2, 0.1f);
  fill(down, E * per, 3, 0.1f);
  std::vector<const void*> table(3 * static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) {
    table[e] = gate + e * per;
    table[E + e] = upw + e * per;
    table[2 * E + e] = down + e * per;
  }
  const void** dtable = dalloc<const void*>(3 * E);
  ck(cudaMemcpy(dtable, table.data(), table.size() * sizeof(void*), cudaMemcpyHostToDevice), "t");
  int32_t* counts_dev = dalloc<int32_t>(E);
  int32_t* offsets = dalloc<int32_t>(E + 1);
  int32_t* tile_first = dalloc<int32_t>(E + 1);

  std::printf(
      "experts %d of width %d on hidden %d, top-%d; bf16 inputs, fp32 accumulation and "
      "output; %d reps\n",
      E, I, H, topk, reps);
  std::printf("%8s %8s %8s %5s %9s %11s %12s %11s %8s %10s %11s %10s\n", "tokens", "rows",
              "experts", "tile", "GEMMs", "loop us", "loop host us", "grouped us", "speedup",
              "grp TFLOP/s", "rel diff", "layers s");
  for (const int T : tokens_list) {
    const int64_t S = static_cast<int64_t>(T) * topk;
    std::mt19937 rng(20261203u + static_cast<uint32_t>(T));
    std::vector<int32_t> counts(E, 0);
    std::vector<int> pick(E);
    std::iota(pick.begin(), pick.end(), 0);
    for (int t = 0; t < T; ++t) {
      for (int j = 0; j < topk; ++j) {  // a partial Fisher-Yates shuffle: topk distinct experts
        std::uniform_int_distribution<int> d(j, E - 1);
        std::swap(pick[j], pick[d(rng)]);
        ++counts[pick[j]];
      }
    }
    std::vector<int64_t> off(E + 1, 0);
    int hit = 0;
    for (int e = 0; e < E; ++e) {
      off[e + 1] = off[e] + counts[e];
      hit += counts[e] > 0;
    }
    ck(cudaMemcpy(counts_dev, counts.data(), E * 4, cudaMemcpyHostToDevice), "counts");
    uint16_t* x = dalloc<uint16_t>(S * H);   // gathered expert inputs [S, H]
    uint16_t* hb = dalloc<uint16_t>(S * I);  // the down GEMMs' input [S, I]
    float* g[2] = {dalloc<float>(S * I), dalloc<float>(S * I)};
    float* u[2] = {dalloc<float>(S * I), dalloc<float>(S * I)};
    float* o[2] = {dalloc<float>(S * H), dalloc<float>(S * H)};
    fill(x, S * H, 11, 2.0f);
    fill(hb, S * I, 12, 2.0f);
    ck(cudaDeviceSynchronize(), "fill");

    const int64_t tile = force_tile > 0 ? force_tile : oc::expert_row_tile(S, E, true);
    int gemms = 0;
    auto loop = [&]() {
      gemms = 0;
      for (int e = 0; e < E; ++e) {
        const int64_t m = counts[e];
        if (m == 0) continue;
        oc::gemm(blas, x + off[e] * H, gate + e * per, g[0] + off[e] * I, m, I, H, true);
        oc::gemm(blas, x + off[e] * H, upw + e * per, u[0] + off[e] * I, m, I, H, true);
        oc::gemm(blas, hb + off[e] * I, down + e * per, o[0] + off[e] * H, m, H, I, true);
        gemms += 3;
      }
    };
    auto grouped = [&]() {
      oc::expert_plan(counts_dev, E, tile, offsets, tile_first, nullptr, nullptr, s);
      oc::ExpertGemmOutputs gu;
      gu.w[0] = dtable;
      gu.w[1] = dtable + E;
      gu.y[0] = g[1];
      gu.y[1] = u[1];
      gu.n_out = 2;
      oc::expert_gemm(x, S, H, offsets, tile_first, E, tile, gu, I, true, true, s);
      oc::ExpertGemmOutputs dn;
      dn.w[0] = dtable + 2 * E;
      dn.y[0] = o[1];
      oc::expert_gemm(hb, S, I, offsets, tile_first, E, tile, dn, H, true, true, s);
    };
    auto time_us = [&](auto&& f, double* host_us) {
      f();
      ck(cudaStreamSynchronize(s), "warm");
      double host = 0;
      ck(cudaEventRecord(e0, s), "record");
      for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        f();
        host += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                    .count();
      }
      ck(cudaEventRecord(e1, s), "record");
      ck(cudaEventSynchronize(e1), "sync");
      float ms = 0;
      ck(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
      if (host_us) *host_us = host / reps;
      return ms * 1000.0 / reps;
    };
    double loop_host = 0;
    const double loop_us = time_us(loop, &loop_host);
    const double grouped_us = time_us(grouped, nullptr);
    ck(cudaGetLastError(), "launches");
    const double diff = std::max({max_rel_diff(g[0], g[1], S * I), max_rel_diff(u[0], u[1], S * I),
                                  max_rel_diff(o[0], o[1], S * H)});
    const double flop = 2.0 * static_cast<double>(S) * H * I * 3;
    const double layers_s =
        static_cast<double>((calib + T - 1) / T) * moe_layers * grouped_us / 1e6;
    std::printf("%8d %8.1f %8d %5lld %9d %11.1f %12.1f %11.1f %8.1f %10.1f %11.2e %10.2f\n", T,
                static_cast<double>(S) / E, hit, static_cast<long long>(tile), gemms, loop_us,
                loop_host, grouped_us, loop_us / grouped_us, flop / grouped_us / 1e6, diff,
                layers_s);
    for (void* p : {static_cast<void*>(x), static_cast<void*>(hb), static_cast<void*>(g[0]),
                    static_cast<void*>(g[1]), static_cast<void*>(u[0]), static_cast<void*>(u[1]),
                    static_cast<void*>(o[0]), static_cast<void*>(o[1])})
      cudaFree(p);
  }
  std::printf(
      "rows: mean rows per expert; experts: experts with rows; layers s: the grouped time "
      "for %lld calibration tokens in chunks of `tokens` over %d MoE layers\n",
      static_cast<long long>(calib), moe_layers);
  oc::gemm_handle_destroy(blas);
  for (void* p : {static_cast<void*>(gate), static_cast<void*>(upw), static_cast<void*>(down),
                  static_cast<void*>(dtable), static_cast<void*>(counts_dev),
                  static_cast<void*>(offsets), static_cast<void*>(tile_first)})
    cudaFree(p);
  return 0;
}
