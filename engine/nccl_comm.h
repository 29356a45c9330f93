// Device-side collectives among the ranks' GPUs, through NCCL (docs/SCALEOUT.md "GPU ranks and
// NCCL"). Built when CUDA and NCCL are found (STRATA_NCCL); host-only header: device buffers and
// streams are plain pointers (a cudaStream_t passed as void*, nullptr for the default stream).
//
// The NCCL communicator is bootstrapped over the host communicator: rank 0 makes the unique id
// and broadcasts it (MPI_Bcast under MPI). NCCL's own environment (NCCL_* variables: network,
// topology, debug) is left to the host: strata sets none of it. Every call is collective: every
// rank calls it in the same order. A NCCL error is a strata::Error naming the rank and call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/comm.h"

namespace strata {

// Whether strata was built with NCCL.
bool nccl_compiled();

class NcclComm {
 public:
  // Collective over `host`; `device` is the CUDA device this rank uses (one rank per GPU).
  NcclComm(Comm& host, int device);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // In place on device memory.
  void allreduce_max(float* device_data, size_t n, void* stream);
  void allreduce_sum(float* device_data, size_t n, void* stream);
  void broadcast(void* device_data, size_t bytes, int root, void* stream);
  // Rows of `row_bytes` bytes: send_counts[r] rows from `send` (in rank order) go to rank r;
  // recv_counts[r] rows from rank r land in `recv` in rank order (counts exchanged beforehand
  // over the host communicator, Comm::alltoallv_rows). Grouped point-to-point sends.
  void alltoallv_rows(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                      const std::vector<int64_t>& recv_counts, size_t row_bytes, void* stream);
  // Waits for the work queued on `stream`.
  void synchronize(void* stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, size_ = 1;
};

}  // namespace strata
