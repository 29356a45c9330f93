// The routed experts' GEMMs in one launch (host launchers: ops/cuda/expert_gemm.h).
//
// Tiles: expert e's rows [offsets[e], offsets[e + 1]) are cut into tiles of row_tile rows (the
// last one partial), numbered over the experts in order (expert_plan). expert_gemm's grid is (an
// upper bound on the tiles, column blocks of N, outputs); a block finds its expert by a binary
// search over tile_first and computes a [row_tile, column block] block of that expert's output.
//
// bf16: 8 warps on a [64 or 128, 128] block, each warp [32 or 64, 32] in 16x16x16 WMMA fragments,
// k through a four-stage cp.async pipeline in shared memory (x rows and weight rows both
// k-contiguous, so the weight tile is WMMA's column-major B). fp32: 256 threads on a [64, 64]
// block, each thread 4 x 4 outputs, one fmaf per k in k order.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "ops/cuda/expert_gemm.h"
#include "ops/cuda/launch.cuh"

namespace strata::ops::cuda {
namespace {

using launch::launched;
using launch::st;

// ---- plan ---------------------------------------------------------------------------------------

constexpr int kPlanThreads = 1024;

// An inclusive block-wide sum of (a, b) over threads in order; every thread gets its prefix.
__device__ void block_scan2(int& a, int& b) {
  __shared__ int wa[32], wb[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned all = 0xffffffffu;
  for (int o = 1; o < 32; o <<= 1) {
    const int ua = __shfl_up_sync(all, a, o), ub = __shfl_up_sync(all, b, o);
    if (lane >= o) {
      a += ua;
      b += ub;
    }
  }
  if (lane == 31) {
    wa[warp] = a;
    wb[warp] = b;
  }
  __syncthreads();
  if (warp == 0) {
    const int nw = blockDim.x >> 5;
    int sa = lane < nw ? wa[lane] : 0, sb = lane < nw ? wb[lane] : 0;
    for (int o = 1; o < 32; o <<= 1) {
      const int ua = __shfl_up_sync(all, sa, o), ub = __shfl_up_sync(all, sb, o);
      if (lane >= o) {
        sa += ua;
        sb += ub;
      }
    }
    wa[lane] = sa;
    wb[lane] = sb;
  }
  __syncthreads();
  if (warp > 0) {
    a += wa[warp - 1];
    b += wb[warp - 1];
  }
}

__global__ void k_plan(const int32_t* counts, int E, int bm, int32_t* offsets, int32_t* tile_first,
                       uint64_t* rows_a, uint64_t* rows_b) {
  const int per = (E + kPlanThreads - 1) / kPlanThreads;
  const int e0 = min(E, static_cast<int>(threadIdx.x) * per), e1 = min(E, e0 + per);
  int rows = 0, tiles = 0;
  for (int e = e0; e < e1; ++e) {
    const int c = counts[e];
    rows += c;
    tiles += (c + bm - 1) / bm;
  }
  int r = rows, t = tiles;
  block_scan2(r, t);
  r -= rows;  // exclusive: where this thread's experts start
  t -= tiles;
  for (int e = e0; e < e1; ++e) {
    const int c = counts[e];
    offsets[e] = r;
    tile_first[e] = t;
    r += c;
    t += (c + bm - 1) / bm;
    if (rows_a) rows_a[e] += static_cast<uint64_t>(c);
    if (rows_b) rows_b[e] += static_cast<uint64_t>(c);
  }
  if (threadIdx.x == kPlanThreads - 1) {
    offsets[E] = r;
    tile_first[E] = t;
  }
}

// ---- the tile a block computes ------------------------------------------------------------------

struct Tile {
  int expert, row0, rows;
};

// Block `b`'s tile of `bm` rows: tile tile_first[0] + b (a slice of experts starts at its first
// expert's first tile; the whole plan at 0); blocks past the last tile get rows 0.
__device__ Tile tile_of(int b, int bm, const int32_t* offsets, const int32_t* tile_first, int E) {
  Tile t{0, 0, 0};
  b += tile_first[0];
  if (b >= tile_first[E]) return t;
  // The last expert whose first tile is <= b: the one owning b (an expert without tiles shares
  // its tile_first with the next expert, which is then chosen).
  int lo = 0, hi = E - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (tile_first[mid] <= b)
      lo = mid;
    else
      hi = mid - 1;
  }
  t.expert = lo;
  t.row0 = offsets[lo] + (b - tile_first[lo]) * bm;
  t.rows = min(bm, offsets[lo + 1] - t.row0);
  return t;
}

// ---- bf16: WMMA tensor cores --------------------------------------------------------------------

// A block: BM rows x kBn columns, 8 warps each on a [kWm, kWn] part in 16x16x16 fragments; k in
// steps of BK through a STAGES-deep cp.async pipeline. Rows of the stages are padded by 8 values
// (16 bytes) against bank conflicts.
constexpr int kBn = 128, kGemmThreads = 256, kLdc = kBn + 4;  // kLdc: the fp32 output block's row
template <int BM, int BK, int STAGES>
struct Cfg {
  static constexpr int kBm = BM, kBk = BK, kStages = STAGES, kLds = BK + 8;
  static constexpr int kWarpsM = BM >= 32 ? 2 : 1, kWarpsN = 8 / kWarpsM;
  static constexpr int kWm = BM / kWarpsM, kWn = kBn / kWarpsN;    // a warp's block
  static constexpr int kFm = kWm / 16, kFn = kWn / 16;             // its 16x16 fragments
  static constexpr int kStageA = BM * kLds, kStageB = kBn * kLds;  // bf16 values a stage
  static constexpr int kPipe = STAGES * (kStageA + kStageB) * 2, kOut = BM * kLdc * 4;
  static constexpr int kSmem = kPipe > kOut ? kPipe : kOut;  // the output block reuses the stages
};
// The row tile follows the experts' mean rows (expert_row_tile), so that few rows an expert
// waste few products on rows past its end (which is what bounds those chunks); k by 64 keeps
// more weight bytes in flight there, k by 32 with 128 rows more products per fragment load.
// 8 warps as 2 x 4 (1 x 8 for 16 rows).
using Rows16 = Cfg<16, 64, 4>;    // 82,944 bytes of shared memory
using Rows32 = Cfg<32, 64, 4>;    // 92,160
using Rows64 = Cfg<64, 64, 4>;    // 110,592
using Rows128 = Cfg<128, 32, 4>;  // 81,920

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int n = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Rows [0, rows) of a k-contiguous bf16 matrix (row stride K), columns [k0, k0 + C::kBk), into
// dst [R][C::kLds]; rows or columns past the ends read zero. kVec: 16-byte cp.async (K % 8 == 0,
// 16-byte aligned rows), else element by element.
template <class C, bool kVec, int R>
__device__ __forceinline__ void load_tile(uint16_t* dst, const uint16_t* src, int rows, int64_t K,
                                          int64_t k0) {
  constexpr int kBk = C::kBk, kLds = C::kLds;
  if constexpr (kVec) {
    constexpr int kChunks = R * kBk / 8;
    for (int c = threadIdx.x; c < kChunks; c += kGemmThreads) {
      const int r = c / (kBk / 8), kc = (c % (kBk / 8)) * 8;
      const bool valid = r < rows && k0 + kc < K;
      cp_async16(dst + r * kLds + kc, valid ? src + r * K + k0 + kc : src, valid);
    }
  } else {
    for (int i = threadIdx.x; i < R * kBk; i += kGemmThreads) {
      const int r = i / kBk, kc = i % kBk;
      dst[r * kLds + kc] = r < rows && k0 + kc < K ? src[r * K + k0 + kc] : uint16_t{0};
    }
  }
}

template <class C, bool kVec>
__global__ void __launch_bounds__(kGemmThreads, 2)
    k_expert_gemm_bf16(const uint16_t* x, int64_t K, const int32_t* offsets,
                       const int32_t* tile_first, int E, ExpertGemmOutputs out, int64_t N) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using namespace nvcuda;
  constexpr int kBm = C::kBm, kBk = C::kBk, kStages = C::kStages, kLds = C::kLds;
  constexpr int kFm = C::kFm, kFn = C::kFn, kWm = C::kWm, kWn = C::kWn;
  const Tile tile = tile_of(static_cast<int>(blockIdx.x), kBm, offsets, tile_first, E);
  if (tile.rows <= 0) return;
  const int j = static_cast<int>(blockIdx.z);
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kBn;
  const int n_rows = static_cast<int>(N - n0 < kBn ? N - n0 : kBn);
  const uint16_t* xa = x + static_cast<int64_t>(tile.row0) * K;
  // (j ? [1] : [0]): a constant index keeps the parameter arrays out of local memory.
  const uint16_t* wb =
      static_cast<const uint16_t*>((j ? out.w[1] : out.w[0])[tile.expert]) + n0 * K;
  float* y = j ? out.y[1] : out.y[0];

  extern __shared__ __align__(128) uint8_t smem[];
  uint16_t* sa = reinterpret_cast<uint16_t*>(smem);
  uint16_t* sb = sa + kStages * C::kStageA;
  const int warp = threadIdx.x >> 5, wm = warp / C::kWarpsN, wn = warp % C::kWarpsN;

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kFm][kFn];
  for (int i = 0; i < kFm; ++i)
    for (int q = 0; q < kFn; ++q)
      wmma::fill_fragment(acc[i][q], 0.0f);

  const int kt_count = static_cast<int>((K + kBk - 1) / kBk);
  auto load_stage = [&](int kt) {
    const int s = kt % kStages;
    load_tile<C, kVec, kBm>(sa + s * C::kStageA, xa, tile.rows, K, static_cast<int64_t>(kt) * kBk);
    load_tile<C, kVec, kBn>(sb + s * C::kStageB, wb, n_rows, K, static_cast<int64_t>(kt) * kBk);
  };
  for (int kt = 0; kt < kStages - 1; ++kt) {
    if (kt < kt_count) load_stage(kt);
    cp_async_commit();
  }
  for (int kt = 0; kt < kt_count; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt is in; every warp is done with stage kt - 1
    if (kt + kStages - 1 < kt_count) load_stage(kt + kStages - 1);
    cp_async_commit();
    const uint16_t* a = sa + (kt % kStages) * C::kStageA;
    const uint16_t* b = sb + (kt % kStages) * C::kStageB;
    for (int kk = 0; kk < kBk; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[kFm];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[kFn];
      for (int i = 0; i < kFm; ++i)
        wmma::load_matrix_sync(
            fa[i], reinterpret_cast<const __nv_bfloat16*>(a + (wm * kWm + i * 16) * kLds + kk),
            kLds);
      for (int q = 0; q < kFn; ++q)
        wmma::load_matrix_sync(
            fb[q], reinterpret_cast<const __nv_bfloat16*>(b + (wn * kWn + q * 16) * kLds + kk),
            kLds);
      for (int i = 0; i < kFm; ++i)
        for (int q = 0; q < kFn; ++q)
          wmma::mma_sync(acc[i][q], fa[i], fb[q], acc[i][q]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the stages are free: the output block goes there
  float* c = reinterpret_cast<float*>(smem);
  for (int i = 0; i < kFm; ++i)
    for (int q = 0; q < kFn; ++q)
      wmma::store_matrix_sync(c + (wm * kWm + i * 16) * kLdc + wn * kWn + q * 16, acc[i][q], kLdc,
                              wmma::mem_row_major);
  __syncthreads();
  for (int i = threadIdx.x; i < kBm * kBn; i += kGemmThreads) {
    const int r = i / kBn, col = i % kBn;
    if (r < tile.rows && col < n_rows) y[(tile.row0 + r) * N + n0 + col] = c[r * kLdc + col];
  }
#else
  __trap();  // bf16 tensor cores need sm_80 or later
#endif
}

template <class C>
void launch_bf16(dim3 grid, bool vec, const void* x, int64_t K, const int32_t* offsets,
                 const int32_t* tile_first, int64_t E, const ExpertGemmOutputs& out, int64_t N,
                 void* s) {
  auto* kernel = vec ? k_expert_gemm_bf16<C, true> : k_expert_gemm_bf16<C, false>;
  STRATA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    C::kSmem) == cudaSuccess,
               "expert_gemm: cannot use ", C::kSmem, " bytes of shared memory");
  kernel<<<grid, kGemmThreads, C::kSmem, st(s)>>>(static_cast<const uint16_t*>(x), K, offsets,
                                                  tile_first, static_cast<int>(E), out, N);
}

// ---- fp32: SIMT, one fmaf per k in k order ------------------------------------------------------

constexpr int kF32Rows = 64, kF32Cols = 64, kFk = 16,
              kFThreads = 256;  // 16 x 16 threads, 4 x 4 outputs

__global__ void __launch_bounds__(kFThreads)
    k_expert_gemm_f32(const float* x, int64_t K, const int32_t* offsets, const int32_t* tile_first,
                      int E, ExpertGemmOutputs out, int64_t N) {
  const Tile tile = tile_of(static_cast<int>(blockIdx.x), kF32Rows, offsets, tile_first, E);
  if (tile.rows <= 0) return;
  const int j = static_cast<int>(blockIdx.z);
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kF32Cols;
  const int n_rows = static_cast<int>(N - n0 < kF32Cols ? N - n0 : kF32Cols);
  const float* xa = x + static_cast<int64_t>(tile.row0) * K;
  const float* wb = static_cast<const float*>((j ? out.w[1] : out.w[0])[tile.expert]) + n0 * K;
  float* y = j ? out.y[1] : out.y[0];
  __shared__ float sa[kF32Rows][kFk + 1], sb[kF32Cols][kFk + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kFk) {
    for (int i = threadIdx.x; i < kF32Rows * kFk; i += kFThreads) {
      const int r = i / kFk, kc = i % kFk;
      sa[r][kc] = r < tile.rows && k0 + kc < K ? xa[r * K + k0 + kc] : 0.0f;
    }
    for (int i = threadIdx.x; i < kF32Cols * kFk; i += kFThreads) {
      const int r = i / kFk, kc = i % kFk;
      sb[r][kc] = r < n_rows && k0 + kc < K ? wb[r * K + k0 + kc] : 0.0f;
    }
    __syncthreads();
    const int kn = static_cast<int>(K - k0 < kFk ? K - k0 : kFk);
    for (int kc = 0; kc < kn; ++kc) {
      float a[4], b[4];
      for (int i = 0; i < 4; ++i)
        a[i] = sa[ty + 16 * i][kc];
      for (int q = 0; q < 4; ++q)
        b[q] = sb[tx + 16 * q][kc];
      for (int i = 0; i < 4; ++i)
        for (int q = 0; q < 4; ++q)
          acc[i][q] = fmaf(a[i], b[q], acc[i][q]);
    }
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i) {
    const int r = ty + 16 * i;
    if (r >= tile.rows) continue;
    for (int q = 0; q < 4; ++q) {
      const int col = tx + 16 * q;
      if (col < n_rows) y[(tile.row0 + r) * N + n0 + col] = acc[i][q];
    }
  }
}

}  // namespace

int64_t expert_row_tile(int64_t S, int64_t E, bool bf16) {
  if (!bf16) return kF32Rows;
  for (int64_t tile : {16, 32, 64})
    if (S <= tile * E) return tile;
  return 128;
}

void expert_plan(const int32_t* counts, int64_t E, int64_t row_tile, int32_t* offsets,
                 int32_t* tile_first, uint64_t* rows_a, uint64_t* rows_b, void* s) {
  STRATA_CHECK(E > 0 && E <= 64 * kPlanThreads, "expert_plan: ", E, " experts (1 to ",
               64 * kPlanThreads, ")");
  k_plan<<<1, kPlanThreads, 0, st(s)>>>(counts, static_cast<int>(E), static_cast<int>(row_tile),
                                        offsets, tile_first, rows_a, rows_b);
  launched("expert_plan");
}

int64_t expert_gemm_max_tiles(int64_t S, int64_t E, int64_t row_tile) {
  // Each expert with rows adds at most one partial tile to the S / row_tile full ones.
  return (S + row_tile - 1) / row_tile + std::min(E, S);
}

void expert_gemm(const void* x, int64_t S, int64_t K, const int32_t* offsets,
                 const int32_t* tile_first, int64_t E, int64_t row_tile,
                 const ExpertGemmOutputs& out, int64_t N, bool bf16, bool aligned, void* s) {
  if (S == 0 || N == 0) return;
  STRATA_CHECK(out.n_out == 1 || out.n_out == 2, "expert_gemm: ", out.n_out, " outputs (1 or 2)");
  STRATA_CHECK(S < (int64_t{1} << 31) && K > 0, "expert_gemm: ", S, " rows of ", K,
               " values (its row offsets are 32-bit)");
  STRATA_CHECK(bf16 ? row_tile == 16 || row_tile == 32 || row_tile == 64 || row_tile == 128
                    : row_tile == kF32Rows,
               "expert_gemm: row tile ", row_tile, " (expert_row_tile gives the valid one)");
  const unsigned tiles = static_cast<unsigned>(expert_gemm_max_tiles(S, E, row_tile));
  const unsigned outs = static_cast<unsigned>(out.n_out);
  if (bf16) {
    const dim3 grid(tiles, static_cast<unsigned>((N + kBn - 1) / kBn), outs);
    const bool vec = aligned && K % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
    switch (row_tile) {
      case 16:
        launch_bf16<Rows16>(grid, vec, x, K, offsets, tile_first, E, out, N, s);
        break;
      case 32:
        launch_bf16<Rows32>(grid, vec, x, K, offsets, tile_first, E, out, N, s);
        break;
      case 64:
        launch_bf16<Rows64>(grid, vec, x, K, offsets, tile_first, E, out, N, s);
        break;
      default:
        launch_bf16<Rows128>(grid, vec, x, K, offsets, tile_first, E, out, N, s);
        break;
    }
  } else {
    const dim3 grid(tiles, static_cast<unsigned>((N + kF32Cols - 1) / kF32Cols), outs);
    k_expert_gemm_f32<<<grid, kFThreads, 0, st(s)>>>(static_cast<const float*>(x), K, offsets,
                                                     tile_first, static_cast<int>(E), out, N);
  }
  launched("expert_gemm");
}

}  // namespace strata::ops::cuda
