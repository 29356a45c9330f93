#include "engine/memory_plan.h"

#include <algorithm>

#include "core/error.h"

namespace strata {

std::string format_gib(uint64_t b) {
  return str(static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0)).substr(0, 6) + " GiB";
}

namespace {

struct Layout {
  uint64_t fixed = 0, least = 0;
  bool fits = false;
  HiddenTier tier = HiddenTier::kFile;
  std::vector<PlannedChunk> chunks;
};

// The plan with `buffers` device buffers for layer weights (the rules in memory_plan.h).
Layout layout(const GpuMemoryInputs& in, const GpuMemoryPlan& p, int buffers) {
  const uint64_t H = static_cast<uint64_t>(in.hidden_size);
  const uint64_t per_token = in.forward_per_token + H * 4;
  const uint64_t left = in.left;
  Layout o;
  o.fixed = static_cast<uint64_t>(buffers) * in.max_blob + in.max_conv + in.attention +
            p.meta_bytes + (16 << 20) + in.quantizer;
  o.least = o.fixed + (per_token + 4 * H) * static_cast<uint64_t>(p.largest);
  o.fits = o.least <= left;
  if (!o.fits) return o;
  if (!in.force_host &&
      o.fixed + p.store_bytes + per_token * static_cast<uint64_t>(p.largest) <= left) {
    o.tier = HiddenTier::kDevice;
  } else if (in.host_fits) {
    o.tier = HiddenTier::kPinned;
  }
  // Off the device, each chunk also needs two bf16 in/out buffers for the overlapped copies.
  const uint64_t token_bytes = per_token + (o.tier == HiddenTier::kDevice ? 0 : 4 * H);
  const uint64_t room = left - o.fixed - (o.tier == HiddenTier::kDevice ? p.store_bytes : 0);
  const int64_t cap = in.force_host
                          ? p.largest
                          : std::max<int64_t>(p.largest, static_cast<int64_t>(room / token_bytes));
  const std::vector<int64_t>& n = in.batch_tokens;
  for (size_t b = 0; b < n.size();) {
    PlannedChunk c{b, b, p.token0[b], 0};
    while (c.last < n.size() && c.tokens + n[c.last] <= cap) {
      c.tokens += n[c.last];
      ++c.last;
    }
    o.chunks.push_back(c);
    b = c.last;
  }
  return o;
}

}  // namespace

GpuMemoryPlan plan_gpu_memory(const GpuMemoryInputs& in) {
  GpuMemoryPlan p;
  const std::vector<int64_t>& n = in.batch_tokens;
  const int64_t H = in.hidden_size;
  // Tokens: micro-batches back to back.
  p.token0.assign(n.size() + 1, 0);
  for (size_t b = 0; b < n.size(); ++b)
    p.token0[b + 1] = p.token0[b] + n[b];
  p.total = p.token0.back();
  for (int64_t t : n)
    p.largest = std::max(p.largest, t);
  p.store_bytes = static_cast<uint64_t>(p.total * H) * 2;
  p.meta_bytes = static_cast<uint64_t>(3 * p.total + static_cast<int64_t>(n.size())) * 8;

  const Layout two = layout(in, p, 2), one = layout(in, p, 1);
  STRATA_CHECK(one.fits, "GPU memory: --max_gpu_memory_gb leaves ", format_gib(in.left),
               " but a layer's weights (", format_gib(in.max_blob), ") and one micro-batch of ",
               p.largest, " tokens need ", format_gib(one.least),
               "; raise --max_gpu_memory_gb or lower --batch_size");
  // Two buffers let layer l+1 be copied in while layer l computes; one gives the memory of the
  // second to larger chunks (fewer and larger expert GEMMs).
  p.buffers = 2;
  if (in.weight_buffers == 1) {
    p.buffers = 1;
  } else if (in.weight_buffers == 2) {
    STRATA_CHECK(two.fits, "--gpu_weight_buffers 2: two layers' weights (",
                 format_gib(2 * in.max_blob), ") and one micro-batch need ", format_gib(two.least),
                 " of GPU memory, more than the ", format_gib(in.left), " left");
  } else if (!two.fits || 4 * one.chunks.size() <= 3 * two.chunks.size()) {
    p.buffers = 1;
  }
  const Layout& chosen = p.buffers == 2 ? two : one;
  p.tier = chosen.tier;
  p.chunks = chosen.chunks;
  for (const PlannedChunk& c : p.chunks)
    p.chunk_max = std::max(p.chunk_max, c.tokens);
  return p;
}

}  // namespace strata
