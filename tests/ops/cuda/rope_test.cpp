// ops/cuda/rope.h against ops::rope for each RoPE variant and layout.
#include <cmath>
#include <vector>

#include "ops/cuda/rope.h"
#include "ops/ops.h"
#include "tests/ops/cuda/cuda_test_util.h"

namespace strata::ops::cuda {
namespace {

// The same fp32 angle; cos and sin differ by an ulp or two (fp64 then one rounding against the
// CPU's fp32 cos, then the attention factor), and a fused multiply-add may round the rotation
// once where the CPU rounds twice: 4e-6 of (|x| + 1).
TEST_F(CudaOps, RopeVariantsMatchOps) {
  RopeParams def;
  RopeParams lin;
  lin.kind = RopeParams::Kind::kLinear;
  lin.factor = 4.0;
  RopeParams l3;
  l3.kind = RopeParams::Kind::kLlama3;
  l3.theta = 500000.0;
  l3.factor = 8.0;
  l3.original_max_position = 8192;
  RopeParams yarn;
  yarn.kind = RopeParams::Kind::kYarn;
  yarn.factor = 40.0;
  yarn.original_max_position = 4096;
  yarn.attention_factor = 1.3465735902799727;
  struct Case {
    RopeParams p;
    int64_t head_stride, offset, rot_dim;
    bool interleaved;
  };
  // Whole heads (GQA), MLA's rotated tail of each head (interleaved or not), a partial rotation.
  const Case cases[] = {{def, 64, 0, 64, false},     {lin, 32, 0, 16, false},
                        {l3, 128, 0, 128, false},    {yarn, 192, 128, 64, true},
                        {yarn, 192, 128, 64, false}, {def, 10, 2, 6, true}};
  const int64_t T = 37, nH = 3;
  std::vector<int64_t> pos(T);
  for (int64_t t = 0; t < T; ++t)
    pos[t] = (t * 977) % 6000;  // ragged positions, not in order
  gpu::DeviceBuffer dpos = up(pos);
  for (const Case& c : cases) {
    std::vector<float> x = normal(T * nH * c.head_stride);
    const std::vector<double> f = rope_inv_freq(c.p, c.rot_dim);
    const std::vector<float> ff(f.begin(), f.end());
    gpu::DeviceBuffer dx = up(x), df = up(ff);
    rope(dx.as<float>(), T, nH, c.head_stride, c.offset, c.rot_dim, dpos.as<int64_t>(),
         df.as<float>(), c.p.attention_factor, c.interleaved, st());
    const auto y = down<float>(dx, x.size());
    const std::vector<float> x0 = x;
    ops::rope(x.data(), T, nH, c.head_stride, c.offset, c.rot_dim, pos.data(), f,
              c.p.attention_factor, c.interleaved);
    for (size_t i = 0; i < x.size(); ++i) {
      const int64_t col = static_cast<int64_t>(i) % c.head_stride;
      if (col < c.offset || col >= c.offset + c.rot_dim) {
        ASSERT_EQ(bits_of(y[i]), bits_of(x0[i])) << "untouched column " << col;
        continue;
      }
      ASSERT_NEAR(y[i], x[i], 4e-6f * (std::fabs(x0[i]) + 1.0f))
          << "rot_dim " << c.rot_dim << " offset " << c.offset << " at " << i;
    }
  }
}

}  // namespace
}  // namespace strata::ops::cuda
