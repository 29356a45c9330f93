// Routed-expert dispatch on the device (ops/cuda/moe.cu); conventions: ops/cuda/convert.h. The
// CPU's dispatch (ops/cpu_backend.cpp CpuBackend::moe) sums a token's expert outputs in slot
// order; so does moe_combine. The rows of one expert are in arrival order here, not token order
// as on the CPU.
#pragma once

#include <cstdint>

namespace strata::ops::cuda {

// Slots s = t*K + j (chosen[slots], the routing's [T, K]) are grouped by expert: pos[s] =
// offsets[e] + (order of arrival), offsets[E] the exclusive prefix sum of the routing's counts;
// cursor[E] zeroed first. row_expert[pos] = e.
void moe_scatter(const int32_t* chosen, int64_t slots, const int32_t* offsets, int32_t* cursor,
                 int32_t* pos, int32_t* row_expert, void* stream);
// xg[pos[s], :] = n[s / K, :] for every slot; n[T, H], xg[T*K, H]; fp32 or bf16 bits. Exact.
void moe_gather(const float* n, int64_t T, int64_t H, int64_t K, const int32_t* pos, float* xg,
                void* stream);
void moe_gather(const uint16_t* n, int64_t T, int64_t H, int64_t K, const int32_t* pos,
                uint16_t* xg, void* stream);
// y[r, :] += bias[row_expert[r]][:] for the S rows of y [S, width] (row_expert from moe_scatter;
// bias: a device array of E pointers to fp32 [width], null where an expert has no bias). One fp32
// addition per value, as add_bias (ops/cuda/elementwise.h).
void moe_add_bias(float* y, int64_t S, int64_t width, const int32_t* row_expert,
                  const float* const* bias, void* stream);
// y[t, :] = sum_j weight[t, j] * outg[pos[t*K + j], :], summed in j order in fp32 (each step
// may be one fused multiply-add). outg [T*K, H], weight [T, K], y [T, H]. `bf16` (the backend's
// bf16_ops): the slots in increasing expert order, each product and each sum rounded to bf16, as
// CpuBackend::moe.
void moe_combine(const float* outg, const int32_t* pos, const float* weight, int64_t T, int64_t K,
                 int64_t H, float* y, void* stream, bool bf16 = false);

// Expert parallelism (CudaBackend's exchanged MoE, docs/SCALEOUT.md "Expert parallel on GPU
// ranks"): what travels with each dispatched row besides its values. meta[pos[s]] = {chosen[s],
// the bits of max |n[s / K, :]|} for every slot (int32 pairs [T*K, 2]): the row's expert and the
// amax its expert's gate/up observer takes from it (the fp32 hidden state's, as amax_rows over n;
// bits as ops/cuda/amax.h's slots, NaN winning).
void moe_dispatch_meta(const float* n, int64_t T, int64_t H, int64_t K, const int32_t* chosen,
                       const int32_t* pos, int32_t* meta, void* stream);
// The owner's side of the rows received, meta [rows, 2]: row_expert[r] = meta[r, 0], and
// slots[meta[r, 0]] = max(slots[meta[r, 0]], meta[r, 1]) (atomicMax on the bits).
void moe_receive_meta(const int32_t* meta, int64_t rows, int32_t* row_expert, uint32_t* slots,
                      void* stream);

}  // namespace strata::ops::cuda
