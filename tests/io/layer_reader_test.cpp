// LayerReader: the bytes it reads are the checkpoint's bytes (compared with the mapped views),
// whatever the grouping of the names, and the ranges it plans are few and aligned.
#include "io/layer_reader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/gpu_memory.h"

namespace fs = std::filesystem;

namespace strata {
namespace {

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/tests/fixtures/models/qwen3_moe";

std::vector<std::string> with_prefix(const Checkpoint& ckpt, const std::string& p) {
  std::vector<std::string> out;
  for (const std::string& n : ckpt.tensor_names())
    if (n.starts_with(p)) out.push_back(n);
  return out;
}

void expect_same_bytes(const Checkpoint& ckpt, const LayerBlob& blob, const uint8_t* buf) {
  for (const auto& [name, item] : blob.items) {
    const Tensor t = ckpt.tensor(name);
    ASSERT_EQ(item.bytes, t.nbytes()) << name;
    ASSERT_EQ(item.shape, t.shape()) << name;
    ASSERT_EQ(item.dtype, t.dtype()) << name;
    ASSERT_LE(item.offset + item.bytes, blob.bytes) << name;
    EXPECT_EQ(std::memcmp(buf + item.offset, t.data<uint8_t>(), item.bytes), 0) << name;
  }
}

TEST(LayerReader, ReadsOneLayerInFewAlignedRanges) {
  const Checkpoint ckpt = Checkpoint::open(kModel);
  const std::vector<std::string> names = with_prefix(ckpt, "model.layers.1.");
  ASSERT_GT(names.size(), 10u);
  LayerReader reader(ckpt, 3);
  const LayerBlob blob = reader.plan(names);
  EXPECT_EQ(blob.items.size(), names.size());
  // One shard, and a layer's tensors lie next to each other (safetensors writers sort names).
  EXPECT_LE(blob.ranges.size(), ckpt.shards().size());
  // Each range starts at a tensor, which lands 4096-aligned in the buffer.
  for (const LayerBlob::Range& r : blob.ranges) {
    EXPECT_EQ(r.buffer_offset % 4096, 0u);
    bool starts_at_tensor = false;
    for (const auto& [name, item] : blob.items)
      starts_at_tensor |= item.offset == r.buffer_offset;
    EXPECT_TRUE(starts_at_tensor);
  }
  gpu::PinnedBuffer buf(blob.bytes);
  reader.read(blob, buf.data());
  expect_same_bytes(ckpt, blob, buf.data());
}

TEST(LayerReader, ScatteredNamesAndDirectReads) {
  const Checkpoint ckpt = Checkpoint::open(kModel);
  // Tensors from both ends of the file plus one from the middle, in no particular order.
  std::vector<std::string> all = ckpt.tensor_names();
  std::vector<std::string> names = {all.back(), all.front(), all[all.size() / 2]};
  for (bool direct : {false, true}) {
    LayerReader reader(ckpt, 2, direct);
    const LayerBlob blob = reader.plan(names);
    for (const LayerBlob::Range& r : blob.ranges) {
      EXPECT_EQ(r.buffer_offset % 4096, 0u);
      if (direct) {
        EXPECT_EQ(r.file_offset % 4096, 0u);
      }
    }
    gpu::PinnedBuffer buf(blob.bytes);
    reader.read(blob, buf.data());
    expect_same_bytes(ckpt, blob, buf.data());
  }
}

TEST(LayerReader, UnknownTensorIsAnError) {
  const Checkpoint ckpt = Checkpoint::open(kModel);
  LayerReader reader(ckpt);
  EXPECT_THROW(reader.plan({"model.layers.1.no_such.weight"}), Error);
}

// PageWarmer reads the planned bytes in order, never more than its window past what the
// consumer has declared read, and all of them once the consumer is through.
TEST(PageWarmer, ReadsAheadOfTheConsumerWithinItsWindow) {
  const Checkpoint ckpt = Checkpoint::open(kModel);
  LayerReader reader(ckpt);
  std::vector<LayerBlob> blobs = {reader.plan(with_prefix(ckpt, "model.layers.0.")),
                                  reader.plan(with_prefix(ckpt, "model.layers.1."))};
  uint64_t bytes[2] = {0, 0};
  for (int b = 0; b < 2; ++b)
    for (const LayerBlob::Range& r : blobs[b].ranges)
      bytes[b] += r.length;
  ASSERT_GT(bytes[0], 0u);
  ASSERT_GT(bytes[1], 0u);
  auto first_piece = [](const LayerBlob& b) {
    return std::min(b.ranges[0].length, LayerReader::kReadChunkBytes);
  };
  ReadPattern three;
  three.threads = 3;
  PageWarmer warm(blobs, 1, three);  // a window of one byte: one piece past the consumer at a time
  auto settle = [&](uint64_t want) {
    for (int i = 0; i < 2000 && warm.bytes_read() < want; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(30));  // no read beyond it follows
    return warm.bytes_read();
  };
  EXPECT_EQ(settle(first_piece(blobs[0])), first_piece(blobs[0]));
  warm.advance();  // the consumer read blob 0: the warmer may start blob 1
  EXPECT_EQ(settle(bytes[0] + first_piece(blobs[1])), bytes[0] + first_piece(blobs[1]));
  warm.advance();
  EXPECT_EQ(settle(bytes[0] + bytes[1]), bytes[0] + bytes[1]);
}

// Every planned byte is read once, and only those, whatever the pattern: pieces smaller or
// larger than the ranges, reads smaller than the pieces (the run's early reads use 1 MiB),
// reads of one page.
TEST(PageWarmer, EveryPatternReadsEachPlannedByteOnce) {
  const Checkpoint ckpt = Checkpoint::open(kModel);
  LayerReader reader(ckpt);
  const std::vector<LayerBlob> blobs = {reader.plan(with_prefix(ckpt, "model.layers.0.")),
                                        reader.plan(with_prefix(ckpt, "model.layers.1."))};
  uint64_t bytes = 0, largest = 0;
  for (const LayerBlob& b : blobs)
    for (const LayerBlob::Range& r : b.ranges) {
      bytes += r.length;
      largest = std::max(largest, r.length);
    }
  ASSERT_GT(largest, 3u * 4096);  // several reads of the smallest size
  for (const char* text : {"2:none:1:4", "1:none", "3:sequential:64:1024", "2:willneed:1:1024"}) {
    SCOPED_TRACE(text);
    PageWarmer warm(blobs, bytes, parse_read_pattern("--flag", text));
    for (int i = 0; i < 2000 && warm.bytes_read() < bytes; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::this_thread::sleep_for(std::chrono::milliseconds(30));  // no read beyond it follows
    EXPECT_EQ(warm.bytes_read(), bytes);
  }
}

// wait_read returns once the blobs up to the one asked for are read whole, stretching the
// window to reach it (here one byte: without the stretch the warmer would stop one piece past
// the consumer and the wait would never end); at once for a blob past the end; and when a read
// fails (a shard that is not there), instead of waiting for bytes that will not come.
TEST(PageWarmer, WaitReadReturnsOnceTheBlobIsReadOrCannotBe) {
  const Checkpoint ckpt = Checkpoint::open(kModel);
  LayerReader reader(ckpt);
  const std::vector<LayerBlob> blobs = {reader.plan(with_prefix(ckpt, "model.layers.0.")),
                                        reader.plan(with_prefix(ckpt, "model.layers.1."))};
  uint64_t bytes = 0;
  for (const LayerBlob& b : blobs)
    for (const LayerBlob::Range& r : b.ranges)
      bytes += r.length;
  ReadPattern small;
  small.threads = 2;
  small.piece_bytes = 4096;
  small.read_bytes = 4096;
  {
    PageWarmer warm(blobs, 1, small);
    auto waited = std::async(std::launch::async, [&]() { warm.wait_read(1); });
    ASSERT_EQ(waited.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    EXPECT_EQ(warm.bytes_read(), bytes);
    warm.wait_read(2);  // no such blob
  }
  LayerBlob missing;
  missing.ranges.push_back({"/nonexistent/strata/shard.safetensors", 0, 3 * 4096, 0});
  missing.bytes = 3 * 4096;
  PageWarmer warm({missing, blobs[0]}, 1ull << 30, small);
  auto waited = std::async(std::launch::async, [&]() { warm.wait_read(1); });
  ASSERT_EQ(waited.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_EQ(warm.bytes_read(), 0u);
}

TEST(ReadPattern, ParsesTheFlagsFormAndRefusesTheRest) {
  const ReadPattern def;
  const ReadPattern a = parse_read_pattern("--f", "16");
  EXPECT_EQ(a.threads, 16);
  EXPECT_EQ(a.piece_bytes, def.piece_bytes);
  EXPECT_EQ(a.read_bytes, def.read_bytes);
  EXPECT_EQ(a.sequential, def.sequential);  // the hint and sizes left out: the default's
  EXPECT_EQ(a.will_need, def.will_need);
  const ReadPattern b = parse_read_pattern("--f", "8:sequential:256:1024");
  EXPECT_EQ(b.threads, 8);
  EXPECT_TRUE(b.sequential);
  EXPECT_FALSE(b.will_need);
  EXPECT_EQ(b.piece_bytes, 256ull << 20);
  EXPECT_EQ(b.read_bytes, 1ull << 20);
  const ReadPattern c = parse_read_pattern("--f", "4:willneed:1");  // reads at most the piece
  EXPECT_TRUE(c.will_need);
  EXPECT_FALSE(c.sequential);
  EXPECT_EQ(c.piece_bytes, 1ull << 20);
  EXPECT_EQ(c.read_bytes, std::min<uint64_t>(def.read_bytes, 1ull << 20));
  const ReadPattern d = parse_read_pattern("--f", "8:none:16:16384");  // the earlier default
  EXPECT_FALSE(d.sequential || d.will_need);
  EXPECT_EQ(d.piece_bytes, 16ull << 20);
  EXPECT_EQ(d.read_bytes, 16ull << 20);
  EXPECT_EQ(
      describe(parse_read_pattern("--f", "8:sequential:256:1024:wait")),
      "8 threads, 256 MiB pieces in 1024 KiB reads, sequential hint, the reader waits for it");
  EXPECT_EQ(b.consumer_waits, def.consumer_waits);
  const ReadPattern w = parse_read_pattern("--f", "8:none:16:16384:wait");
  EXPECT_TRUE(w.consumer_waits);
  EXPECT_EQ(w.piece_bytes, 16ull << 20);
  EXPECT_EQ(w.read_bytes, 16ull << 20);
  const ReadPattern nw = parse_read_pattern("--f", "8:none:16:16384:nowait");
  EXPECT_FALSE(nw.consumer_waits);
  EXPECT_EQ(nw.piece_bytes, 16ull << 20);
  EXPECT_TRUE(parse_read_pattern("--f", "4:wait").consumer_waits);
  EXPECT_FALSE(parse_read_pattern("--f", "4:nowait").consumer_waits);
  EXPECT_EQ(describe(nw), "8 threads, 16 MiB pieces in 16384 KiB reads, the reader beside it");
  for (const char* bad : {"", "0", "65", "8:fast", "8:none:0", "8:none:4097", "8:none:1:2048",
                          "8:none:16:2", "x", "8:none:16:64:1", "8:none:16x", "wait",
                          "8:none:16:64:wait:wait", "8:none:wait:64", "8:nowait:wait"}) {
    SCOPED_TRACE(bad);
    try {
      parse_read_pattern("--test_gpu_read", bad);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--test_gpu_read takes THREADS["), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace strata
