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

}  // namespace
}  // namespace strata
