// The ranks of a scaled-out run (docs/SCALEOUT.md): who this process is among the processes an
// MPI launcher started, and the host-side collectives the quantize run needs.
//
// world() is the single process (rank 0 of 1) unless strata was built with MPI (STRATA_MPI) and
// started by an MPI launcher (mpirun, srun, ... : a launcher that sets up MPI_COMM_WORLD), in which
// case it is MPI_COMM_WORLD. Every collective must be called by every rank in the same order.
// Errors are collective: abort() ends every rank within bounded time (MPI_Abort), never a hang.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace strata {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Ranks on this host (they share its cores and GPUs) and this rank's index among them: in CUDA
  // mode rank local_rank() uses GPU local_rank() mod the device count (engine/gpu_ranks.h).
  virtual int local_size() const { return 1; }
  virtual int local_rank() const { return 0; }
  // Element-wise, in place, over every rank.
  virtual void allreduce_max(float* data, size_t n) = 0;
  virtual void allreduce_sum(uint64_t* data, size_t n) = 0;
  virtual void allreduce_sum(double* data, size_t n) = 0;
  // `bytes` bytes at `data` of rank `root` to every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // Every rank's `mine`, in rank order (MPI_Allgatherv of bytes).
  virtual std::vector<std::string> allgather(const std::string& mine) = 0;
  // Rows of `row_bytes` bytes: send_counts[r] rows go to rank r, taken in rank order from `send`;
  // returns the rows received, in rank order, and their counts per source rank (exchanged first).
  virtual std::vector<uint8_t> alltoallv_rows(const std::vector<uint8_t>& send,
                                              const std::vector<int64_t>& send_counts,
                                              size_t row_bytes,
                                              std::vector<int64_t>* recv_counts) = 0;
  virtual void barrier() = 0;
  // Ends every rank with exit status `code`; this rank's message must already be printed.
  [[noreturn]] virtual void abort(int code) = 0;
  // Whether this is an MPI communicator ("" when single-process): "MPI (Open MPI v4.1.4)" etc.
  virtual std::string describe() const = 0;
};

// What the process environment says about an MPI launcher. cli/ reads the variables
// (cli/launcher.h); nothing below cli/ reads the environment.
struct Launcher {
  // Any variable a launcher sets in every process it starts: Open MPI's OMPI_COMM_WORLD_SIZE,
  // PMIx's PMIX_RANK, Hydra/PMI's PMI_RANK and PMI_SIZE, MVAPICH's MV2_COMM_WORLD_SIZE,
  // MPI_LOCALNRANKS.
  bool mpi = false;
  // The process count the first of OMPI_COMM_WORLD_SIZE, PMI_SIZE and MV2_COMM_WORLD_SIZE that
  // announces more than one; 1 when none does.
  int processes = 1;
};
// The ranks this process runs among: MPI_COMM_WORLD (MPI initialised) when strata was built with
// MPI and `launcher.mpi`, else the single process; a launcher that started several processes of a
// strata without MPI is refused. The first call decides; later calls return the same.
Comm& world(const Launcher& launcher);
// Whether strata was built with MPI support.
bool mpi_compiled();
// Shuts MPI down after a successful run (no-op when single-process); call once, at the end.
void comm_finalize();

// The single process: rank 0 of 1; collectives are copies.
class SingleComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduce_max(float*, size_t) override {}
  void allreduce_sum(uint64_t*, size_t) override {}
  void allreduce_sum(double*, size_t) override {}
  void broadcast(void*, size_t, int) override {}
  std::vector<std::string> allgather(const std::string& mine) override { return {mine}; }
  std::vector<uint8_t> alltoallv_rows(const std::vector<uint8_t>& send,
                                      const std::vector<int64_t>& send_counts, size_t,
                                      std::vector<int64_t>* recv_counts) override {
    if (recv_counts) *recv_counts = send_counts;
    return send;
  }
  void barrier() override {}
  [[noreturn]] void abort(int code) override;
  std::string describe() const override { return ""; }
};

}  // namespace strata
