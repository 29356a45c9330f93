// libFuzzer entry of the tiktoken target; the checks are in fuzz/tokenizer_target.h.
#include "fuzz/tokenizer_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::fuzz::tiktoken_one(data, size);
  return 0;
}
