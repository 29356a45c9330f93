#include "core/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace strata {

namespace {

// Per-thread PCRE2 match state: match data for one pair and a JIT stack large enough for the
// tokenizer's long runs of white space.
struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  MatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    STRATA_ASSERT(data && context && jit_stack, "PCRE2 allocation failed");
    pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

}  // namespace

Regex::Regex(const std::string& pattern, std::string what) : what_(std::move(what)) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    fail(what_, ": the pattern '", pattern, "' does not compile (",
         reinterpret_cast<const char*>(msg), " at offset ", offset, ")");
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // the interpreter runs it where JIT is unavailable
  code_ = code;
}

Regex::~Regex() {
  pcre2_code_free(static_cast<pcre2_code*>(code_));
}

int Regex::match(std::string_view text, size_t start, unsigned options) const {
  MatchState& st = match_state();
  const int rc =
      pcre2_match(static_cast<pcre2_code*>(code_), reinterpret_cast<PCRE2_SPTR>(text.data()),
                  text.size(), start, PCRE2_NO_UTF_CHECK | options, st.data, st.context);
  if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof(msg));
    fail(what_, ": the regex failed on a text of ", text.size(), " bytes (",
         reinterpret_cast<const char*>(msg), "); split the input into smaller pieces");
  }
  return rc;
}

bool Regex::find(std::string_view text, size_t start, size_t& begin, size_t& end) const {
  if (match(text, start, 0) == PCRE2_ERROR_NOMATCH) return false;
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match_state().data);
  begin = ov[0];
  end = ov[1];
  return true;
}

bool Regex::matches_at_start(std::string_view text) const {
  return match(text, 0, PCRE2_ANCHORED) != PCRE2_ERROR_NOMATCH;
}

}  // namespace strata
