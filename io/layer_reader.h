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

// Reads tensors' bytes into the page cache on background threads and drops them, ahead of a
// consumer that reads the same blobs in the same order: the GPU path starts it on the decoder
// layers before anything else, so that the disk, idle while the run starts up (export head,
// embedding, device setup), already delivers what the layer loop reads first, and then keeps
// reading while the loop computes, quantizes and writes. Blobs are read in the order given (in
// kReadChunkBytes preads) but never more than `window` bytes beyond what the consumer has
// declared done with advance(), so the page cache holds at most about `window` bytes of
// read-ahead. Each thread reads through a buffer of `read_bytes` (at most kReadChunkBytes), one
// pread at most that long at a time: the process holds threads x read_bytes, and the disk's queue
// that much ahead of anyone else's reads. The destructor stops after the reads in flight and
// joins. A failed read ends the warming silently: the consumer's own read reports it.
class PageWarmer {
 public:
  // sequential: each thread's files opened with POSIX_FADV_SEQUENTIAL (the kernel's read-ahead
  // for them twice the device's default); will_need: each piece (kReadChunkBytes) asked for with
  // POSIX_FADV_WILLNEED before it is read, so that its reads are queued at once rather than one
  // read-ahead window after another. For benchmarks of the read pattern (bench/read_bench).
  // The default: 8. On the H100 machine's disk (2026-12-05, sixth session) 8 threads against 4
  // in the GPU quantize run, capped, five pairs on two checkpoint shapes (bench/gpu_bench.sh
  // --alt "--test_gpu_read 8:none"): 0.04-1.15 s faster in each, 0.5 s on average of 14-20 s;
  // bench/read_bench had given 8 threads +10% alone. The process holds 128 MiB of buffers.
  static constexpr int kThreads = 8;
  PageWarmer(std::vector<LayerBlob> blobs, uint64_t window, int threads = kThreads,
             uint64_t read_bytes = LayerReader::kReadChunkBytes, bool sequential = false,
             bool will_need = false);
  ~PageWarmer();
  PageWarmer(const PageWarmer&) = delete;
  PageWarmer& operator=(const PageWarmer&) = delete;
  // The consumer has read the next `blobs` blobs (in the order given).
  void advance(size_t blobs = 1);
  uint64_t bytes_read() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
