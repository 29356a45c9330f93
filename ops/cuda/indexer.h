// DeepSeek-V3.2's lightning indexer on the device (ops/cuda/indexer.cu); conventions:
// ops/cuda/convert.h.
#pragma once

#include <cstdint>

namespace strata::ops::cuda {

// ops::index_topk over a ragged batch: q[T, nH, d], k[T, d], w[T, nH]; token t's sequence starts
// at seq_start_of_token[t] (int64 [T]) and its row keep[t, 0:words] gets a bit per position of
// that sequence (keys beyond t clear). One block per query: the scores of its keys in shared
// memory (the dot over d in order per head, heads summed in order, as the CPU: equal up to
// fused multiply-adds), then the top_k by a radix select on the scores' order-preserving bits,
// ties to the lower key. Needs nH <= 64, d % 4 == 0 and (nH * d + nH + 32 * words) * 4 bytes of
// shared memory (about 49k keys for nH 64, d 128); else strata::Error.
void index_topk(const float* q, const float* k, const float* w, int64_t T, int64_t n_heads,
                int64_t d, float scale, float w_scale, int64_t top_k,
                const int64_t* seq_start_of_token, uint32_t* keep, int64_t words, void* stream);

}  // namespace strata::ops::cuda
