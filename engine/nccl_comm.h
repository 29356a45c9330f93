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
#include "ops/backend.h"

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

// Expert parallelism on GPU ranks (docs/SCALEOUT.md "Expert parallel on GPU ranks"): the MoE
// layers' counts over the host communicator (control, a few bytes per expert), their rows over
// NCCL between the GPUs. Counts what this rank sent to the others and the time the exchanges
// took, per layer (take_layer) and in total.
class NcclExpertExchange final : public DeviceExpertExchange {
 public:
  // Collective over `host` (makes the NCCL communicator); `device` is this rank's GPU.
  NcclExpertExchange(Comm& host, int device);
  ~NcclExpertExchange() override;
  int rank() const override { return host_.rank(); }
  int ranks() const override { return host_.size(); }
  std::vector<int64_t> exchange_counts(const std::vector<int64_t>& send,
                                       const std::vector<int64_t>& send_counts,
                                       std::vector<int64_t>* recv_counts) override;
  void alltoallv_rows(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                      const std::vector<int64_t>& recv_counts, size_t row_bytes,
                      void* stream) override;

  // What one layer's exchanges moved and took: bytes of rows sent to and received from other
  // ranks (a rank's own rows stay on its GPU), the device time of the NCCL exchanges (from
  // before each to after it on the stream, waiting for the peers included) and the host time of
  // the counts' exchanges. take_layer() waits for the stream's exchanges and starts a new layer.
  struct Layer {
    uint64_t bytes_sent = 0, bytes_received = 0;
    int64_t exchanges = 0;
    double device_ms = 0.0, counts_ms = 0.0;
  };
  Layer take_layer();

 private:
  Comm& host_;
  NcclComm nccl_;
  Layer layer_;
  struct Events;
  std::unique_ptr<Events> events_;
};

}  // namespace strata
