// libFuzzer entry of the tokenizer_json target; the checks are in fuzz/tokenizer_target.h.
#include "fuzz/tokenizer_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::fuzz::tokenizer_json_one(data, size);
  return 0;
}
