// NCCL among ranks (engine/nccl_comm.h) on one GPU as a single rank: the unique id bootstrapped
// over the host communicator, collectives over device memory. Hand-worked values: with one rank
// an all-reduce leaves the data unchanged and the all-to-all copies rows to themselves.
#include "engine/nccl_comm.h"

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <vector>

namespace strata {
namespace {

TEST(Nccl, OneRankCollectives) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no GPU";
  SingleComm host;
  NcclComm nccl(host, 0);
  EXPECT_EQ(nccl.size(), 1);
  const std::vector<float> x = {1.5f, -2.0f, 3.25f, 0.0f};
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, x.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d, x.data(), x.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  nccl.allreduce_max(d, x.size(), nullptr);
  nccl.allreduce_sum(d, x.size(), nullptr);
  nccl.broadcast(d, x.size() * 4, 0, nullptr);
  float* e = nullptr;
  ASSERT_EQ(cudaMalloc(&e, x.size() * 4), cudaSuccess);
  nccl.alltoallv_rows(d, {2}, e, {2}, 8, nullptr);  // two rows of two floats
  nccl.synchronize(nullptr);
  std::vector<float> y(x.size());
  ASSERT_EQ(cudaMemcpy(y.data(), e, y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(y, x);
  cudaFree(d);
  cudaFree(e);
}

// The expert exchange of GPU ranks (NcclExpertExchange) as one rank: the counts come back as
// sent, the rows are copied to themselves, and nothing is counted as sent to another rank; the
// layer's record holds the exchanges and is reset by take_layer.
TEST(Nccl, OneRankExpertExchange) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no GPU";
  SingleComm host;
  NcclExpertExchange x(host, 0);
  EXPECT_EQ(x.rank(), 0);
  EXPECT_EQ(x.ranks(), 1);
  std::vector<int64_t> got;
  EXPECT_EQ(x.exchange_counts({3, 0, 5}, {3}, &got), (std::vector<int64_t>{3, 0, 5}));
  EXPECT_EQ(got, std::vector<int64_t>{3});
  const std::vector<int32_t> rows = {1, 2, 3, 4, 5, 6};
  int32_t *d = nullptr, *e = nullptr;
  ASSERT_EQ(cudaMalloc(&d, rows.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&e, rows.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  x.alltoallv_rows(d, {3}, e, {3}, 8, nullptr);  // three rows of two int32
  const NcclExpertExchange::Layer t = x.take_layer();
  std::vector<int32_t> y(rows.size());
  ASSERT_EQ(cudaMemcpy(y.data(), e, y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(y, rows);
  EXPECT_EQ(t.exchanges, 1);
  EXPECT_EQ(t.bytes_sent, 0u);
  EXPECT_EQ(t.bytes_received, 0u);
  EXPECT_GE(t.device_ms, 0.0);
  EXPECT_EQ(x.take_layer().exchanges, 0);
  cudaFree(d);
  cudaFree(e);
}

}  // namespace
}  // namespace strata
