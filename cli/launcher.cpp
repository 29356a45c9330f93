#include "cli/launcher.h"

#include <cstdlib>

namespace strata::cli {

Launcher launcher_from_environment() {
  Launcher l;
  // Launchers set these in every process they start (Open MPI, PMIx, Hydra/PMI, MVAPICH).
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                        "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS"}) {
    if (std::getenv(v)) l.mpi = true;
  }
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"}) {
    const char* n = std::getenv(v);
    if (n && std::atoi(n) > 1) {
      l.processes = std::atoi(n);
      break;
    }
  }
  return l;
}

}  // namespace strata::cli
