// MoE routing on the device (ops/cuda/routing.cu); conventions: ops/cuda/convert.h. One warp
// per token (E <= 1024), in fp32 as the CPU backend routes (ops/cpu_backend.cpp
// CpuBackend::route_softmax, CpuBackend::route_sigmoid). Top-k is ops::top_k's: largest first, ties
// to the lower expert. expf is within 2 ulp of the host's exp, so a choice differs from the CPU's
// only where two candidates are within an ulp or two. chosen and weight are [T, K]; counts[E] +=
// tokens per expert (zero it first). The shapes they take: routing_unsupported (else
// strata::Error).
#pragma once

#include <cstdint>
#include <string>

namespace strata::ops::cuda {

// "" when route_softmax_topk takes E experts and K a token (routing_unsupported), or
// route_sigmoid_grouped takes them in n_group groups keeping topk_group
// (grouped_routing_unsupported); else why not. The launchers throw it; CudaBackend's sizing pass
// checks it before any work, so that such a model stays on the CPU.
std::string routing_unsupported(int64_t E, int64_t K);
std::string grouped_routing_unsupported(int64_t E, int64_t K, int64_t n_group, int64_t topk_group);

// Softmax routing (Qwen MoE): p = softmax(logits[t, :E]) (max subtracted, exp in fp32, sum in
// fp64, as ops::softmax); the top K of p, weight = p (/ the fp32 sum of the top K when norm).
void route_softmax_topk(const float* logits, int64_t T, int64_t E, int64_t K, bool norm,
                        int32_t* chosen, float* weight, int32_t* counts, void* stream);
// Sigmoid routing with group-limited selection (DeepSeek-V3 noaux_tc, spec/architectures.md §3):
// s = sigmoid(logit); choice = s + bias (bias fp32 [E] or null); a group's score is the sum of its
// top 2 choices (top 1 when a group has one expert); keep the topk_group best groups; the top K
// of choice among their experts; weight = s (/ (sum + 1e-20) when norm) * scaling. n_group <= 64
// and divides E (else strata::Error).
void route_sigmoid_grouped(const float* logits, int64_t T, int64_t E, int64_t K, const float* bias,
                           int64_t n_group, int64_t topk_group, bool norm, float scaling,
                           int32_t* chosen, float* weight, int32_t* counts, void* stream);

}  // namespace strata::ops::cuda
