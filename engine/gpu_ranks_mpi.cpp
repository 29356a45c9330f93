// The reader thread's MPI channel of GPU ranks (engine/gpu_ranks.h): a duplicate of
// MPI_COMM_WORLD, used by that thread alone, while the main thread uses the world's. Needs
// MPI_THREAD_MULTIPLE (engine/comm_mpi.cpp asks for it).
#include <mpi.h>

#include <algorithm>
#include <memory>

#include "core/error.h"
#include "engine/gpu_ranks.h"

namespace strata {
namespace {

constexpr size_t kPiece = size_t{1} << 30;  // bytes per call, below INT_MAX

class MpiChannel final : public ThreadChannel {
 public:
  explicit MpiChannel(MPI_Comm c) : c_(c) {}
  ~MpiChannel() override { MPI_Comm_free(&c_); }
  void broadcast(void* data, size_t bytes, int root) override {
    auto* p = static_cast<uint8_t*>(data);
    for (size_t i = 0; i < bytes; i += kPiece) {
      const int n = static_cast<int>(std::min(bytes - i, kPiece));
      const int rc = MPI_Bcast(p + i, n, MPI_BYTE, root, c_);
      STRATA_CHECK(rc == MPI_SUCCESS, "MPI_Bcast of a layer's tensors failed (", rc, ")");
    }
  }

 private:
  MPI_Comm c_;
};

}  // namespace

std::unique_ptr<ThreadChannel> make_mpi_thread_channel(Comm& comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return nullptr;  // not an MPI communicator (tests' fakes)
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  // Every rank takes the same path: MPI_Comm_dup is collective.
  if (any_rank(comm, level < MPI_THREAD_MULTIPLE)) return nullptr;
  MPI_Comm c;
  const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &c);
  STRATA_CHECK(rc == MPI_SUCCESS, "MPI_Comm_dup failed (", rc, ")");
  return std::make_unique<MpiChannel>(c);
}

}  // namespace strata
