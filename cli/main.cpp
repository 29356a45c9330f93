// strata: the only place that turns errors into exit codes (docs/DESIGN.md "Errors").
//   exit 0  success
//   exit 1  bad input or bad usage (strata::Error): one line saying what is wrong and what to do
//   exit 2  no command, or an unknown one
//   exit 3  internal error (a bug in strata)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/device.h"
#include "core/error.h"

namespace strata::cli {

namespace {
void print_usage() {
  std::printf(
      "usage: strata <command> [options]\n\n"
      "strata quantizes Hugging Face checkpoints layer by layer into NVIDIA ModelOpt's format.\n\n"
      "commands:\n");
  for (const Command& c : commands())
    std::printf("  %-10s %s\n", c.name, c.summary);
  std::printf("\n'strata <command> --help' describes a command's options.\n");
}
}  // namespace

}  // namespace strata::cli

int main(int argc, char** argv) {
  using namespace strata::cli;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") ||
      !std::strcmp(argv[1], "help")) {
    print_usage();
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version")) return cmd_version({});
  std::vector<std::string> rest(argv + 2, argv + argc);
  // A compute-sanitizer initcheck run (core/device.h, docs/CUDA.md); no effect on results.
  if (const char* v = std::getenv("STRATA_CUDA_PRESET_GEMM_OUTPUTS"); v && !std::strcmp(v, "1"))
    strata::preset_gemm_outputs() = true;
  for (const Command& c : commands()) {
    if (std::strcmp(c.name, argv[1]) != 0) continue;
    try {
      return c.run(rest);
    } catch (const strata::Error& e) {
      std::fprintf(stderr, "strata %s: error: %s\n", c.name, e.what());
      return 1;
    } catch (const strata::InternalError& e) {
      std::fprintf(stderr, "strata %s: %s\n", c.name, e.what());
      return 3;
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr,
                   "strata %s: error: out of memory; lower the memory the run needs or use a "
                   "larger machine\n",
                   c.name);
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr,
                   "strata %s: internal error: %s; this is a bug in strata, please report it\n",
                   c.name, e.what());
      return 3;
    }
  }
  std::fprintf(stderr, "strata: unknown command '%s' (see strata --help)\n", argv[1]);
  return 2;
}
