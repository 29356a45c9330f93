// The calibration hidden states between decoder layers: one [T_b, H] block per micro-batch b.
//
// Held in memory while the whole store fits its budget; otherwise spilled: the inputs of the
// current layer are read from one file and its outputs written to the next, one micro-batch at
// a time, so that memory holds a single micro-batch. Either way the file a step leaves behind is
// the resume file of that step (engine/resume.h):
//   <dir>/hidden-<step>.safetensors   "hidden.<b>" [T_b, H] per micro-batch, BF16 or F32
// Values are stored as bf16 when the forward rounds them to bf16 between layers
// (ForwardOptions::bf16_between_layers), which is exact and halves the bytes; else as fp32.
// Spilled and in-memory runs hold the same values, so their outputs are byte-identical.
// Each micro-batch's CRC-32C (core/crc32c.h) is computed as it is written (write, write_raw), so
// that the resume manifest can record the checksums of the file a step leaves (input_sums) and a
// resumed run can check that file before trusting it (check).
// With ranks (docs/SCALEOUT.md) each rank holds only the micro-batches it owns; the files are the
// same files, each rank writing its micro-batches at their offsets (the file created at full size
// by whichever rank comes first, never truncated), so that any rank count reads any of them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace strata {

class ActivationStore {
 public:
  // rows[b]: tokens of micro-batch b. dtype: kBF16 or kF32. spill_dir: where spilled files go.
  // owned: the micro-batches this rank holds (empty: all, a single process).
  ActivationStore(std::vector<int64_t> rows, int64_t hidden, DType dtype, bool spill,
                  std::string spill_dir, std::vector<bool> owned = {});
  ~ActivationStore();
  ActivationStore(const ActivationStore&) = delete;
  ActivationStore& operator=(const ActivationStore&) = delete;

  // Bytes the whole store takes, and one micro-batch at most, in `dtype`.
  static uint64_t bytes_for(const std::vector<int64_t>& rows, int64_t hidden, DType dtype);
  static uint64_t largest_batch_bytes(const std::vector<int64_t>& rows, int64_t hidden,
                                      DType dtype);

  size_t batches() const { return rows_.size(); }
  int64_t rows(size_t b) const { return rows_[b]; }
  bool spilled() const { return spill_; }
  bool owns(size_t b) const { return owned_.empty() || owned_[b]; }
  DType dtype() const { return dtype_; }

  // Starts a step whose outputs become the inputs of step `next` (spilled: creates
  // <spill_dir>/hidden-<next>.safetensors).
  void begin(int64_t next);
  // Micro-batch b of the current inputs, as fp32 [T_b, H].
  void read(size_t b, float* out) const;
  // Micro-batch b of the outputs. Spilled: to the file begin() created; in memory: replaces the
  // input (read it first). In bf16 the values must be bf16-exact.
  void write(size_t b, const float* in);
  // Micro-batch b as stored (dtype() values, [T_b, H]): the GPU path moves these bytes to and
  // from the device without widening them.
  void read_raw(size_t b, void* out) const;
  void write_raw(size_t b, const void* in);
  uint64_t batch_bytes(size_t b) const;
  // After every micro-batch is written: the outputs become the current inputs. durable: they are
  // also synced to the returned file (in memory: written to
  // <resume_dir>/hidden-<next>.safetensors), else "" is returned.
  std::string commit(const std::string& resume_dir, bool durable);
  // Spilled: the file the current inputs are read from.
  const std::string& input_path() const { return in_path_; }
  // Takes the inputs from a resume file written by commit(); throws strata::Error when it does
  // not match this store's shape and dtype.
  void load(const std::string& path);
  // The CRC-32C of each micro-batch of the current inputs as written (the bytes of its tensor in
  // the file commit() wrote; 0 for another rank's micro-batches).
  const std::vector<uint32_t>& input_sums() const { return in_sums_; }
  // Whether `path` holds this store's layout (size and header) with micro-batch checksums `sums`
  // (input_sums() of the run that wrote it): "" when it does, else what is wrong ("is missing",
  // "is 100 bytes, 200 expected", ...). Reads the whole file, a bounded buffer at a time.
  std::string check(const std::string& path, const std::vector<uint32_t>& sums) const;

 private:
  std::string layout_head(const std::string& path, std::vector<uint64_t>* offsets) const;
  std::vector<int64_t> rows_;
  int64_t hidden_ = 0;
  DType dtype_;
  bool spill_ = false;
  std::string spill_dir_;
  std::vector<std::vector<uint8_t>> mem_;  // in memory: one block per micro-batch
  int64_t next_ = 0;
  int in_fd_ = -1, out_fd_ = -1;  // spilled: current inputs, outputs being written
  std::string in_path_, out_path_;
  std::vector<uint64_t> offsets_;             // file offset of each micro-batch
  std::vector<bool> owned_;                   // empty: every micro-batch
  std::vector<uint32_t> out_sums_, in_sums_;  // CRC-32C per micro-batch: outputs, inputs
  int open_shared(const std::string& path, int access, const std::string& head,
                  const std::vector<uint64_t>& offsets) const;
};

}  // namespace strata
