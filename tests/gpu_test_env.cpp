// Linked into every GPU test binary (tests/CMakeLists.txt): STRATA_CUDA_PRESET_GEMM_OUTPUTS=1
// turns on the initcheck preset of core/device.h, as cli/main.cpp does for strata, so that
// scripts/gpu_sanitize.py's initcheck run covers the gtest binaries too.
#include <cstdlib>
#include <cstring>

#include "core/device.h"

namespace {
const bool kPreset = [] {
  const char* v = std::getenv("STRATA_CUDA_PRESET_GEMM_OUTPUTS");
  if (v && !std::strcmp(v, "1")) strata::preset_gemm_outputs() = true;
  return true;
}();
}  // namespace
