#include "cli/commands.h"

#include <cstdio>

#include "core/device.h"
#include "engine/comm.h"

#ifndef STRATA_VERSION
#define STRATA_VERSION "0.0.0"
#endif

namespace strata::cli {

int cmd_version(const std::vector<std::string>&) {
  std::printf("strata %s (%s%s)\n", STRATA_VERSION,
              cuda_compiled() ? "CUDA backend built" : "CPU only", mpi_compiled() ? ", MPI" : "");
  return 0;
}

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {"version", "print the version and whether the CUDA backend was built", cmd_version},
      {"quantize",
       "quantize a checkpoint into ModelOpt's format (NVFP4, FP8, MXFP8) for vLLM/SGLang/TRT-LLM",
       cmd_quantize},
      {"inspect", "describe a checkpoint and estimate its quantized size", cmd_inspect},
      {"eval", "run a checkpoint over token-id sequences: mean NLL, perplexity, logits", cmd_eval},
      {"compare",
       "compare a checkpoint with its quantized export as served: KL, top-1, per-layer error",
       cmd_compare},
      {"tokenize", "print the token ids of text read on stdin, as the model's tokenizer gives them",
       cmd_tokenize},
      {"recipes", "list the built-in quantization recipes, or show one recipe's rules",
       cmd_recipes},
  };
  return table;
}

}  // namespace strata::cli
