// ops/cuda/amax.h against ops::amax.
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

}  // namespace
}  // namespace strata::ops::cuda
