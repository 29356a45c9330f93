#include "engine/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>

#include "core/error.h"

namespace strata {

bool nccl_compiled() {
  return true;
}

namespace {

void nccl_check(ncclResult_t r, int rank, const char* what) {
  STRATA_CHECK(r == ncclSuccess, "rank ", rank, ": ", what, " failed: ", ncclGetErrorString(r),
               " (set NCCL_DEBUG=WARN for NCCL's own account)");
}

void cuda_check(cudaError_t e, int rank, const char* what) {
  STRATA_CHECK(e == cudaSuccess, "rank ", rank, ": ", what, " failed: ", cudaGetErrorString(e));
}

cudaStream_t as_stream(void* s) {
  return static_cast<cudaStream_t>(s);
}

}  // namespace

struct NcclComm::Impl {
  ncclComm_t comm = nullptr;
};

NcclComm::NcclComm(Comm& host, int device) : impl_(std::make_unique<Impl>()) {
  rank_ = host.rank();
  size_ = host.size();
  cuda_check(cudaSetDevice(device), rank_, "cudaSetDevice");
  ncclUniqueId id{};
  if (rank_ == 0) nccl_check(ncclGetUniqueId(&id), rank_, "ncclGetUniqueId");
  host.broadcast(&id, sizeof id, 0);
  nccl_check(ncclCommInitRank(&impl_->comm, size_, id, rank_), rank_, "ncclCommInitRank");
}

NcclComm::~NcclComm() {
  if (impl_ && impl_->comm) ncclCommDestroy(impl_->comm);
}

void NcclComm::allreduce_max(float* d, size_t n, void* stream) {
  nccl_check(ncclAllReduce(d, d, n, ncclFloat32, ncclMax, impl_->comm, as_stream(stream)), rank_,
             "ncclAllReduce(max)");
}

void NcclComm::allreduce_sum(float* d, size_t n, void* stream) {
  nccl_check(ncclAllReduce(d, d, n, ncclFloat32, ncclSum, impl_->comm, as_stream(stream)), rank_,
             "ncclAllReduce(sum)");
}

void NcclComm::broadcast(void* d, size_t bytes, int root, void* stream) {
  nccl_check(ncclBroadcast(d, d, bytes, ncclUint8, root, impl_->comm, as_stream(stream)), rank_,
             "ncclBroadcast");
}

void NcclComm::alltoallv_rows(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                              const std::vector<int64_t>& recv_counts, size_t row_bytes,
                              void* stream) {
  STRATA_ASSERT(send_counts.size() == static_cast<size_t>(size_) &&
                    recv_counts.size() == static_cast<size_t>(size_),
                "alltoallv counts");
  const auto* s = static_cast<const uint8_t*>(send);
  auto* r = static_cast<uint8_t*>(recv);
  nccl_check(ncclGroupStart(), rank_, "ncclGroupStart");
  size_t so = 0, ro = 0;
  for (int p = 0; p < size_; ++p) {
    const size_t sb = static_cast<size_t>(send_counts[static_cast<size_t>(p)]) * row_bytes;
    const size_t rb = static_cast<size_t>(recv_counts[static_cast<size_t>(p)]) * row_bytes;
    if (sb > 0)
      nccl_check(ncclSend(s + so, sb, ncclUint8, p, impl_->comm, as_stream(stream)), rank_,
                 "ncclSend");
    if (rb > 0)
      nccl_check(ncclRecv(r + ro, rb, ncclUint8, p, impl_->comm, as_stream(stream)), rank_,
                 "ncclRecv");
    so += sb;
    ro += rb;
  }
  nccl_check(ncclGroupEnd(), rank_, "ncclGroupEnd");
}

// Timing events around each exchange on the stream, reused from layer to layer.
struct NcclExpertExchange::Events {
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> pairs;
  size_t used = 0;
  ~Events() {
    for (auto& [a, b] : pairs) {
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
  }
};

NcclExpertExchange::NcclExpertExchange(Comm& host, int device)
    : host_(host), nccl_(host, device), events_(std::make_unique<Events>()) {}

NcclExpertExchange::~NcclExpertExchange() = default;

std::vector<int64_t> NcclExpertExchange::exchange_counts(const std::vector<int64_t>& send,
                                                         const std::vector<int64_t>& send_counts,
                                                         std::vector<int64_t>* recv_counts) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<uint8_t> bytes(send.size() * sizeof(int64_t));
  std::memcpy(bytes.data(), send.data(), bytes.size());
  const std::vector<uint8_t> got =
      host_.alltoallv_rows(bytes, send_counts, sizeof(int64_t), recv_counts);
  std::vector<int64_t> out(got.size() / sizeof(int64_t));
  std::memcpy(out.data(), got.data(), got.size());
  layer_.counts_ms +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

void NcclExpertExchange::alltoallv_rows(const void* send, const std::vector<int64_t>& send_counts,
                                        void* recv, const std::vector<int64_t>& recv_counts,
                                        size_t row_bytes, void* stream) {
  const int me = host_.rank();
  for (int p = 0; p < host_.size(); ++p) {
    if (p == me) continue;
    layer_.bytes_sent += static_cast<uint64_t>(send_counts[static_cast<size_t>(p)]) * row_bytes;
    layer_.bytes_received += static_cast<uint64_t>(recv_counts[static_cast<size_t>(p)]) * row_bytes;
  }
  Events& ev = *events_;
  if (ev.used == ev.pairs.size()) {
    cudaEvent_t a = nullptr, b = nullptr;
    cuda_check(cudaEventCreate(&a), me, "cudaEventCreate");
    cuda_check(cudaEventCreate(&b), me, "cudaEventCreate");
    ev.pairs.emplace_back(a, b);
  }
  const auto [start, stop] = ev.pairs[ev.used++];
  cuda_check(cudaEventRecord(start, as_stream(stream)), me, "cudaEventRecord");
  nccl_.alltoallv_rows(send, send_counts, recv, recv_counts, row_bytes, stream);
  cuda_check(cudaEventRecord(stop, as_stream(stream)), me, "cudaEventRecord");
  ++layer_.exchanges;
}

NcclExpertExchange::Layer NcclExpertExchange::take_layer() {
  Events& ev = *events_;
  for (size_t i = 0; i < ev.used; ++i) {
    float ms = 0.0f;
    cuda_check(cudaEventSynchronize(ev.pairs[i].second), host_.rank(), "cudaEventSynchronize");
    cuda_check(cudaEventElapsedTime(&ms, ev.pairs[i].first, ev.pairs[i].second), host_.rank(),
               "cudaEventElapsedTime");
    layer_.device_ms += ms;
  }
  ev.used = 0;
  Layer out = layer_;
  layer_ = Layer{};
  return out;
}

void NcclComm::synchronize(void* stream) {
  cuda_check(cudaStreamSynchronize(as_stream(stream)), rank_, "cudaStreamSynchronize");
}

}  // namespace strata
