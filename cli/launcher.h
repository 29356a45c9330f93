// The process environment as the engine needs it: which MPI launcher variables are set
// (engine/comm.h Launcher). The engine reads no environment variable itself.
#pragma once

#include "engine/comm.h"

namespace strata::cli {

Launcher launcher_from_environment();

}  // namespace strata::cli
