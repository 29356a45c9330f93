// A Comm for tests of code that only asks who it is among the ranks: rank `rank` of `size`, whose
// collectives are never called (they act as for one process). one_host: every rank on this host
// (local_rank = rank, local_size = size); else one rank per host.
#pragma once

#include <cstdlib>
#include <string>
#include <vector>

#include "engine/comm.h"

namespace strata {

class FakeRank final : public Comm {
 public:
  FakeRank(int rank, int size, bool one_host = false)
      : rank_(rank), size_(size), one_host_(one_host) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_size() const override { return one_host_ ? size_ : 1; }
  int local_rank() const override { return one_host_ ? rank_ : 0; }
  void allreduce_max(float*, size_t) override {}
  void allreduce_sum(uint64_t*, size_t) override {}
  void allreduce_sum(double*, size_t) override {}
  void broadcast(void*, size_t, int) override {}
  std::vector<std::string> allgather(const std::string& m) override { return {m}; }
  std::vector<uint8_t> alltoallv_rows(const std::vector<uint8_t>& s, const std::vector<int64_t>&,
                                      size_t, std::vector<int64_t>*) override {
    return s;
  }
  void barrier() override {}
  [[noreturn]] void abort(int) override { std::abort(); }
  std::string describe() const override { return "fake"; }

 private:
  int rank_, size_;
  bool one_host_;
};

}  // namespace strata
