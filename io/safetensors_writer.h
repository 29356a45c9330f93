// Writing safetensors, never half-written: every file goes to a temporary name in the same
// directory and is renamed into place only once complete and flushed.
//
// Layout written: tensors in the order given, data 8-byte aligned relative to the data section,
// header keys in that same order with "__metadata__" first, header padded with spaces to a
// multiple of 8. The same inputs give the same bytes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace strata {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Writes one safetensors file atomically (temp name, fsync, rename).
void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Where PlannedShardWriter closes shards and what it names them.
struct ShardOptions {
  uint64_t max_shard_bytes = 5ull << 30;  // a shard closes before it would exceed this
  std::string prefix = "model";  // shards are <prefix>-0000k-of-0000n.safetensors; a single
                                 // shard is <prefix>.safetensors
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
};

// The output tensors of a run, known before any of them is computed: enough to lay out every
// shard (names, header, offsets) up front.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
  uint64_t nbytes() const;
};

// The bytes before the data section of a safetensors file holding `tensors` (in that order),
// and where each tensor's data lies in the file: the layout write_safetensors writes.
struct SafetensorsLayout {
  std::string head;               // 8-byte length + the padded JSON header
  std::vector<uint64_t> offsets;  // file offset of each tensor's data, in the given order
  uint64_t file_size = 0;
};
SafetensorsLayout safetensors_layout(std::span<const TensorSpec> tensors,
                                     const std::map<std::string, std::string>& metadata,
                                     const std::string& path);

// Writes a sharded checkpoint whose every tensor is declared up front (`plan`, in write order),
// so that shard names, headers and offsets are fixed before any work and a killed run can
// continue where it stopped. A shard closes before a tensor that would take it past
// max_shard_bytes (a tensor larger than that gets a shard of its own); each shard holds the bytes
// write_safetensors writes for its tensors, and <prefix>.safetensors.index.json maps each tensor
// to its shard. When everything fits one shard it is <prefix>.safetensors and there is no index,
// as transformers' save_pretrained writes it.
//
// A shard is written in place under `.<final name>.partial` (created at full size with its
// header; each tensor pwritten at its offset) and renamed to its final name by publish() once
// every one of its tensors is written and synced. resume(n) takes the first n planned tensors as
// already written by an earlier run of the same plan (the caller vouches for that, e.g. through
// a manifest): it checks their shards are there, reopens a partly written one, and renames
// complete ones that a kill left under their partial name.
class PlannedShardWriter {
 public:
  PlannedShardWriter(std::string out_dir, std::vector<TensorSpec> plan, ShardOptions options = {});
  ~PlannedShardWriter();  // closes files; partial shards stay for a later resume
  PlannedShardWriter(const PlannedShardWriter&) = delete;
  PlannedShardWriter& operator=(const PlannedShardWriter&) = delete;

  size_t shard_count() const { return shards_.size(); }
  size_t written() const { return next_; }  // planned tensors written (or resumed) so far
  // The space the finished shards and index take on a filesystem of `block`-byte blocks: every
  // shard at its full size, the index estimated from above; each file rounded up to a block.
  uint64_t disk_bytes(uint64_t block) const;
  uint64_t bytes_written() const { return bytes_written_; }
  // Seconds spent in add()'s pwrite calls so far (the run's summary: the writer's share of I/O).
  double write_seconds() const { return write_seconds_; }
  // The files of out_dir that hold work up to written(): complete shards under their final
  // names, the partly written shard under its partial name.
  std::vector<std::string> vouched_files() const;

  void resume(size_t n);
  // Must be the next planned tensor, with the planned dtype and shape.
  void add(const std::string& name, const Tensor& tensor);
  // Several writers (ranks) share the shards: each add()s the tensors it owns and skip()s the
  // rest, in plan order. A shard is created by whichever writer touches it first (created at full
  // size without truncation, the same header written by each: the order does not matter). Only
  // the publisher renames shards, and only once every writer has synced (the caller's barrier).
  void set_shared(bool publisher) {
    shared_ = true;
    publisher_ = publisher;
  }
  // The next planned tensor is written by another writer.
  void skip(const std::string& name);
  // Makes every tensor added so far durable (fsync of the shards written to since last time).
  void sync();
  // Starts writing back to the disk what add() wrote since the last sync, without waiting for it
  // (Linux sync_file_range; a no-op elsewhere): durable only after the next sync(), which then
  // has less left to flush. Errors surface at that sync(). The kernel call blocks while the
  // disk's queue is full (seconds a run on a busy disk), so it runs on a flusher thread of this
  // writer: a request made while one is in flight is run once that one ends. sync() and the
  // destructor wait for the request in flight first (the destructor drops a pending one).
  void start_writeback();
  // Seconds the flusher thread spent in sync_file_range so far (the run's summary).
  double writeback_seconds() const;
  // Renames every shard whose tensors are all written and synced to its final name.
  void publish();
  // After every planned tensor is written: syncs, publishes and returns the shard file names.
  std::vector<std::string> finish();
  // <prefix>.safetensors.index.json's name and contents for this plan (known from the start: the
  // shards are planned); an empty name with a single shard, which has no index.
  std::pair<std::string, std::string> index_file() const;

 private:
  struct Shard {
    std::string final_name, partial_name;
    size_t begin = 0, end = 0;  // planned tensors [begin, end)
    SafetensorsLayout layout;
    int fd = -1;
    bool dirty = false, published = false;
  };
  void open_shard(Shard& s, bool create);
  std::string path_of(const std::string& name) const;
  struct Flusher;
  std::unique_ptr<Flusher> flusher_;  // started by the first start_writeback()
  std::string out_dir_;
  ShardOptions options_;
  std::vector<TensorSpec> plan_;
  std::vector<size_t> shard_of_;  // planned tensor -> shard
  std::vector<Shard> shards_;
  size_t next_ = 0, synced_ = 0;
  uint64_t bytes_written_ = 0;
  double write_seconds_ = 0;
  bool shared_ = false, publisher_ = true;
};

// Writes `contents` to `path` atomically (temp name in the same directory, fsync, rename).
// A full disk or any write error is a strata::Error naming the file; the temp file is removed.
void write_file_atomic(const std::string& path, std::string_view contents);

// Files written and synced under temporary names long before they are published, then renamed
// into place together with one sync of the directory: an export's index and config files,
// prepared while the layers are read, so that the run's finish only renames them. The temporary
// of `name` is `<dir>/.<name>.staged`, a fixed name: a resumed run overwrites what a killed one
// left. Errors as write_file_atomic's (naming the final path).
class StagedFiles {
 public:
  explicit StagedFiles(std::string dir) : dir_(std::move(dir)) {}
  // Writes and syncs `contents` under the temporary name of `name`.
  void stage(const std::string& name, std::string_view contents);
  // Renames every staged file into place in the order staged, then syncs the directory once.
  // Returns their names.
  std::vector<std::string> publish();

 private:
  std::string temp_of(const std::string& name) const;  // <dir>/.<name>.staged
  std::string dir_;
  std::vector<std::string> names_;
};

}  // namespace strata
