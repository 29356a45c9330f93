// The checks of resume_fuzz, shared with tests/engine/fuzz_replay_test.cpp: the same bytes go to
// the resume manifest parser (manifest.json of a resume folder) and to the run record parser
// (the record a finished export holds). Each must succeed or throw strata::Error; an accepted
// manifest has 0 <= next_step <= steps and names its hidden-state file as a plain file name or
// an absolute spill-file path without "/../". Anything else (a crash, a sanitizer report,
// another exception, a broken promise: trap) is a finding. resume_one returns whether either
// parser accepted the bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.h"
#include "engine/resume.h"

namespace strata::fuzz {

inline bool resume_one(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  bool accepted = false;
  try {
    const ResumeState s = parse_resume_manifest(text, "fuzz/manifest.json");
    if (s.next_step < 0 || s.next_step > s.steps) __builtin_trap();
    if (s.hidden_file.find('/') != std::string::npos &&
        (s.hidden_file[0] != '/' || s.hidden_file.find("/../") != std::string::npos))
      __builtin_trap();
    accepted = true;
  } catch (const Error&) {
  }
  try {
    parse_run_record(text, "fuzz/strata_run.json");
    accepted = true;
  } catch (const Error&) {
  }
  return accepted;
}

}  // namespace strata::fuzz
