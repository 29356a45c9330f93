// libFuzzer entry of the resume target; the checks are in fuzz/resume_target.h.
#include "fuzz/resume_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::fuzz::resume_one(data, size);
  return 0;
}
