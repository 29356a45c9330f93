// The decoder-layer loop of `strata quantize`, one for the CPU and the GPU (docs/DESIGN.md "The
// layer loop"). For each layer l:
//
//   wait for layer l's weights; start reading layer l+1's   (Placement::take, prefetch)
//   run every micro-batch through layer l, the calibrator watching   (Placement::forward)
//   combine the statistics over the ranks
//   when the step is due to be durable: its outputs written to a resume file   (end_step)
//   (the first time: wait for the head step, whose writer may still run)
//   hand layer l to the writer (ModeloptExporter::write_layer on a helper thread, with the weights
//   the placement quantized itself); once its shards are synced, record the step (commit)
//
// The loop's only choices are the Placement's: where the weights and the hidden states live and
// how a layer is chunked (HostPlacement: the CPU, fp32 weights and the ActivationStore in memory
// or spilled; engine/gpu_runner.h: the device, with engine/memory_plan.h's tiers). Resume,
// durability, prefetch and the writer are written here once.
//
// Durability: a step is recorded (the manifest names the file holding its outputs) when it is
// the last, when the placement writes every step's hidden states anyway (a spilled store; the
// CPU, whose forward costs far more than writing them), or when both the checkpoint bytes read
// since the last record reach kResumeEvery times the hidden states' size and --resume_every
// seconds have passed since it (ResumeCadence). A step not recorded is computed again after a
// kill; its shards are rewritten byte for byte.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "calib/max_calib.h"
#include "engine/activation_store.h"
#include "engine/comm.h"
#include "engine/options.h"
#include "engine/run_times.h"
#include "export/modelopt.h"
#include "model/forward.h"

namespace strata {

// A step's hidden states are made durable once the checkpoint bytes read since the last durable
// step reach kResumeEvery times their size: writing them costs at most 1/kResumeEvery of the
// reading, and a kill costs at most kResumeEvery times their size of reading again.
inline constexpr uint64_t kResumeEvery = 16;
// The durability rule for a placement that does not write every step's hidden states anyway: both
// that many bytes read and --resume_every seconds (GpuOptions::resume_every_s) since the last
// durable step. A run shorter than that writes no hidden states before its end (each write costs
// the disk as many bytes as a sixteenth of the layers read, 0.5-1 GB on a 20 GB checkpoint), and
// a kill redoes about that long, or kResumeEvery times the hidden states' size of reading,
// whichever is longer.
struct ResumeCadence {
  uint64_t hidden_bytes = 0;  // one step's hidden states
  double min_seconds = 0;
  // Whether the step that ends now is made durable, `read` checkpoint bytes and `seconds` after
  // the last durable step (or the loop's start).
  bool due(uint64_t read, double seconds) const {
    return read >= kResumeEvery * hidden_bytes && seconds >= min_seconds;
  }
};

// The file a durable step left its outputs in ("" when none), and its sync when it runs on a
// helper thread (waited for before the step is recorded).
struct StepFiles {
  std::string hidden;
  std::future<void> synced;
};

// Where a layer's weights and the hidden states live, and how a layer runs over them.
class Placement {
 public:
  virtual ~Placement() = default;
  // Starts reading layer l's weights in the background.
  virtual void prefetch(int64_t l) = 0;
  // Waits for layer l's weights and makes it the current layer.
  virtual void take(int64_t l) = 0;
  // The current layer's weights quantized by the placement (the device), started now; an invalid
  // future leaves them to the exporter.
  virtual std::future<PrecomputedWeights> quantize(int64_t) { return {}; }
  // Runs the current layer over every micro-batch; `last`: its outputs are not needed.
  virtual void forward(int64_t l, bool last, MaxCalibrator& calib) = 0;
  // The hidden states' bytes (the durability rule's unit), and whether every step writes them to
  // a file anyway.
  virtual uint64_t hidden_bytes() const = 0;
  virtual bool always_durable() const = 0;
  // The step's outputs become the inputs of step `next`; durable: also written to a file.
  virtual StepFiles end_step(int64_t next, bool durable) = 0;
  // The writer may run beside the next layer's forward (memory for one more layer in flight).
  virtual bool overlap_writer() const = 0;
  // After the last layer: waits for what is still in flight.
  virtual void finish() {}
  // Host memory the placement pinned (the memory bound, engine/quantize.h MemoryEstimate): its
  // layer blobs and staging buffer, and the hidden states it keeps in pinned memory.
  virtual uint64_t pinned_bytes() const { return 0; }
  virtual uint64_t pinned_hidden_bytes() const { return 0; }
};

// The CPU: a layer's weights as fp32 (ModelForward::layer, read on a helper thread, each tensor by
// one rank), every micro-batch through it in turn; with expert parallelism the ranks run their
// micro-batches in lockstep rounds (the MoE exchanges are collective).
class HostPlacement : public Placement {
 public:
  struct Inputs {
    const ModelForward& forward;
    const ModeloptExporter& exporter;
    const Checkpoint& ckpt;
    Comm& comm;
    ActivationStore& store;
    const std::vector<Batch>& batches;
    std::string resume_dir;
    bool expert_parallel = false;
    std::function<int(const std::string&)> owner;       // the rank reading a tensor
    std::function<int(const std::string&)> expert_pin;  // a routed expert's holder, or -1
  };
  explicit HostPlacement(Inputs in);
  void prefetch(int64_t l) override;
  void take(int64_t l) override;
  void forward(int64_t l, bool last, MaxCalibrator& calib) override;
  uint64_t hidden_bytes() const override;
  bool always_durable() const override { return true; }
  StepFiles end_step(int64_t next, bool durable) override;
  bool overlap_writer() const override { return false; }

 private:
  Inputs in_;
  std::future<std::unique_ptr<DecoderLayer>> next_;
  std::unique_ptr<DecoderLayer> layer_;
  std::vector<float> buf_;  // one micro-batch, fp32 [T_b, H]
};

// No forward (weight-only formats): every step writes its tensors and is recorded.
class NoForward : public Placement {
 public:
  void prefetch(int64_t) override {}
  void take(int64_t) override {}
  void forward(int64_t, bool, MaxCalibrator&) override {}
  uint64_t hidden_bytes() const override { return 0; }
  bool always_durable() const override { return true; }
  StepFiles end_step(int64_t, bool) override { return {}; }
  bool overlap_writer() const override { return false; }
};

struct LayerLoop {
  const QuantPlan& plan;
  ModeloptExporter& exporter;
  Comm& comm;
  ActivationStore* store = nullptr;  // the hidden states (null without a forward)
  int64_t first_layer = 0;
  TestHooks test;
  RunTimes& times;  // the loop's parts are added here
  // Records step `next` as done: hidden = the file holding its outputs, old_input = the file the
  // step's inputs came from, removed once the record is written.
  std::function<void(int64_t next, const std::string& hidden, const std::string& old_input)> commit;
  std::function<void(const LayerReport&)> layer_done;
  // Waits for the head step (written beside the first layers' reads and forward), called once,
  // before the first layer is handed to the writer: the shards are written in plan order. Its
  // time is counted as waiting for the writer. Optional.
  std::function<void()> wait_head;
  // --resume_every: the least seconds between durable steps (ResumeCadence).
  double resume_every_s = 0;
};

// Runs layers [first_layer, plan.num_layers).
void run_layer_loop(LayerLoop& loop, Placement& placement);

// Makes a written file durable (its dirty pages, through a fresh descriptor).
void fsync_file(const std::string& path);

}  // namespace strata
