// ops/cuda/amax.h against ops::amax, ops::column_stats, BlockHessian::accumulate and
// add_block_histogram.
#include <algorithm>
#include <cmath>
#include <vector>

#include "calib/max_calib.h"
#include "ops/cuda/amax.h"
#include "ops/ops.h"
#include "quant/scale_search.h"
#include "tests/ops/cuda/cuda_test_util.h"

namespace strata::ops::cuda {
namespace {

// A slot is ops::amax of everything accumulated into it, bit for bit; a NaN makes it NaN (the
// device keeps the NaN's bits without the sign, the CPU returns the canonical NaN).
TEST_F(CudaOps, AmaxIsOpsAmaxAndNanWins) {
  // Up to many grid strides of the launch (at most 1024 blocks of 256), the largest value last.
  for (int64_t n : {1, 7, 1000, 300001, (1 << 22) + 3}) {
    std::vector<float> x = normal(n, 10.0f);
    if (n > 1000) x[n - 1] = -999.0f;
    gpu::DeviceBuffer dx = up(x), slot = up(std::vector<uint32_t>(1, 0));
    amax(dx.as<float>(), n, slot.as<uint32_t>(), st());
    const uint32_t first = down<uint32_t>(slot, 1)[0];
    ASSERT_EQ(first, bits_of(ops::amax(x.data(), n))) << n;
    // Accumulates: a smaller tensor, or none, leaves the slot as it is; a larger one raises it.
    const std::vector<float> small(5, -1e-3f);
    gpu::DeviceBuffer ds = up(small);
    amax(ds.as<float>(), 5, slot.as<uint32_t>(), st());
    amax(ds.as<float>(), 0, slot.as<uint32_t>(), st());
    ASSERT_EQ(down<uint32_t>(slot, 1)[0], first);
    const std::vector<float> big = {1.0f, -1e6f};
    gpu::DeviceBuffer dbig = up(big);
    amax(dbig.as<float>(), 2, slot.as<uint32_t>(), st());
    ASSERT_EQ(down<uint32_t>(slot, 1)[0], bits_of(1e6f));
    x[n / 2] = -NAN;
    gpu::DeviceBuffer dn = up(x);
    amax(dn.as<float>(), n, slot.as<uint32_t>(), st());
    ASSERT_TRUE(std::isnan(float_of(down<uint32_t>(slot, 1)[0]))) << n;
    ASSERT_TRUE(std::isnan(ops::amax(x.data(), n)));
  }
}

// Row r's max |x| goes to slots[row_slot[r * per_row + j]] for every j: a token's input to each
// of its experts' slots (per_row = K), and one slot per row (per_row = 1).
TEST_F(CudaOps, RowAmaxesReachEverySlotTheyName) {
  const int64_t rows = 300, cols = 2049, slots = 17;
  for (int64_t per_row : {1, 3}) {
    std::vector<float> x = uniform(rows * cols, -4.0f, 4.0f);
    x[7 * cols + 2048] = -123.0f;  // the last column, negative
    std::vector<int32_t> slot_of(static_cast<size_t>(rows * per_row));
    for (int32_t& v : slot_of)
      v = static_cast<int32_t>(rng()() % (slots - 1));  // the last slot stays untouched
    std::vector<float> want(static_cast<size_t>(slots), 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      const float m = ops::amax(&x[r * cols], cols);
      for (int64_t j = 0; j < per_row; ++j)
        want[slot_of[r * per_row + j]] = std::max(want[slot_of[r * per_row + j]], m);
    }
    gpu::DeviceBuffer dx = up(x), ds = up(slot_of);
    gpu::DeviceBuffer out = up(std::vector<uint32_t>(slots, 0));
    amax_rows(dx.as<float>(), rows, cols, ds.as<int32_t>(), out.as<uint32_t>(), st(), per_row);
    const auto got = down<uint32_t>(out, static_cast<size_t>(slots));
    for (int64_t i = 0; i < slots; ++i)
      EXPECT_EQ(got[i], bits_of(want[i])) << "slot " << i << ", per_row " << per_row;
  }
}

// Per-sequence column statistics equal the CPU's bit for bit (the same row-order double sums),
// including a sequence of one token, one of none, and a NaN sticking in its column only.
TEST_F(CudaOps, ColumnStatsPerSequenceAreTheCpus) {
  const int64_t cols = 300;  // more than one block of columns
  const std::vector<int64_t> bounds = {0, 5, 6, 6, 40, 41};
  const int64_t T = bounds.back(), n = static_cast<int64_t>(bounds.size()) - 1;
  std::vector<float> x = normal(T * cols, 3.0f);
  x[20 * cols + 7] = NAN;  // sequence 3, column 7
  gpu::DeviceBuffer dx = up(x), db = up(bounds);
  gpu::DeviceBuffer dsum = up(std::vector<double>(static_cast<size_t>(n * cols)));
  gpu::DeviceBuffer dmax = up(std::vector<float>(static_cast<size_t>(n * cols)));
  gpu::DeviceBuffer dmin = up(std::vector<float>(static_cast<size_t>(n * cols)));
  column_stats(dx.as<float>(), cols, db.as<int64_t>(), n, dsum.as<double>(), dmax.as<float>(),
               dmin.as<float>(), st());
  const auto sum = down<double>(dsum, static_cast<size_t>(n * cols));
  const auto mx = down<float>(dmax, static_cast<size_t>(n * cols));
  const auto mn = down<float>(dmin, static_cast<size_t>(n * cols));
  for (int64_t s = 0; s < n; ++s) {
    std::vector<double> ws(static_cast<size_t>(cols));
    std::vector<float> wx(static_cast<size_t>(cols)), wn(static_cast<size_t>(cols));
    ops::column_stats(&x[bounds[s] * cols], bounds[s + 1] - bounds[s], cols, ws.data(), wx.data(),
                      wn.data());
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(s * cols + c);
      if (std::isnan(ws[c])) {
        EXPECT_TRUE(std::isnan(sum[i]) && std::isnan(mx[i]) && std::isnan(mn[i])) << s << " " << c;
        continue;
      }
      EXPECT_EQ(sum[i], ws[c]) << "sequence " << s << " column " << c;
      EXPECT_EQ(bits_of(mx[i]), bits_of(wx[c])) << "sequence " << s << " column " << c;
      EXPECT_EQ(bits_of(mn[i]), bits_of(wn[c])) << "sequence " << s << " column " << c;
    }
  }
  EXPECT_TRUE(std::isnan(mx[3 * cols + 7]));
  EXPECT_EQ(mx[2 * cols], -INFINITY);  // the empty sequence
}

// Values whose magnitudes span 2^-20..2^20, so that double sums of their products depend on the
// order of the rows (the tests below check that they do).
std::vector<float> spread(std::vector<float> v, std::mt19937& rng) {
  std::uniform_int_distribution<int> e(-20, 20);
  for (float& x : v)
    x = std::ldexp(x, e(rng));
  return v;
}

// BlockHessian of rows in `order` of x[., cols] (the CPU's accumulate, one row at a time).
BlockHessian cpu_hessian(const std::vector<float>& x, int64_t cols,
                         const std::vector<int64_t>& order) {
  BlockHessian h(cols);
  for (int64_t r : order)
    h.accumulate(&x[static_cast<size_t>(r * cols)], 1);
  return h;
}

// The device's sums are BlockHessian::accumulate's bit for bit: rows not a multiple of the
// kernel's 16-row tiles, several column blocks, and a second call adding to the first's sums.
TEST_F(CudaOps, BlockHessianIsTheCpusBitForBit) {
  const int64_t cols = 48, rows = 37, more = 5;
  const std::vector<float> x = spread(normal((rows + more) * cols), rng());
  gpu::DeviceBuffer dx = up(x);
  gpu::DeviceBuffer sums = up(std::vector<double>(static_cast<size_t>(16 * cols), 0.0));
  block_hessian(dx.as<float>(), rows, cols, sums.as<double>(), st());
  block_hessian(dx.as<float>() + rows * cols, more, cols, sums.as<double>(), st());
  const std::vector<double> got = down<double>(sums, static_cast<size_t>(16 * cols));
  BlockHessian want(cols);
  want.accumulate(x.data(), rows);
  want.accumulate(x.data() + rows * cols, more);
  ASSERT_EQ(got, want.sums());
  // The order matters for these values: the rows reversed give other bits.
  std::vector<int64_t> reversed(static_cast<size_t>(rows + more));
  for (int64_t r = 0; r < rows + more; ++r)
    reversed[static_cast<size_t>(r)] = rows + more - 1 - r;
  EXPECT_NE(cpu_hessian(x, cols, reversed).sums(), want.sums());
}

// A routed expert's sums run over its rows in token order, as the CPU's expert loop observes
// them: expert_order lists each expert's slots in increasing order (an expert no token chose
// gets none), the gate/up input is the slot's token row of n, the down input the slot's row of
// the dispatched activations (at pos, in any arrival order).
TEST_F(CudaOps, ExpertBlockHessianFollowsTheTokenOrder) {
  const int64_t T = 70, K = 3, E = 7, H = 32, Im = 16, S = T * K;
  std::vector<int32_t> chosen(static_cast<size_t>(S));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> experts = {0, 1, 2, 3, 4, 5};  // expert 6 never chosen
    std::shuffle(experts.begin(), experts.end(), rng());
    for (int64_t j = 0; j < K; ++j)
      chosen[static_cast<size_t>(t * K + j)] = experts[static_cast<size_t>(j)];
  }
  std::vector<std::vector<int64_t>> slots(E);  // each expert's slots, increasing
  for (int64_t s = 0; s < S; ++s)
    slots[static_cast<size_t>(chosen[static_cast<size_t>(s)])].push_back(s);
  std::vector<int32_t> offsets(E + 1, 0);
  for (int64_t e = 0; e < E; ++e)
    offsets[e + 1] = offsets[e] + static_cast<int32_t>(slots[static_cast<size_t>(e)].size());
  // The dispatch's rows: each expert's slots at its offset, in a shuffled arrival order.
  std::vector<int32_t> pos(static_cast<size_t>(S));
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int32_t> at(slots[static_cast<size_t>(e)].size());
    for (size_t i = 0; i < at.size(); ++i)
      at[i] = offsets[e] + static_cast<int32_t>(i);
    std::shuffle(at.begin(), at.end(), rng());
    for (size_t i = 0; i < at.size(); ++i)
      pos[static_cast<size_t>(slots[static_cast<size_t>(e)][i])] = at[i];
  }
  const std::vector<float> n = spread(normal(T * H), rng());
  const std::vector<float> act = spread(normal(S * Im), rng());
  gpu::DeviceBuffer dchosen = up(chosen), doff = up(offsets), dpos = up(pos), dn = up(n),
                    dact = up(act), dorder = buffer(static_cast<uint64_t>(S) * 4);
  expert_order(dchosen.as<int32_t>(), S, doff.as<int32_t>(), E, dorder.as<int32_t>(), st());
  const std::vector<int32_t> order = down<int32_t>(dorder, static_cast<size_t>(S));
  for (int64_t e = 0; e < E; ++e) {
    for (size_t i = 0; i < slots[static_cast<size_t>(e)].size(); ++i)
      ASSERT_EQ(order[static_cast<size_t>(offsets[e]) + i], slots[static_cast<size_t>(e)][i])
          << "expert " << e << " slot " << i;
  }
  gpu::DeviceBuffer gu = up(std::vector<double>(static_cast<size_t>(E * 16 * H), 0.0));
  gpu::DeviceBuffer dn_sums = up(std::vector<double>(static_cast<size_t>(E * 16 * Im), 0.0));
  expert_block_hessian(dn.as<float>(), H, dorder.as<int32_t>(), static_cast<int32_t>(K), nullptr,
                       doff.as<int32_t>(), E, gu.as<double>(), st());
  expert_block_hessian(dact.as<float>(), Im, dorder.as<int32_t>(), 1, dpos.as<int32_t>(),
                       doff.as<int32_t>(), E, dn_sums.as<double>(), st());
  const std::vector<double> got_gu = down<double>(gu, static_cast<size_t>(E * 16 * H));
  const std::vector<double> got_dn = down<double>(dn_sums, static_cast<size_t>(E * 16 * Im));
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int64_t> tokens, rows;
    for (int64_t s : slots[static_cast<size_t>(e)]) {
      tokens.push_back(s / K);
      rows.push_back(pos[static_cast<size_t>(s)]);
    }
    const BlockHessian want_gu = cpu_hessian(n, H, tokens), want_dn = cpu_hessian(act, Im, rows);
    const std::vector<double> g(got_gu.begin() + e * 16 * H, got_gu.begin() + (e + 1) * 16 * H);
    const std::vector<double> d(got_dn.begin() + e * 16 * Im, got_dn.begin() + (e + 1) * 16 * Im);
    EXPECT_EQ(g, want_gu.sums()) << "expert " << e << " gate/up";
    EXPECT_EQ(d, want_dn.sums()) << "expert " << e << " down";
  }
  // The order matters here too: expert 0's down rows in arrival (pos) order give other bits.
  std::vector<int64_t> arrival;
  for (int32_t p = offsets[0]; p < offsets[1]; ++p)
    arrival.push_back(p);
  std::vector<int64_t> token_order;
  for (int64_t s : slots[0])
    token_order.push_back(pos[static_cast<size_t>(s)]);
  ASSERT_NE(arrival, token_order);
  EXPECT_NE(cpu_hessian(act, Im, arrival).sums(), cpu_hessian(act, Im, token_order).sums());
}

// Block histograms count what add_block_histogram counts, bin for bin: a ragged last block,
// blocks whose amax is a bin's first float or the float before it, zero, NaN (skipped) and
// infinite blocks, values below and above the range; one slot, and rows to several slots.
TEST_F(CudaOps, BlockHistogramsAreTheCpus) {
  const int64_t rows = 300, cols = 37, slots = 5, K = 2;
  const std::vector<float> t = headroom_thresholds();
  std::vector<float> x = spread(normal(rows * cols), rng());
  std::uniform_int_distribution<size_t> pick(0, t.size() - 1);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = &x[static_cast<size_t>(r * cols)];
    switch (r % 6) {
      case 0:  // a block whose amax is exactly a bin's first float
        row[3] = t[pick(rng())];
        for (int i = 0; i < 16; ++i)
          if (i != 3) row[i] = 0.0f;
        break;
      case 1:  // the float before it
        row[5] = -std::nextafter(t[pick(rng())], 0.0f);
        for (int i = 0; i < 16; ++i)
          if (i != 5) row[i] = 0.0f;
        break;
      case 2:  // zero, NaN beside a value, infinity
        for (int i = 0; i < 16; ++i)
          row[i] = 0.0f;
        row[16] = NAN;
        row[32] = INFINITY;
        break;
      case 3:  // below and above the bins' range
        row[0] = 0x1p-120f;
        row[20] = 0x1p100f;
        break;
      default:
        break;
    }
  }
  std::vector<int32_t> slot_of(static_cast<size_t>(rows * K));
  for (int64_t r = 0; r < rows; ++r) {
    slot_of[static_cast<size_t>(r * K)] = static_cast<int32_t>(r % slots);
    slot_of[static_cast<size_t>(r * K + 1)] = static_cast<int32_t>((r / 3 + 1) % slots);
  }
  gpu::DeviceBuffer dx = up(x), dt = up(t), ds = up(slot_of);
  gpu::DeviceBuffer one = up(std::vector<unsigned long long>(kHistogramBins, 0));
  gpu::DeviceBuffer many = up(std::vector<unsigned long long>(slots * kHistogramBins, 0));
  block_histogram(dx.as<float>(), rows, cols, nullptr, 1, dt.as<float>(),
                  one.as<unsigned long long>(), st());
  block_histogram(dx.as<float>(), rows, cols, ds.as<int32_t>(), K, dt.as<float>(),
                  many.as<unsigned long long>(), st());
  const auto got_one = down<unsigned long long>(one, kHistogramBins);
  const auto got_many = down<unsigned long long>(many, static_cast<size_t>(slots * kHistogramBins));
  std::vector<int64_t> want(kHeadroomBins, 0);
  add_block_histogram(x.data(), rows, cols, want);
  EXPECT_EQ(std::vector<int64_t>(got_one.begin(), got_one.end()), want);
  std::vector<std::vector<int64_t>> want_many(slots, std::vector<int64_t>(kHeadroomBins, 0));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < K; ++j)
      add_block_histogram(&x[static_cast<size_t>(r * cols)], 1, cols,
                          want_many[static_cast<size_t>(slot_of[static_cast<size_t>(r * K + j)])]);
  }
  for (int64_t sl = 0; sl < slots; ++sl) {
    const auto first = got_many.begin() + sl * kHistogramBins;
    EXPECT_EQ(std::vector<int64_t>(first, first + kHistogramBins),
              want_many[static_cast<size_t>(sl)])
        << "slot " << sl;
  }
}

}  // namespace
}  // namespace strata::ops::cuda
