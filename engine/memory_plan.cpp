#include "engine/memory_plan.h"

#include <algorithm>

#include "core/error.h"

namespace strata {

std::string format_gib(uint64_t b) {
  return str(static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0)).substr(0, 6) + " GiB";
}

namespace {

// Token metadata: positions, sequence starts and the chunks' sequence bounds take at most
// 3 * total; each chunk adds its closing bound, and chunks number at most the sequences when
// split (counted here from seq_tokens) or the micro-batches (added by the caller).
uint64_t meta_bytes(int64_t total, const std::vector<std::vector<int64_t>>& seq_tokens) {
  uint64_t seqs = 0;
  for (const std::vector<int64_t>& s : seq_tokens)
    seqs += s.size();
  return static_cast<uint64_t>(3 * total) * 8 + seqs * 8;
}

struct Layout {
  uint64_t fixed = 0, least = 0, meta = 0;
  bool fits = false;
  HiddenTier tier = HiddenTier::kFile;
  std::vector<PlannedChunk> chunks;
};

// The plan with `buffers` device buffers for layer weights (the rules in memory_plan.h); split:
// sequences are the unit.
Layout layout(const GpuMemoryInputs& in, const GpuMemoryPlan& p, int buffers, bool split) {
  const uint64_t H = static_cast<uint64_t>(in.hidden_size);
  const uint64_t per_token = in.forward_per_token + H * 4;
  const uint64_t left = in.left;
  const int64_t unit = split ? p.longest_seq : p.largest;
  Layout o;
  o.meta = split ? meta_bytes(p.total, in.seq_tokens) : p.meta_bytes;
  o.fixed = static_cast<uint64_t>(buffers) * in.max_blob + in.max_conv + in.attention + o.meta +
            (16 << 20) + in.quantizer;
  o.least = o.fixed + (per_token + 4 * H) * static_cast<uint64_t>(unit);
  o.fits = o.least <= left;
  if (!o.fits) return o;
  if (!in.force_host && o.fixed + p.store_bytes + per_token * static_cast<uint64_t>(unit) <= left) {
    o.tier = HiddenTier::kDevice;
  } else if (in.host_fits) {
    o.tier = HiddenTier::kPinned;
  }
  // Off the device, each chunk also needs two bf16 in/out buffers for the overlapped copies.
  const uint64_t token_bytes = per_token + (o.tier == HiddenTier::kDevice ? 0 : 4 * H);
  const uint64_t room = left - o.fixed - (o.tier == HiddenTier::kDevice ? p.store_bytes : 0);
  const int64_t cap =
      in.force_host ? unit : std::max<int64_t>(unit, static_cast<int64_t>(room / token_bytes));
  const std::vector<int64_t>& n = in.batch_tokens;
  if (split) {  // consecutive sequences of one micro-batch
    for (size_t b = 0; b < n.size(); ++b) {
      const std::vector<int64_t>& seqs = in.seq_tokens[b];
      int64_t t0 = p.token0[b];
      for (size_t s = 0; s < seqs.size();) {
        PlannedChunk c{b, b + 1, t0, 0};
        while (s < seqs.size() && (c.tokens == 0 || c.tokens + seqs[s] <= cap))
          c.tokens += seqs[s++];
        o.chunks.push_back(c);
        t0 += c.tokens;
      }
    }
    return o;
  }
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

// The micro-batches' tokens (token0, total, largest, longest_seq, store and meta bytes).
GpuMemoryPlan tokens_of(const GpuMemoryInputs& in) {
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
  STRATA_ASSERT(in.seq_tokens.empty() || in.seq_tokens.size() == n.size(), "sequences given for ",
                in.seq_tokens.size(), " of ", n.size(), " micro-batches");
  for (size_t b = 0; b < in.seq_tokens.size(); ++b) {
    int64_t sum = 0;
    for (int64_t t : in.seq_tokens[b]) {
      p.longest_seq = std::max(p.longest_seq, t);
      sum += t;
    }
    STRATA_ASSERT(sum == n[b], "micro-batch ", b, " has ", n[b], " tokens, its sequences ", sum);
  }
  p.store_bytes = static_cast<uint64_t>(p.total * H) * 2;
  p.meta_bytes = meta_bytes(p.total, {}) + static_cast<uint64_t>(n.size()) * 8;
  return p;
}

// One weight buffer and one micro-batch, or (when that does not fit and the sequences are given)
// one sequence: the least the plan needs.
Layout least_layout(const GpuMemoryInputs& in, const GpuMemoryPlan& p) {
  Layout one = layout(in, p, 1, false);
  if (!one.fits && !in.seq_tokens.empty()) one = layout(in, p, 1, true);
  return one;
}

// The inputs with the routed experts decompressed `slice` at a time (memory_plan.h "Slices").
GpuMemoryInputs sliced(const GpuMemoryInputs& in, int64_t slice) {
  GpuMemoryInputs s = in;
  s.max_conv = in.max_conv_deferred + static_cast<uint64_t>(slice) * in.expert_slot;
  s.quantizer += in.quantizer_deferred;
  return s;
}

// The plan for fixed converted weights (the rules in memory_plan.h, slices aside).
GpuMemoryPlan plan_fixed(const GpuMemoryInputs& in) {
  GpuMemoryPlan p = tokens_of(in);
  Layout two = layout(in, p, 2, false), one = layout(in, p, 1, false);
  if ((!one.fits || in.force_split) &&
      !in.seq_tokens.empty()) {  // sequences of a micro-batch in separate chunks
    p.split = true;
    two = layout(in, p, 2, true);
    one = layout(in, p, 1, true);
    STRATA_CHECK(one.fits, "GPU memory: --max_gpu_memory_gb leaves ", format_gib(in.left),
                 " but a layer's weights (", format_gib(in.max_blob),
                 ") and the longest calibration sequence (", p.longest_seq, " tokens) need ",
                 format_gib(one.least), "; raise --max_gpu_memory_gb to at least ",
                 format_gib(in.limit - in.left + one.least), " or lower --calib_seq");
  }
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
  p.meta_bytes = chosen.meta;
  for (const PlannedChunk& c : p.chunks)
    p.chunk_max = std::max(p.chunk_max, c.tokens);
  return p;
}

}  // namespace

GpuMemoryPlan plan_gpu_memory(const GpuMemoryInputs& in) {
  const int64_t E = in.experts;
  const bool can_slice = in.expert_slot > 0 && E > 1 && in.max_conv_deferred < in.max_conv;
  auto with_slice = [&](int64_t slice) {
    GpuMemoryPlan p = plan_fixed(sliced(in, slice));
    p.expert_slice = slice;
    return p;
  };
  if (in.force_expert_slice > 0) {
    // The test hook must slice, or the tests that use it would pass on unsliced runs.
    STRATA_CHECK(can_slice,
                 "--test_gpu_expert_slice: this run has no routed experts of a "
                 "compressed source to decompress in slices");
    STRATA_CHECK(in.force_expert_slice < E, "--test_gpu_expert_slice ", in.force_expert_slice,
                 ": a slice must be below the layer's ", E, " routed experts");
    return with_slice(in.force_expert_slice);
  }
  if (!can_slice) return plan_fixed(in);
  const GpuMemoryPlan tokens = tokens_of(in);
  if (least_layout(in, tokens).fits) return plan_fixed(in);
  // The whole layer's experts decompressed at once do not fit: slices of them. One expert at a
  // time is the least; half of what that leaves goes to more experts a slice, half to chunks.
  const Layout one = least_layout(sliced(in, 1), tokens);
  STRATA_CHECK(one.fits, "GPU memory: --max_gpu_memory_gb leaves ", format_gib(in.left),
               " but a layer's weights (", format_gib(in.max_blob),
               "), its converted weights with the routed experts decompressed one at a time (",
               format_gib(in.max_conv_deferred + in.expert_slot), ") and ",
               in.seq_tokens.empty()
                   ? str("one micro-batch of ", tokens.largest, " tokens")
                   : str("the longest calibration sequence (", tokens.longest_seq, " tokens)"),
               " need ", format_gib(one.least), "; raise --max_gpu_memory_gb to at least ",
               format_gib(in.limit - in.left + one.least),
               in.seq_tokens.empty() ? " or lower --batch_size" : " or lower --calib_seq");
  const uint64_t spare = in.left - one.least;
  const int64_t slice =
      std::min<int64_t>(E - 1, 1 + static_cast<int64_t>(spare / 2 / in.expert_slot));
  return with_slice(slice);
}

}  // namespace strata
