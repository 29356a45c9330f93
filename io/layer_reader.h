// Reads one decoder layer's tensors from the checkpoint into one host buffer with few, large,
// sequential reads: the GPU path's loader (docs/CUDA.md "The engine on the GPU").
//
//   LayerReader reader(ckpt);
//   LayerBlob blob = reader.plan({"model.layers.3.self_attn.q_proj.weight", ...});
//   PinnedBuffer host(blob.bytes);
//   reader.read(blob, host.data());     // preads; then one copy of blob.bytes to the device
//
// plan() groups the tensors by shard, sorts them by file offset and merges neighbours whose gap
// is at most kMergeGapBytes into one range (the gap's bytes are read too and ignored). Each range
// starts at a 4096-aligned buffer offset, at its first tensor's file offset (so that tensor is
// 4096-aligned in the buffer and the others keep their relative alignment), or with O_DIRECT at
// that offset rounded down to 4096. Buffer layout: the ranges back to back in plan order (each
// padded to 4096 bytes);
// tensor `name` lies at blob.items[name].offset, its bytes exactly as the checkpoint stores them.
//
// Reads go through the page cache by default: the CPU exporter reads the same tensors right
// after through its mapping, and finds them there. read() splits the ranges into
// kReadChunkBytes preads spread over `threads` threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "io/checkpoint.h"

namespace strata {

struct LayerBlob {
  struct Item {
    DType dtype;
    Shape shape;
    uint64_t offset = 0;  // in the buffer
    uint64_t bytes = 0;
  };
  struct Range {
    std::string path;        // shard file
    uint64_t file_offset;    // the first tensor's (4096-aligned with O_DIRECT)
    uint64_t length;         // bytes to read (ends at the last tensor's end, or EOF)
    uint64_t buffer_offset;  // 4096-aligned
  };
  std::map<std::string, Item> items;
  std::vector<Range> ranges;
  uint64_t bytes = 0;  // the buffer size the blob needs
};

// One contiguous read: `length` bytes of file `path` at `file_offset`, into dst + buffer_offset.
struct FileRead {
  std::string path;
  uint64_t file_offset = 0, buffer_offset = 0, length = 0;
};

// Performs every read in LayerReader::kReadChunkBytes preads spread over `threads` threads.
// direct: files opened with O_DIRECT where the file system allows it (else buffered).
// whole_pages: each pread asks up to its 4096-aligned end (what O_DIRECT needs; dst must have room
// there) and a short read at the end of the file is accepted past `length`; otherwise exactly the
// `length` bytes of each read are written. A failed or short read is a strata::Error naming the
// file.
void read_files(const std::vector<FileRead>& reads, uint8_t* dst, int threads, bool direct,
                bool whole_pages);

class LayerReader {
 public:
  static constexpr uint64_t kMergeGapBytes = 1ull << 20;
  static constexpr uint64_t kReadChunkBytes = 16ull << 20;

  explicit LayerReader(const Checkpoint& ckpt, int threads = 4, bool direct = false);
  // Every name must be in the checkpoint.
  LayerBlob plan(const std::vector<std::string>& names) const;
  // Fills dst[0, blob.bytes) (dst 4096-aligned). Throws strata::Error naming the shard on a
  // failed or short read.
  void read(const LayerBlob& blob, uint8_t* dst) const;

 private:
  const Checkpoint& ckpt_;
  int threads_;
  bool direct_;
};

// How a PageWarmer reads: `threads` threads each take the next piece of at most `piece_bytes` of
// a blob's range and read it front to back in preads of at most `read_bytes` through a buffer of
// that size (the process holds threads x read_bytes). Small pieces keep every thread's reads close
// together (the disk sees `threads` adjacent reads); large pieces read in small preads make each
// thread one sequential stream that the kernel's read-ahead runs ahead of, like the `cat`s of
// bench/gpu_bench.sh's floor. sequential: each thread's files opened with
// POSIX_FADV_SEQUENTIAL (the kernel's read-ahead for them twice the device's default);
// will_need: each piece asked for with POSIX_FADV_WILLNEED before it is read, so that its reads
// are queued at once rather than one read-ahead window after another. The other settings are
// for benchmarks (bench/read_bench, `strata quantize --test_gpu_read`).
struct ReadPattern {
  // The default: 8 sequential streams. On the H100 machine's disk (2026-12-05, seventh session;
  // read_ahead_kb 8192, max_sectors_kb 4096) bench/read_bench read the 22.4 GB Qwen3-MoE
  // checkpoint in the loop's order while 7.5 GB were written, two rounds of eight settings in
  // turn: this pattern 1.68 and 1.71 GB/s, the best of both rounds; the earlier default (8
  // threads of 16 MiB pieces read whole, no hint) 1.11 and 1.22; the floor's `cat`s of whole
  // shards 1.54 and 1.37 (docs/PERFORMANCE.md). The process holds 8 MiB of buffers.
  int threads = 8;
  uint64_t piece_bytes = 256ull << 20;
  uint64_t read_bytes = 1ull << 20;
  bool sequential = true;
  bool will_need = false;
  // The consumer reads a blob only once the warmer has (PageWarmer::wait_read), so that its
  // reads are copies from the page cache rather than reads of the disk beside the warmer's
  // streams in another pattern. On the development machine's disk (read_ahead_kb 128; 6.2 GB
  // Qwen3-MoE checkpoint, 2 GB written meanwhile; five read_bench calls of 2 to 4 rounds) 8
  // streams with the reader waiting beat the earlier 16 MiB pieces read whole by 4-45% in each
  // call (e.g. 2.05 against 1.58 GB/s), and the streams with the reader beside them in each
  // (docs/PERFORMANCE.md, seventh session).
  bool consumer_waits = true;
};

// Parses "THREADS[:none|sequential|willneed[:PIECE_MiB[:READ_KiB]]][:wait|nowait]" (what is left
// out: the default pattern's; wait, nowait: consumer_waits): threads 1 to 64, pieces 1 MiB to
// 4 GiB, reads 4 KiB to the piece.
// Throws strata::Error naming `flag` and the accepted form.
ReadPattern parse_read_pattern(const std::string& flag, const std::string& value);
// "8 threads, 16 MiB pieces in 16384 KiB reads", the hint, and whether the reader waits.
std::string describe(const ReadPattern& p);

// Reads tensors' bytes into the page cache on background threads and drops them, ahead of a
// consumer that reads the same blobs in the same order: the GPU path starts it on the decoder
// layers before anything else, so that the disk, idle while the run starts up (export head,
// embedding, device setup), already delivers what the layer loop reads first, and then keeps
// reading while the loop computes, quantizes and writes. Blobs are read in the order given, in
// pieces of the pattern (above), but no piece is started more than `window` bytes beyond what
// the consumer has declared done with advance(), so the page cache holds at most about `window`
// bytes of read-ahead (plus the pieces in flight). The destructor stops after the reads in flight
// and joins. A failed read ends the warming silently: the consumer's own read reports it.
class PageWarmer {
 public:
  PageWarmer(std::vector<LayerBlob> blobs, uint64_t window, const ReadPattern& pattern = {});
  ~PageWarmer();
  PageWarmer(const PageWarmer&) = delete;
  PageWarmer& operator=(const PageWarmer&) = delete;
  // The consumer has read the next `blobs` blobs (in the order given).
  void advance(size_t blobs = 1);
  // Returns once blobs 0..`blob` are read whole (the window stretched to the end of `blob` if
  // it lies beyond), or at once when a read failed, the warmer is stopping, or there is no such
  // blob: a consumer that then reads the blob copies it from the page cache instead of reading
  // the disk beside the warmer in another pattern (ReadPattern::consumer_waits).
  void wait_read(size_t blob);
  uint64_t bytes_read() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
