// Calibration datasets: the token sequences a quantize run feeds through the model.
//
// Sources (`--calib_data a.jsonl,b.txt --calib_size 256,128`), each read whole:
//   *.jsonl  one JSON value per line: an object with the text field (`--calib_text_field`, default
//            "text") is a text record; a list of integers, or an object with "input_ids", is a
//            token-id record (used as is: no special tokens added). Blank lines are ignored.
//   other    plain text: tokenized as one stream (without special tokens) and cut into
//            consecutive windows; each window is a record (the special tokens are added around it).
//
// Sampling, per source, independent of thread count and of the other sources:
//   1. number the source's records 0..N-1 in file order;
//   2. shuffle the numbers with Fisher-Yates driven by SplitMix64 seeded with
//      seed ^ (0x9E3779B97F4A7C15 * (source index + 1)), drawing j uniformly in [0, i] by
//      rejection (no modulo bias);
//   3. walk the shuffled order: tokenize the record (text: with the tokenizer's special tokens,
//      content truncated so that the whole fits seq_len, as Hugging Face's truncation does),
//      skip it when empty (no content tokens) or shorter than min_tokens, and keep it otherwise,
//      until `count` are kept or the records run out (then the report says how many were missing).
// The result lists the kept sequences source by source, each in its shuffled order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace strata {

struct CalibSource {
  std::string path;
  int64_t count = 0;  // sequences to take
};

struct CalibOptions {
  std::vector<CalibSource> sources;  // empty: the bundled corpus (bundled_calib_path())
  std::string text_field = "text";
  int64_t seq_len = 512;  // --calib_seq: tokens per sequence at most, special tokens included
  // Shorter sequences are skipped and counted. 1: every non-empty sample is used, as ModelOpt's
  // calibration uses every sample it is given (hf_ptq).
  int64_t min_tokens = 1;
  uint64_t seed = 1234;
  bool add_special_tokens = true;
  int64_t default_count = 256;  // sequences from the bundled corpus when no source is given
};

struct CalibSourceReport {
  std::string path;
  std::string format;   // "jsonl", "text"
  int64_t records = 0;  // records in the file
  int64_t requested = 0;
  int64_t taken = 0;
  int64_t skipped_empty = 0;
  int64_t skipped_short = 0;
  int64_t truncated = 0;  // records cut to seq_len
  int64_t tokens = 0;     // tokens in the taken sequences
};

struct CalibReport {
  std::vector<CalibSourceReport> sources;
  int64_t sequences = 0;
  int64_t tokens = 0;
  std::string summary() const;  // one line per source, for the log
};

struct Calibration {
  std::vector<std::vector<int32_t>> sequences;
  CalibReport report;
};

// Parses the hf_ptq-style comma lists: `data` = "a.jsonl,b.txt", `sizes` = "256,128" (one size
// for all sources, or one per source). Throws strata::Error naming the option on a mismatch.
std::vector<CalibSource> parse_calib_sources(const std::string& data, const std::string& sizes);

// The corpus shipped in data/calib (installed next to the binary or found in the source tree).
std::string bundled_calib_path();
// Its held-out slice, data/calib/heldout/: text no calibration reads (a text directory source
// reads only the *.txt files directly in it, so the bundled corpus never includes this folder),
// strata compare's default data.
std::string bundled_heldout_path();

// A token-id file: one JSON list of non-negative ids per line (blank lines ignored), the
// sequences in file order (`strata eval --tokens`, `strata compare --tokens`). Throws
// strata::Error naming the file and line for anything else, and for a file with no sequences.
std::vector<std::vector<int32_t>> read_token_file(const std::string& path);

Calibration load_calibration(const CalibOptions& options, const Tokenizer& tokenizer);
// The same for a model without a tokenizer (tokenizer == nullptr): token-id records only, ids
// checked against vocab_size; text sources are an error saying so.
Calibration load_calibration(const CalibOptions& options, const Tokenizer* tokenizer,
                             int64_t vocab_size);

}  // namespace strata
