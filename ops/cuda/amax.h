// Observers on the device (ops/cuda/amax.cu); conventions: ops/cuda/convert.h.
//
// Slots are fp32 amaxes kept as their bit patterns (uint32; zero them first), so that atomicMax
// on them is max over |x| with NaN winning (a NaN's bits with the sign cleared exceed
// infinity's): a slot equals ops::amax of everything accumulated into it, bit for bit when no
// NaN was seen; after a NaN it holds a NaN (ops::amax returns the canonical NaN, the slot the
// largest |NaN| bit pattern seen).
#pragma once

#include <cstdint>

namespace strata::ops::cuda {

// *slot = max(*slot, max |x[n]|).
void amax(const float* x, int64_t n, uint32_t* slot, void* stream);
// Row r of x[rows, cols] goes to slots[row_slot[r * per_row + j]] for each j < per_row (a
// token's hidden state to each of its K experts' slots: per_row = K, row_slot = chosen).
void amax_rows(const float* x, int64_t rows, int64_t cols, const int32_t* row_slot, uint32_t* slots,
               void* stream, int64_t per_row = 1);
// ops::column_stats of each of n_seqs sequences of x[T, cols]: sequence s spans rows
// [bounds[s], bounds[s+1]) (bounds: device memory [n_seqs + 1]); its statistics go to row s of
// sum, max, min [n_seqs, cols] (device). One thread per column sums in row order, so the values
// equal the CPU's bit for bit.
void column_stats(const float* x, int64_t cols, const int64_t* bounds, int64_t n_seqs, double* sum,
                  float* max, float* min, void* stream);

// local_hessian's input statistics (quant/scale_search.h BlockHessian) on the device. sums
// [cols/16][16][16] doubles: sums[n][i][j] += x[r, 16n + i] * x[r, 16n + j] over the rows r in
// order, each sum advanced one row at a time from its value before, as BlockHessian::accumulate,
// so the sums equal the CPU's bit for bit for the same rows in the same order.
void block_hessian(const float* x, int64_t rows, int64_t cols, double* sums, void* stream);
// Each expert's slots in increasing slot order (the token order of the CPU's expert loop): the
// slots s of chosen[slots] (the routing's [T, K]) with chosen[s] == e at order[offsets[e] ...]
// (offsets: device [experts + 1], the exclusive prefix sum of the routing's counts).
void expert_order(const int32_t* chosen, int64_t slots, const int32_t* offsets, int64_t experts,
                  int32_t* order, void* stream);
// block_hessian of every expert e at sums + e * 16 * cols over its rows order[offsets[e] ..
// offsets[e + 1]) in that order: row map[order[k]] of x (map: the slot's row, moe_scatter's pos),
// or without map row order[k] / div (the slot's token, div = K).
void expert_block_hessian(const float* x, int64_t cols, const int32_t* order, int32_t div,
                          const int32_t* map, const int32_t* offsets, int64_t experts, double* sums,
                          void* stream);

// nvfp4_act_headroom's block histograms (calib/max_calib.h add_block_histogram) on the device:
// for each 16-element block of each row of x[rows, cols] (a ragged tail block shorter), its amax
// b (NaN elements skipped, as on the CPU); when b is positive and finite, one count in bin
// (the number of `thresholds` <= b: calib/max_calib.h headroom_thresholds, 511 floats on the
// device) of each of the row's slots: hist[slot * 512 + bin] with slot = row_slot[r * per_row +
// j] for j < per_row, or slot 0 without row_slot. The counts equal the CPU's exactly (the
// thresholds make the bins those of headroom_bin, which is monotone).
constexpr int64_t kHistogramBins = 512;
void block_histogram(const float* x, int64_t rows, int64_t cols, const int32_t* row_slot,
                     int64_t per_row, const float* thresholds, unsigned long long* hist,
                     void* stream);

}  // namespace strata::ops::cuda
