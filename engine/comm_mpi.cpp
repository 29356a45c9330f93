// The MPI communicator (built when CMake finds MPI, option STRATA_MPI): MPI_COMM_WORLD of the
// processes an MPI launcher started. Counts above INT_MAX are sent in pieces.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <memory>

#include "core/error.h"
#include "engine/comm.h"

namespace strata {
namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fail(what, " failed: ", std::string(msg, static_cast<size_t>(len)));
}

constexpr size_t kPiece = size_t{1} << 30;  // bytes per call, below INT_MAX

class MpiComm final : public Comm {
 public:
  MpiComm() {
    int provided = 0;
    // Multiple: GPU ranks' reader thread broadcasts layers over its own duplicate of the world
    // (engine/gpu_ranks.h); every call on this communicator stays on the main thread.
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm local;
    check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local),
          "MPI_Comm_split_type");
    MPI_Comm_size(local, &local_size_);
    MPI_Comm_rank(local, &local_rank_);
    MPI_Comm_free(&local);
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(lib, &len);
    std::string l(lib, static_cast<size_t>(len));
    describe_ = "MPI (" + l.substr(0, l.find_first_of(",\n")) + ")";
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_size() const override { return local_size_; }
  int local_rank() const override { return local_rank_; }
  void allreduce_max(float* data, size_t n) override {
    for (size_t i = 0; i < n; i += kPiece / 4) {
      const int c = static_cast<int>(std::min(n - i, kPiece / 4));
      check(MPI_Allreduce(MPI_IN_PLACE, data + i, c, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD),
            "MPI_Allreduce");
    }
  }
  void allreduce_sum(uint64_t* data, size_t n) override {
    for (size_t i = 0; i < n; i += kPiece / 8) {
      const int c = static_cast<int>(std::min(n - i, kPiece / 8));
      check(MPI_Allreduce(MPI_IN_PLACE, data + i, c, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD),
            "MPI_Allreduce");
    }
  }
  void allreduce_sum(double* data, size_t n) override {
    for (size_t i = 0; i < n; i += kPiece / 8) {
      const int c = static_cast<int>(std::min(n - i, kPiece / 8));
      check(MPI_Allreduce(MPI_IN_PLACE, data + i, c, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD),
            "MPI_Allreduce");
    }
  }
  void broadcast(void* data, size_t bytes, int root) override {
    auto* p = static_cast<uint8_t*>(data);
    for (size_t i = 0; i < bytes; i += kPiece) {
      const int c = static_cast<int>(std::min(bytes - i, kPiece));
      check(MPI_Bcast(p + i, c, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
    }
  }
  std::vector<std::string> allgather(const std::string& mine) override {
    std::vector<uint64_t> sizes(static_cast<size_t>(size_), 0);
    sizes[static_cast<size_t>(rank_)] = mine.size();
    allreduce_sum(sizes.data(), sizes.size());
    std::vector<std::string> all(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      std::string& s = all[static_cast<size_t>(r)];
      s = r == rank_ ? mine : std::string(sizes[static_cast<size_t>(r)], '\0');
      broadcast(s.data(), s.size(), r);
    }
    return all;
  }
  std::vector<uint8_t> alltoallv_rows(const std::vector<uint8_t>& send,
                                      const std::vector<int64_t>& send_counts, size_t row_bytes,
                                      std::vector<int64_t>* recv_counts) override {
    STRATA_ASSERT(send_counts.size() == static_cast<size_t>(size_), "alltoallv counts");
    std::vector<int64_t> rc(static_cast<size_t>(size_), 0);
    check(
        MPI_Alltoall(send_counts.data(), 1, MPI_INT64_T, rc.data(), 1, MPI_INT64_T, MPI_COMM_WORLD),
        "MPI_Alltoall");
    MPI_Datatype row;
    check(MPI_Type_contiguous(static_cast<int>(row_bytes), MPI_BYTE, &row), "MPI_Type_contiguous");
    MPI_Type_commit(&row);
    std::vector<int> sc(static_cast<size_t>(size_)), sd(sc.size()), rcount(sc.size()),
        rd(sc.size());
    int64_t so = 0, ro = 0;
    for (size_t r = 0; r < sc.size(); ++r) {
      STRATA_CHECK(so + send_counts[r] < INT_MAX && ro + rc[r] < INT_MAX,
                   "more than 2^31 rows in one exchange; lower --batch_size");
      sc[r] = static_cast<int>(send_counts[r]);
      sd[r] = static_cast<int>(so);
      rcount[r] = static_cast<int>(rc[r]);
      rd[r] = static_cast<int>(ro);
      so += send_counts[r];
      ro += rc[r];
    }
    STRATA_ASSERT(static_cast<size_t>(so) * row_bytes == send.size(), "alltoallv send size");
    std::vector<uint8_t> recv(static_cast<size_t>(ro) * row_bytes);
    const int rc_all = MPI_Alltoallv(send.data(), sc.data(), sd.data(), row, recv.data(),
                                     rcount.data(), rd.data(), row, MPI_COMM_WORLD);
    MPI_Type_free(&row);
    check(rc_all, "MPI_Alltoallv");
    if (recv_counts) *recv_counts = rc;
    return recv;
  }
  void barrier() override { check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }
  std::string describe() const override { return describe_; }

 private:
  int rank_ = 0, size_ = 1, local_size_ = 1, local_rank_ = 0;
  std::string describe_;
};

}  // namespace

std::unique_ptr<Comm> make_mpi_world(bool launched) {
  if (!launched) return nullptr;
  return std::make_unique<MpiComm>();
}

void mpi_finalize() {
  int done = 0;
  MPI_Finalized(&done);
  if (!done) MPI_Finalize();
}

}  // namespace strata
