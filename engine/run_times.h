// Where a quantize run's wall time went, phase by phase (`strata quantize` prints it in its
// summary; bench/gpu_bench.sh records it). Seconds of wall time on the main thread, so the
// top-level phases add up to the run's time; the layer loop's parts are what the main thread
// waited on or did inside the loop, and work that overlapped it (the reader's preads, the writer
// thread's quantization and writes) shows only as the time the loop waited for it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace strata {

struct RunTimes {
  double startup = 0;        // config, checkpoint headers, plan, output folder, exporter layout
  double calib_data = 0;     // reading (and tokenizing) the calibration set
  double head = 0;           // step 0: the embedding table written to the export, synced (a
                             // single process: the part the embedding below did not hide)
  double embedding = 0;      // the first hidden states (token embeddings into the store)
  double device_setup = 0;   // GPU: context, buffers, pinned memory, hidden states onto the device
  double layers = 0;         // the decoder-layer loop, of which:
  double read_wait = 0;      //   waiting for a layer's weights (read, copied to the device)
  double compute = 0;        //   the calibration forward (device or CPU)
  double quantize = 0;       //   weights quantized on the device and copied back (GPU)
  double writer_wait = 0;    //   waiting for the exporter (CPU path: the whole write_layer)
  double hidden_writes = 0;  //   resume: hidden states written and synced (count below)
  int64_t hidden_write_count = 0;
  double commit = 0;        //   resume commits: fsync of the shards written, the manifest
  double writer_busy = 0;   // the exporter's own time on its thread (overlaps the loop), of which
  double writer_write = 0;  //   writing the layers' tensors (pwrite into the shards)
  double writer_sync = 0;   //   fsync of the shards (durable steps; else asking for writeback)
  double writeback = 0;     // the writer's flusher thread in sync_file_range (overlaps the writer)
  // A single process's export head on its own thread (overlaps the start and the loop): its
  // tensors written, then synced and recorded (commit), and when it ended, in seconds from the
  // run's start (0: no head thread); head_wait: the part of writer_wait the loop spent waiting
  // for the head's step before its first write.
  double head_write = 0, head_commit = 0, head_done_at = 0, head_wait = 0;
  double finish = 0;  // index, config files, sidecar files, resume folder removed
  double total = 0;

  // "startup 0.31 s, calibration data 0.12 s, ..." lines for the summary.
  std::string describe() const;
};

// Adds the seconds since construction (or the last lap) to `*into`.
class PhaseTimer {
 public:
  PhaseTimer() : t_(std::chrono::steady_clock::now()) {}
  double lap(double* into) {
    const auto now = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(now - t_).count();
    t_ = now;
    if (into) *into += s;
    return s;
  }

 private:
  std::chrono::steady_clock::time_point t_;
};

}  // namespace strata
