// Data parallelism of the quantize run over the ranks of a Comm (docs/SCALEOUT.md).
//
// Micro-batches keep their composition (consecutive sequences by index, --batch_size at a time,
// whatever the rank count); micro-batch b runs on rank b mod N. After every rank has run a layer
// on its micro-batches, the per-module statistics are combined (amax: max, NaN sticky; rows: sum)
// so that every rank holds what one process would have observed, before anything is quantized.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "calib/max_calib.h"
#include "engine/comm.h"
#include "engine/options.h"
#include "engine/resume.h"
#include "io/checkpoint.h"
#include "model/forward.h"

namespace strata {

// Micro-batch b belongs to rank b mod size.
std::vector<bool> owned_batches(const Comm& comm, size_t batches);

// Every rank's statistics into every rank's `calib`: the union of the observed names, amax the
// max over ranks (NaN when any rank saw NaN), rows the sum. Exact: the result equals one
// process observing every micro-batch.
void allreduce_calibration(Comm& comm, MaxCalibrator& calib);

// Byte encoding of the statistics: per name (sorted) u32 length, name bytes, f32 amax, i64 rows.
std::string encode_calibration(const MaxCalibrator& calib);
void merge_calibration(const std::string& bytes, MaxCalibrator& calib);

// The resume point for ranks other than 0, from the manifest rank 0 prepared (it must be on a
// filesystem every rank sees); refuses a manifest of another job.
ResumeState agree_resume_state(const Comm& comm, const std::string& manifest,
                               const std::map<std::string, std::string>& identity);
// Refuses ranks that disagree on the step to resume at.
void check_same_step(Comm& comm, int64_t next_step);

// Every rank gets `names` held in memory (Checkpoint::hold): each tensor is read from the file by
// the rank owner(name) names alone and broadcast, so that the checkpoint is read once in total.
void share_tensors(Comm& comm, const Checkpoint& ckpt, const std::vector<std::string>& names,
                   const std::function<int(const std::string&)>& owner);

// What a rank's expert-parallel exchanges moved, for the run's summary: bytes of expert rows
// sent to other ranks (dispatch and results) and the seconds spent in the exchanges (waiting for
// the slowest rank included). CPU ranks count in CommExpertExchange, GPU ranks in the device
// placement (engine/gpu_runner.h).
struct ExpertTraffic {
  uint64_t bytes_sent = 0;
  double seconds = 0.0;
};

// Expert parallelism (--expert_parallel) over the ranks of a Comm: the forward's exchanges of
// expert rows are Comm::alltoallv_rows, counted for the run's summary.
class CommExpertExchange final : public ExpertExchange {
 public:
  explicit CommExpertExchange(Comm& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int ranks() const override { return comm_.size(); }
  std::vector<uint8_t> alltoallv_rows(const std::vector<uint8_t>& send,
                                      const std::vector<int64_t>& send_counts, size_t row_bytes,
                                      std::vector<int64_t>* recv_counts) override;

  ExpertTraffic traffic;

 private:
  Comm& comm_;
};

// Test hook (tests/engine/mpi_test.sh): --test_fail_rank r --test_fail_layer l (TestHooks) make
// rank r throw a strata::Error when it starts decoder layer l.
void test_fail_hook(const Comm& comm, int64_t layer, const TestHooks& hooks);

}  // namespace strata
