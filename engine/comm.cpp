#include "engine/comm.h"

#include <cstdlib>
#include <memory>

#include "core/error.h"
#include "engine/nccl_comm.h"

namespace strata {

#ifdef STRATA_HAVE_MPI
// engine/comm_mpi.cpp: the MPI communicator when an MPI launcher started this process
// (`launched`), else null.
std::unique_ptr<Comm> make_mpi_world(bool launched);
void mpi_finalize();
#endif

namespace {
std::unique_ptr<Comm>& world_slot() {
  static std::unique_ptr<Comm> w;
  return w;
}
}  // namespace

void SingleComm::abort(int code) {
  std::exit(code);
}

bool mpi_compiled() {
#ifdef STRATA_HAVE_MPI
  return true;
#else
  return false;
#endif
}

#ifndef STRATA_WITH_NCCL
// engine/nccl_comm.h; built with NCCL, nccl_comm.cpp says so.
bool nccl_compiled() {
  return false;
}
#endif

Comm& world(const Launcher& launcher) {
  std::unique_ptr<Comm>& w = world_slot();
  if (!w) {
#ifdef STRATA_HAVE_MPI
    w = make_mpi_world(launcher.mpi);
#endif
    if (!w) {
      // Several copies of a strata without MPI would each write the whole output at once.
      STRATA_CHECK(launcher.processes <= 1, "started by an MPI launcher with ", launcher.processes,
                   " processes, but this strata was built without MPI; rebuild with MPI "
                   "(libopenmpi-dev, -DSTRATA_MPI=ON) or run one process");
      w = std::make_unique<SingleComm>();
    }
  }
  return *w;
}

void comm_finalize() {
#ifdef STRATA_HAVE_MPI
  if (world_slot() && world_slot()->describe() != "") mpi_finalize();
#endif
}

}  // namespace strata
