#include "engine/layer_loop.h"

#include <fcntl.h>
#include <malloc.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "core/error.h"
#include "engine/gpu_ranks.h"
#include "engine/parallel.h"
#include "engine/quantize_steps.h"

namespace strata {

void fsync_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  STRATA_CHECK(fd >= 0, path, ": cannot open to sync: ", std::strerror(errno));
  const bool ok = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) fail_write(err, path, 0, path, ": fsync failed: ");
}

HostPlacement::HostPlacement(Inputs in) : in_(std::move(in)) {
  int64_t most = 0;
  for (const Batch& b : in_.batches)
    most = std::max(most, b.n_tokens());
  buf_.resize(static_cast<size_t>(most * in_.forward.hidden_size()));
}

void HostPlacement::prefetch(int64_t l) {
  // Each tensor read by one rank; a routed expert only by its holder, which alone needs it.
  // Loading is a pure function of the checkpoint, so the results do not depend on the overlap.
  std::vector<std::string> shared;
  for (const std::string& n : in_.exporter.step_sources(l + 1)) {
    if (!in_.expert_pin || in_.expert_pin(n) < 0) shared.push_back(n);
  }
  share_tensors(in_.comm, in_.ckpt, shared, in_.owner);
  const ModelForward* f = &in_.forward;
  next_ = std::async(std::launch::async, [f, l]() { return f->layer(l); });
}

void HostPlacement::take(int64_t) {
  layer_ = next_.get();
}

void HostPlacement::forward(int64_t l, bool last, MaxCalibrator& calib) {
  ActivationStore& store = in_.store;
  if (!last) store.begin(l + 2);
  // With expert parallelism the ranks run their micro-batches in lockstep rounds: round k is
  // micro-batch k·N + rank, or an empty batch.
  const size_t rounds = lockstep_rounds(in_.batches.size(), in_.expert_parallel, in_.comm.size());
  const Batch none = Batch::from_sequences({});
  for (size_t k = 0; k < rounds; ++k) {
    const size_t b = round_micro_batch(k, in_.expert_parallel, in_.comm.size(), in_.comm.rank());
    if (b >= in_.batches.size() || !store.owns(b)) {
      if (in_.expert_parallel) layer_->forward(none, buf_.data(), &calib);
      continue;
    }
    store.read(b, buf_.data());
    layer_->forward(in_.batches[b], buf_.data(), &calib);
    if (!last) store.write(b, buf_.data());
  }
  layer_.reset();
  // What the layer's threads freed goes back to the system: glibc keeps freed blocks below the
  // mmap threshold (quantize.cpp's kCpuMmapThreshold, 4 MiB) in each thread's arena, so a model
  // of many small tensors grew the resident set layer by layer past its bound (a 61-layer,
  // 256-expert DeepSeek-V3 shape of hidden 320: peak 654-723 MiB against a bound of 360 MiB; 349
  // MiB with this; about 10 ms a layer on that shape).
  malloc_trim(0);
}

uint64_t HostPlacement::hidden_bytes() const {
  uint64_t n = 0;
  for (size_t b = 0; b < in_.store.batches(); ++b)
    n += in_.store.batch_bytes(b);
  return n;
}

StepFiles HostPlacement::end_step(int64_t, bool durable) {
  StepFiles f;
  f.hidden = in_.store.commit(in_.resume_dir, durable);
  return f;
}

namespace {

// What the writer thread did with a layer, and its seconds: in all, in pwrite, in fsync.
struct WriterDone {
  LayerReport report;
  double busy = 0, write = 0, sync = 0;
};

// A layer handed to the writer, recorded once its shards are synced.
struct Pending {
  int64_t layer = -1;
  std::unique_ptr<MaxCalibrator> calib;
  std::unique_ptr<PrecomputedWeights> weights;  // quantized by the placement
  std::future<WriterDone> report;
  bool durable = false;
  StepFiles files;
  std::string old_input;
};

}  // namespace

void run_layer_loop(LayerLoop& loop, Placement& p) {
  const int64_t L = loop.plan.num_layers;
  RunTimes& times = loop.times;
  Comm* ranks = loop.comm.size() > 1 ? &loop.comm : nullptr;
  PhaseTimer phase;  // laps into `times` (the loop's parts)
  Pending pending;
  // Layer l-1's tensors are written and synced: record the step (or, not durable, let its
  // sources go).
  auto finish_pending = [&]() {
    if (pending.layer < 0) return;
    phase.lap(nullptr);
    WriterDone done = pending.report.get();
    const LayerReport& r = done.report;
    times.writer_busy += done.busy;
    times.writer_write += done.write;
    times.writer_sync += done.sync;
    if (pending.files.synced.valid()) pending.files.synced.get();
    phase.lap(&times.writer_wait);
    loop.layer_done(r);
    // Test hook (--test_slow_layer_ms): a kill lands mid-run on tiny fixtures.
    if (loop.test.slow_layer_ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(loop.test.slow_layer_ms));
    if (pending.durable) {
      loop.commit(pending.layer + 2, pending.files.hidden, pending.old_input);  // own part
    } else {
      loop.exporter.release_source(pending.layer + 1);
    }
    phase.lap(nullptr);
    pending = Pending{};
  };
  const ResumeCadence cadence{p.hidden_bytes(), loop.resume_every_s};
  uint64_t since_durable = 0;
  PhaseTimer durable_clock;  // seconds since the last durable step
  double since_durable_s = 0;
  p.prefetch(loop.first_layer);
  for (int64_t l = loop.first_layer; l < L; ++l) {
    const bool last = l + 1 == L;
    phase.lap(nullptr);
    p.take(l);
    phase.lap(&times.read_wait);
    std::future<PrecomputedWeights> quantized = p.quantize(l);
    if (!last) p.prefetch(l + 1);
    // Test hook (--test_fail_rank/--test_fail_layer): after the prefetch, whose tensor sharing
    // among CPU ranks is collective, so that rank 0 has recorded the previous step before another
    // rank fails.
    test_fail_hook(loop.comm, l, loop.test);
    since_durable += loop.exporter.source_bytes(l + 1);
    since_durable_s += durable_clock.lap(nullptr);
    bool durable = last || p.always_durable() || cadence.due(since_durable, since_durable_s);
    if (ranks) durable = any_rank(*ranks, durable);  // the ranks record the same steps
    auto calib = std::make_unique<MaxCalibrator>(
        loop.plan.recipe.calibration == CalibrationMethod::kNvfp4ActHeadroom,
        kv_cache_affine(loop.plan.recipe.kv_cache));
    calib->track_hessians(local_hessian_modules(loop.plan, l));  // empty unless local_hessian
    p.forward(l, last, *calib);
    if (ranks) allreduce_calibration(*ranks, *calib);  // one process's statistics on every rank
    phase.lap(&times.compute);
    finish_pending();
    // The file the inputs were read from (a spilled store's) goes once this step is recorded.
    if (durable && loop.store && loop.store->spilled())
      pending.old_input = loop.store->input_path();
    if (!last) {
      pending.files = p.end_step(l + 2, durable);
      if (durable) ++times.hidden_write_count;
    }
    if (durable) {
      since_durable = 0;
      since_durable_s = 0;
    }
    phase.lap(&times.hidden_writes);
    pending.layer = l;
    pending.calib = std::move(calib);
    pending.durable = durable;
    if (quantized.valid()) pending.weights = std::make_unique<PrecomputedWeights>(quantized.get());
    phase.lap(&times.quantize);
    if (loop.wait_head) {  // the shards take the head's tensors before layer l's
      loop.wait_head();
      loop.wait_head = nullptr;
      times.head_wait += phase.lap(&times.writer_wait);
    }
    const MaxCalibrator* cp = pending.calib.get();
    const PrecomputedWeights* pw = pending.weights.get();
    // The writer thread quantizes what is left and writes; at a durable step it syncs its shards,
    // so that the step's commit finds them durable; at another it only starts their writeback and
    // goes on (the commit of the next durable step syncs whatever is left): a fsync every layer
    // held the writer, and with it the loop, while the disk flushed each layer.
    ModeloptExporter* exporter = &loop.exporter;
    const bool writeback = loop.test.writeback_per_layer;
    pending.report = std::async(std::launch::async, [exporter, l, cp, pw, durable, writeback]() {
      PhaseTimer busy;
      WriterDone d;
      const double written = exporter->write_seconds();
      d.report = exporter->write_layer(l, *cp, pw);
      d.write = exporter->write_seconds() - written;
      PhaseTimer sync;
      if (durable) {
        exporter->sync();
      } else if (writeback) {
        exporter->start_writeback();
      }
      d.sync = sync.lap(nullptr);
      d.busy = busy.lap(nullptr);
      return d;
    });
    if (!p.overlap_writer()) finish_pending();
  }
  finish_pending();
  p.finish();
}

}  // namespace strata
