// ops/cuda/amax.h against ops::amax and ops::column_stats.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cuda/amax.h"
#include "ops/ops.h"
#include "tests/ops/cuda/cuda_test_util.h"

namespace strata::ops::cuda {
namespace {

// A slot is ops::amax of everything accumulated into it, bit for bit; a NaN makes it NaN (the
// device keeps the NaN's bits without the sign, the CPU returns the canonical NaN).
TEST_F(CudaOps, AmaxIsOpsAmaxAndNanWins) {
  for (int64_t n : {1, 7, 1000, 300001}) {
    std::vector<float> x = normal(n, 10.0f);
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

}  // namespace
}  // namespace strata::ops::cuda
