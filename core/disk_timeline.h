// The disk's traffic over a run, for profiles (`strata quantize --gpu_profile`): a thread samples
// the process's storage counters (/proc/self/io read_bytes and write_bytes: bytes this process
// caused to be read from or dirtied for the storage layer, page-cache hits not counted) every
// `step` seconds, and marks name the moments the run moved from one phase to the next. The summary
// then shows where the disk sat idle, which the phases' wall times alone cannot (the reader and the
// writer overlap them).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace strata {

// The process's storage counters now; false where /proc/self/io cannot be read.
bool process_io_bytes(uint64_t* read, uint64_t* written);

class DiskTimeline {
 public:
  explicit DiskTimeline(double step_seconds = 0.5);
  ~DiskTimeline();  // stops sampling
  DiskTimeline(const DiskTimeline&) = delete;
  DiskTimeline& operator=(const DiskTimeline&) = delete;

  // The phase named `name` begins now (the previous one ends).
  void mark(const std::string& name);
  // Stops sampling (at the last sample taken) and describes the run: one line per phase with its
  // span, bytes read and written and their rate, then the read and the written rates of each step,
  // in GB/s. Empty where the counters cannot be read.
  std::string finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
