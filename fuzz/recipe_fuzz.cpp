// libFuzzer entry of the recipe target; the checks are in fuzz/recipe_target.h.
#include "fuzz/recipe_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::fuzz::recipe_one(data, size);
  return 0;
}
