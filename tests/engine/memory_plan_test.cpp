// The GPU loop's memory plan (engine/memory_plan.h), without a GPU: every expected value below is
// worked out by hand from the rules written in memory_plan.h, step by step in the comments:
//   per_token = forward_per_token + 4H;  off the device a token also takes 4H (in/out buffers)
//   meta      = (3 * total + micro-batches) * 8;  store = total * 2H
//   fixed(B)  = B * max_blob + max_conv + attention + meta + 16 MiB + quantizer
//   least(B)  = fixed(B) + (per_token + 4H) * largest; fits when least(B) <= left
//   device    when fixed(B) + store + per_token * largest <= left (and not force_host)
//   cap       = max(largest, room / token_bytes), room = left - fixed(B) (- store on the device)
//   B = 1 when forced, when two do not fit, or when 4 * chunks(1) <= 3 * chunks(2).
#include "engine/memory_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"

namespace strata {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

void expect_chunks(const GpuMemoryPlan& p, const std::vector<PlannedChunk>& want) {
  ASSERT_EQ(p.chunks.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(p.chunks[i].first, want[i].first) << "chunk " << i;
    EXPECT_EQ(p.chunks[i].last, want[i].last) << "chunk " << i;
    EXPECT_EQ(p.chunks[i].token0, want[i].token0) << "chunk " << i;
    EXPECT_EQ(p.chunks[i].tokens, want[i].tokens) << "chunk " << i;
  }
}

// The message of the strata::Error that plan_gpu_memory throws ("" when it does not).
std::string refusal(const GpuMemoryInputs& in) {
  try {
    plan_gpu_memory(in);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Four micro-batches of 100 tokens, H = 1024, forward scratch 12288 bytes a token:
//   per_token = 12288 + 4096 = 16384; off the device 20480; total 400, largest 100
//   meta = (1200 + 4) * 8 = 9632; store = 400 * 2048 = 819200
GpuMemoryInputs four_batches(uint64_t max_blob, uint64_t left) {
  GpuMemoryInputs in;
  in.left = left;
  in.max_blob = max_blob;
  in.forward_per_token = 12288;
  in.hidden_size = 1024;
  in.batch_tokens = {100, 100, 100, 100};
  return in;
}

TEST(GpuMemoryPlan, TwoBuffersFitWithTheStoreOnTheDevice) {
  // max_blob 64 MiB, left 256 MiB = 268435456:
  //   fixed(2) = 134217728 + 9632 + 16777216 = 151004576; least(2) = + 20480 * 100 = 153052576
  //   device: 151004576 + 819200 + 16384 * 100 = 153462176 <= left
  //   room = 268435456 - 151004576 - 819200 = 116611680; cap = 116611680 / 16384 = 7117 tokens:
  //   one chunk of all four. One buffer: also one chunk; 4 * 1 <= 3 * 1 is false: two buffers.
  const GpuMemoryPlan p = plan_gpu_memory(four_batches(64 * kMiB, 256 * kMiB));
  EXPECT_EQ(p.buffers, 2);
  EXPECT_EQ(p.tier, HiddenTier::kDevice);
  expect_chunks(p, {{0, 4, 0, 400}});
  EXPECT_EQ(p.token0, (std::vector<int64_t>{0, 100, 200, 300, 400}));
  EXPECT_EQ(p.total, 400);
  EXPECT_EQ(p.largest, 100);
  EXPECT_EQ(p.chunk_max, 400);
  EXPECT_EQ(p.store_bytes, 819200u);
  EXPECT_EQ(p.meta_bytes, 9632u);
}

TEST(GpuMemoryPlan, OneBufferWhenTwoDoNotFit) {
  // max_blob 120 MiB = 125829120, left 256 MiB:
  //   fixed(2) = 251658240 + 9632 + 16777216 = 268445088 > 268435456: two do not fit
  //   fixed(1) = 142615968; device: 142615968 + 819200 + 1638400 = 145073568 <= left
  const GpuMemoryPlan p = plan_gpu_memory(four_batches(120 * kMiB, 256 * kMiB));
  EXPECT_EQ(p.buffers, 1);
  EXPECT_EQ(p.tier, HiddenTier::kDevice);
  expect_chunks(p, {{0, 4, 0, 400}});
}

TEST(GpuMemoryPlan, ForcedBufferCounts) {
  // The first case forced to one buffer: fixed(1) = 83895712, device, one chunk.
  GpuMemoryInputs in = four_batches(64 * kMiB, 256 * kMiB);
  in.weight_buffers = 1;
  GpuMemoryPlan p = plan_gpu_memory(in);
  EXPECT_EQ(p.buffers, 1);
  EXPECT_EQ(p.tier, HiddenTier::kDevice);
  expect_chunks(p, {{0, 4, 0, 400}});
  // Two forced where they fit.
  in.weight_buffers = 2;
  EXPECT_EQ(plan_gpu_memory(in).buffers, 2);
  // Two forced where they do not (the second case): least(2) = 268445088 + 2048000 = 270493088
  // = 0.251916 GiB; two layers' weights 240 MiB = 0.234375 GiB; left 0.25 GiB (six characters
  // of each number).
  in = four_batches(120 * kMiB, 256 * kMiB);
  in.weight_buffers = 2;
  EXPECT_EQ(refusal(in),
            "--gpu_weight_buffers 2: two layers' weights (0.2343 GiB) and one micro-batch need "
            "0.2519 GiB of GPU memory, more than the 0.25 GiB left");
}

TEST(GpuMemoryPlan, RefusedWhenOneBufferAndOneMicroBatchDoNotFit) {
  // max_blob 64 MiB, left 80 MiB = 83886080 = 0.078125 GiB:
  //   least(1) = 67108864 + 9632 + 16777216 + 20480 * 100 = 85943712 = 0.0800413 GiB > left
  EXPECT_EQ(refusal(four_batches(64 * kMiB, 80 * kMiB)),
            "GPU memory: --max_gpu_memory_gb leaves 0.0781 GiB but a layer's weights (0.0625 GiB) "
            "and one micro-batch of 100 tokens need 0.0800 GiB; raise --max_gpu_memory_gb or "
            "lower --batch_size");
}

// four_batches with each micro-batch of sequences {50, 30, 20}, and left between the split and
// the unsplit least (split: meta = (3 * 400 + 12) * 8 = 9696):
//   unsplit least(1) = 67108864 + 9632 + 16777216 + 20480 * 100 = 85943712 > 85000000
//   split   fixed(1) = 67108864 + 9696 + 16777216 = 83895776; least(1) = + 20480 * 50 = 84919776
//   device: 83895776 + 819200 + 16384 * 50 = 85534176 > left: pinned, token 20480 bytes
//   room = 85000000 - 83895776 = 1104224; cap = 1104224 / 20480 = 53 tokens: per micro-batch the
//   chunks {50} and {30 + 20}; two buffers do not fit (64 MiB more).
GpuMemoryInputs split_batches(uint64_t left) {
  GpuMemoryInputs in = four_batches(64 * kMiB, left);
  in.seq_tokens.assign(4, {50, 30, 20});
  in.limit = left + 100 * kMiB;
  return in;
}

TEST(GpuMemoryPlan, SequencesOfAMicroBatchWhenOneMicroBatchDoesNotFit) {
  const GpuMemoryPlan p = plan_gpu_memory(split_batches(85000000));
  EXPECT_TRUE(p.split);
  EXPECT_EQ(p.buffers, 1);
  EXPECT_EQ(p.tier, HiddenTier::kPinned);
  EXPECT_EQ(p.meta_bytes, 9696u);
  EXPECT_EQ(p.largest, 100);
  EXPECT_EQ(p.longest_seq, 50);
  EXPECT_EQ(p.chunk_max, 50);
  expect_chunks(p, {{0, 1, 0, 50},
                    {0, 1, 50, 50},
                    {1, 2, 100, 50},
                    {1, 2, 150, 50},
                    {2, 3, 200, 50},
                    {2, 3, 250, 50},
                    {3, 4, 300, 50},
                    {3, 4, 350, 50}});
  // Where whole micro-batches fit, they are not split (the sequences change nothing).
  const GpuMemoryPlan whole = plan_gpu_memory(split_batches(256 * kMiB));
  EXPECT_FALSE(whole.split);
  expect_chunks(whole, {{0, 4, 0, 400}});
}

TEST(GpuMemoryPlan, RefusedOnlyWhenOneSequenceDoesNotFit) {
  // One byte below the split least: left 84919775 = 0.079088 GiB, least 84919776; the cap that
  // would do: limit - left + least = 100 MiB + 84919776 = 189777376 = 0.176745 GiB.
  EXPECT_EQ(refusal(split_batches(84919776)), "");
  EXPECT_EQ(refusal(split_batches(84919775)),
            "GPU memory: --max_gpu_memory_gb leaves 0.0790 GiB but a layer's weights (0.0625 GiB) "
            "and the longest calibration sequence (50 tokens) need 0.0790 GiB; raise "
            "--max_gpu_memory_gb to at least 0.1767 GiB or lower --calib_seq");
}

// Slices (memory_plan.h "Slices"): split_batches with a layer whose decompressed routed experts
// (256 MiB converted) cannot fit, deferred: 1 MiB still converted at set_layer and 4 MiB an
// expert in the slice buffer, 64 experts.
//   a slice of one: max_conv = 1 MiB + 4 MiB = 5242880
//     unsplit least(1) = 85943712 + 5242880 = 91186592; split least(1) = 84919776 + 5242880
//     = 90162656
GpuMemoryInputs sliced_experts(uint64_t left) {
  GpuMemoryInputs in = split_batches(left);
  in.max_conv = 256 * kMiB;
  in.max_conv_deferred = 1 * kMiB;
  in.expert_slot = 4 * kMiB;
  in.experts = 64;
  return in;
}

TEST(GpuMemoryPlan, ExpertsInSlicesWhenALayersDecompressedExpertsDoNotFit) {
  // left 120 MiB = 125829120: the unsplit least with a slice of one fits (91186592); spare =
  //   125829120 - 91186592 = 34642528, half of it 17321264 = 4.13 slots: slice = 1 + 4 = 5,
  //   max_conv = 1 MiB + 20 MiB = 22020096:
  //   fixed(1) = 67108864 + 22020096 + 9632 + 16777216 = 105915808; least(1) = + 2048000 fits
  //   device: 105915808 + 819200 + 1638400 = 108373408 <= left; room = 125829120 - 105915808
  //   - 819200 = 19094112 = 1165 tokens of 16384: one chunk; two buffers: 64 MiB more, no.
  const GpuMemoryPlan p = plan_gpu_memory(sliced_experts(120 * kMiB));
  EXPECT_EQ(p.expert_slice, 5);
  EXPECT_FALSE(p.split);
  EXPECT_EQ(p.buffers, 1);
  EXPECT_EQ(p.tier, HiddenTier::kDevice);
  expect_chunks(p, {{0, 4, 0, 400}});
  // Without a deferrable part (everything converted at set_layer either way) it is refused as
  // before.
  GpuMemoryInputs fixed = sliced_experts(120 * kMiB);
  fixed.max_conv_deferred = fixed.max_conv;
  EXPECT_NE(refusal(fixed), "");
}

TEST(GpuMemoryPlan, ExpertsUnslicedWhereTheLayerFits) {
  // 32 MiB converted at set_layer fits beside four micro-batches in 256 MiB: no slices.
  GpuMemoryInputs in = sliced_experts(256 * kMiB);
  in.max_conv = 32 * kMiB;
  EXPECT_EQ(plan_gpu_memory(in).expert_slice, 0);
  // The test hook forces a slice (below all the experts) whatever the budget, and refuses where
  // it cannot slice.
  in.force_expert_slice = 2;
  EXPECT_EQ(plan_gpu_memory(in).expert_slice, 2);
  in.force_expert_slice = 64;
  EXPECT_EQ(refusal(in),
            "--test_gpu_expert_slice 64: a slice must be below the layer's 64 routed "
            "experts");
  in.force_expert_slice = 2;
  in.max_conv_deferred = in.max_conv;
  EXPECT_EQ(refusal(in),
            "--test_gpu_expert_slice: this run has no routed experts of a compressed "
            "source to decompress in slices");
}

TEST(GpuMemoryPlan, ExpertSlicesRefusedOnlyWhenOneExpertAndOneSequenceDoNotFit) {
  // At the split least with a slice of one (90162656): one expert at a time, sequences apart.
  const GpuMemoryPlan p = plan_gpu_memory(sliced_experts(90162656));
  EXPECT_EQ(p.expert_slice, 1);
  EXPECT_TRUE(p.split);
  EXPECT_EQ(p.chunk_max, 50);
  // One byte below: refused, with the cap that would do: limit - left + least = 100 MiB +
  // 90162656 = 195020256 = 0.1816 GiB.
  EXPECT_EQ(refusal(sliced_experts(90162655)),
            "GPU memory: --max_gpu_memory_gb leaves 0.0839 GiB but a layer's weights (0.0625 "
            "GiB), its converted weights with the routed experts decompressed one at a time "
            "(0.0048 GiB) and the longest calibration sequence (50 tokens) need 0.0839 GiB; raise "
            "--max_gpu_memory_gb to at least 0.1816 GiB or lower --calib_seq");
}

TEST(GpuMemoryPlan, EveryFixedTermCountsTowardTheLeast) {
  // least(1) = 64 MiB blob + 1 MiB converted + 2 MiB attention + 3 MiB quantizer + 9632 meta
  //   + 16 MiB + 2048000 = 86 MiB + 2057632 = 90177536 + 2057632 = 92235168: fits at exactly
  //   that, refused one byte below.
  GpuMemoryInputs in = four_batches(64 * kMiB, 92235168);
  in.max_conv = 1 * kMiB;
  in.attention = 2 * kMiB;
  in.quantizer = 3 * kMiB;
  EXPECT_EQ(refusal(in), "");
  EXPECT_EQ(plan_gpu_memory(in).buffers, 1);  // least(2) is 64 MiB more
  in.left = 92235167;
  EXPECT_NE(refusal(in).find("--max_gpu_memory_gb leaves"), std::string::npos);
}

// n micro-batches of 100 tokens, H = 1024, no forward scratch (per_token = 4096; off the
// device 8192 a token, so 100 * 8192 = 819200 a micro-batch), max_blob 819200, and
// left = fixed(2) + 2867200 (room(2) = 2867200: cap 350 tokens, 3 micro-batches a chunk;
// room(1) = 2867200 + 819200 = 3686400: cap 450, 4 micro-batches a chunk).
GpuMemoryInputs hundreds(size_t n) {
  GpuMemoryInputs in;
  in.max_blob = 819200;
  in.forward_per_token = 0;
  in.hidden_size = 1024;
  in.batch_tokens.assign(n, 100);
  const uint64_t meta = (300 * n + n) * 8;
  in.left = 2 * in.max_blob + meta + 16 * kMiB + 2867200;
  return in;
}

TEST(GpuMemoryPlan, OneBufferWhenItCutsTheChunksByAQuarter) {
  // n = 24: total 2400, store 4915200, meta 57792, left = 1638400 + 57792 + 16777216 + 2867200
  //   = 21340608. Device for two: fixed(2) 18473408 + 4915200 + 409600 = 23798208 > left; for
  //   one: 17654208 + 5324800 = 22979008 > left: pinned either way (host_fits).
  //   Two: 3 a chunk, 8 chunks; one: 4 a chunk, 6 chunks; 4 * 6 <= 3 * 8 (24 <= 24): one.
  const GpuMemoryPlan p = plan_gpu_memory(hundreds(24));
  EXPECT_EQ(p.buffers, 1);
  EXPECT_EQ(p.tier, HiddenTier::kPinned);
  expect_chunks(p, {{0, 4, 0, 400},
                    {4, 8, 400, 400},
                    {8, 12, 800, 400},
                    {12, 16, 1200, 400},
                    {16, 20, 1600, 400},
                    {20, 24, 2000, 400}});
  EXPECT_EQ(p.chunk_max, 400);
  // Two forced: the two-buffer chunks, 3 micro-batches each.
  GpuMemoryInputs in = hundreds(24);
  in.weight_buffers = 2;
  const GpuMemoryPlan q = plan_gpu_memory(in);
  EXPECT_EQ(q.buffers, 2);
  ASSERT_EQ(q.chunks.size(), 8u);
  EXPECT_EQ(q.chunks[7].first, 21u);
  EXPECT_EQ(q.chunks[7].token0, 2100);
  EXPECT_EQ(q.chunk_max, 300);
}

TEST(GpuMemoryPlan, TwoBuffersWhenOneCutsTheChunksByLessThanAQuarter) {
  // n = 25: store 5120000, meta 60200, left = 1638400 + 60200 + 16777216 + 2867200 = 21343016;
  //   device for two: 18475816 + 5120000 + 409600 > left; for one: 17656616 + 5529600 > left.
  //   Two: 3 a chunk, 9 chunks (the last one micro-batch); one: 4 a chunk, 7 chunks;
  //   4 * 7 <= 3 * 9 (28 <= 27) is false: two.
  const GpuMemoryPlan p = plan_gpu_memory(hundreds(25));
  EXPECT_EQ(p.buffers, 2);
  EXPECT_EQ(p.tier, HiddenTier::kPinned);
  ASSERT_EQ(p.chunks.size(), 9u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(p.chunks[i].first, 3 * i);
    EXPECT_EQ(p.chunks[i].last, 3 * i + 3);
    EXPECT_EQ(p.chunks[i].tokens, 300);
  }
  EXPECT_EQ(p.chunks[8].first, 24u);
  EXPECT_EQ(p.chunks[8].last, 25u);
  EXPECT_EQ(p.chunks[8].token0, 2400);
  EXPECT_EQ(p.chunks[8].tokens, 100);
}

TEST(GpuMemoryPlan, FileTierWhenHostMemoryMayNotHoldTheStore) {
  // The quarter case with host_fits false: neither device nor pinned; the chunks are the same
  // (off the device either way).
  GpuMemoryInputs in = hundreds(24);
  in.host_fits = false;
  const GpuMemoryPlan p = plan_gpu_memory(in);
  EXPECT_EQ(p.tier, HiddenTier::kFile);
  EXPECT_EQ(p.buffers, 1);
  EXPECT_EQ(p.chunks.size(), 6u);
}

TEST(GpuMemoryPlan, ForcedHostStoreRunsOneMicroBatchPerChunk) {
  // The first case with force_host: not on the device although it fits there; cap = largest
  // = 100: four chunks of one micro-batch for both counts; 16 <= 12 is false: two buffers.
  GpuMemoryInputs in = four_batches(64 * kMiB, 256 * kMiB);
  in.force_host = true;
  GpuMemoryPlan p = plan_gpu_memory(in);
  EXPECT_EQ(p.tier, HiddenTier::kPinned);
  EXPECT_EQ(p.buffers, 2);
  expect_chunks(p, {{0, 1, 0, 100}, {1, 2, 100, 100}, {2, 3, 200, 100}, {3, 4, 300, 100}});
  in.host_fits = false;
  p = plan_gpu_memory(in);
  EXPECT_EQ(p.tier, HiddenTier::kFile);
  EXPECT_EQ(p.chunks.size(), 4u);
}

TEST(GpuMemoryPlan, ChunksGroupConsecutiveMicroBatchesUpToTheCap) {
  // Micro-batches of 50, 120, 80, 30, 200, 10 tokens (token0 0 50 170 250 280 480; total 490,
  // largest 200), H = 1024, forward scratch 4096 (per_token 8192), max_blob 65536:
  //   meta = (1470 + 6) * 8 = 11808; store = 490 * 2048 = 1003520
  //   fixed(2) = 131072 + 11808 + 16777216 = 16920096; left = fixed(2) + store + 1638400
  //   = 19562016, so room(2) = 1638400 = 8192 * 200: device (exactly), cap 200:
  //     50 + 120 = 170 (+ 80 = 250 > 200) | 80 + 30 = 110 (+ 200 > 200) | 200 (+ 10 > 200) | 10
  //   One buffer: room(1) = 1703936, cap 208: the same four chunks; 16 <= 12 is false: two.
  GpuMemoryInputs in;
  in.max_blob = 65536;
  in.forward_per_token = 4096;
  in.hidden_size = 1024;
  in.batch_tokens = {50, 120, 80, 30, 200, 10};
  in.left = 19562016;
  GpuMemoryPlan p = plan_gpu_memory(in);
  EXPECT_EQ(p.buffers, 2);
  EXPECT_EQ(p.tier, HiddenTier::kDevice);
  expect_chunks(p, {{0, 2, 0, 170}, {2, 4, 170, 110}, {4, 5, 280, 200}, {5, 6, 480, 10}});
  EXPECT_EQ(p.token0, (std::vector<int64_t>{0, 50, 170, 250, 280, 480, 490}));
  EXPECT_EQ(p.chunk_max, 200);
  EXPECT_EQ(p.store_bytes, 1003520u);
  EXPECT_EQ(p.meta_bytes, 11808u);
  // One byte less: two buffers no longer hold the store beside the largest micro-batch: pinned,
  // each token 8192 + 4096: room(2) = 19562015 - 16920096 = 2641919, cap 214, so 200 + 10 = 210
  // now share a chunk: 3 chunks. One buffer keeps the store on the device (16854560 + 1003520 +
  // 1638400 = 19496480 <= left): room(1) = 19562015 - 16854560 - 1003520 = 1703935, cap 207:
  // 4 chunks; 16 <= 9 is false: two buffers, pinned.
  in.left = 19562015;
  p = plan_gpu_memory(in);
  EXPECT_EQ(p.buffers, 2);
  EXPECT_EQ(p.tier, HiddenTier::kPinned);
  expect_chunks(p, {{0, 2, 0, 170}, {2, 4, 170, 110}, {4, 6, 280, 210}});
}

TEST(GpuMemoryPlan, NoMicroBatchesNoChunks) {
  // A rank without micro-batches: total 0, meta 0, store 0; no chunks for either count, and
  // 4 * 0 <= 3 * 0: one buffer.
  GpuMemoryInputs in;
  in.max_blob = 64 * kMiB;
  in.hidden_size = 1024;
  in.left = 256 * kMiB;
  const GpuMemoryPlan p = plan_gpu_memory(in);
  EXPECT_EQ(p.buffers, 1);
  EXPECT_TRUE(p.chunks.empty());
  EXPECT_EQ(p.total, 0);
  EXPECT_EQ(p.store_bytes, 0u);
  EXPECT_EQ(p.meta_bytes, 0u);
  EXPECT_EQ(p.chunk_max, 0);
}

}  // namespace
}  // namespace strata
