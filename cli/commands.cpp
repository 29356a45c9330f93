#include "cli/commands.h"

namespace strata::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {"version", "print the version and whether the CUDA backend was built", cmd_version},
      {"inspect", "describe a checkpoint and estimate its quantized size", cmd_inspect},
  };
  return table;
}

}  // namespace strata::cli
