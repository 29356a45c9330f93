// The resume manifest of a quantize run (docs/QUANTIZE.md "Interrupted runs").
//
// A run keeps a folder beside its output (default `<export_path>.strata_resume`) holding
//   manifest.json            this state, rewritten atomically after every finished step
//   hidden-<step>.safetensors the inputs of the next decoder layer ("hidden.<b>" BF16 or F32
//                            [T_b, H] per micro-batch b, engine/activation_store.h), written
//                            before the manifest that names it; a spilled run keeps it in
//                            --offload_folder and the manifest names it by full path
// The manifest vouches for the output directory: the shards of steps [0, next_step) are on disk
// and synced (export/modelopt.h: step 0 the head, 1..N the decoder layers). It
// records the CRC-32C of each micro-batch of the hidden file it names; a resumed run checks the
// file against them (and its size and header) before trusting it, and starts over when it fails.
//
// A finished export holds its run's identity in kRunRecordName, written last (after the index
// and config files, synced) and before the resume folder goes: the same command run again finds
// it and has nothing to do; another command is refused naming the parts that differ.
//
// The run's identity is one 64-bit FNV-1a hash per part, so that a refusal can name the part
// that changed:
//   source       config.json bytes, then per source shard its file name, size and header bytes
//   recipe       per linear module its name and planned format, then the KV-cache format
//   calibration  per calibration sequence its length and token ids
//   options      options that change the output bytes (--batch_size, --max_shard_size_gb)
//   version      the strata version
// FNV-1a guards against accidental change, not against an adversary.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "export/modelopt.h"

namespace strata {

// 64-bit FNV-1a.
class Fnv64 {
 public:
  void add(const void* data, size_t n);
  void add(std::string_view s) {
    add_u64(s.size());
    add(s.data(), s.size());
  }
  void add_u64(uint64_t v) { add(&v, sizeof v); }
  std::string hex() const;

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

struct ResumeState {
  std::map<std::string, std::string> identity;  // part -> hash (hex)
  int64_t steps = 0;
  int64_t next_step = 0;    // steps [0, next_step) are written and synced
  std::string hidden_file;  // in the resume folder; "" when the next inputs are the embeddings
  std::vector<uint32_t> hidden_sums;  // CRC-32C of each micro-batch of hidden_file
  std::vector<LayerReport> layers;
};

// The identity parts, in the order above.
std::map<std::string, std::string> run_identity(const ModelConfig& config, const Checkpoint& ckpt,
                                                const QuantPlan& plan,
                                                const std::vector<std::vector<int32_t>>& tokens,
                                                const std::string& options,
                                                const std::string& version);

// The parts of `want` that differ in `have`, comma-separated ("" when none).
std::string identity_changes(const std::map<std::string, std::string>& have,
                             const std::map<std::string, std::string>& want);

// std::nullopt when `path` does not exist; throws strata::Error when it is not a manifest.
std::optional<ResumeState> read_resume_manifest(const std::string& path);
// The same from the manifest's text (what read_resume_manifest does once the file is read);
// `path` names it in errors.
ResumeState parse_resume_manifest(std::string_view text, const std::string& path);
void write_resume_manifest(const std::string& path, const ResumeState& state);

// The run record of a finished export: `<export_path>/<kRunRecordName>` (export/modelopt.h),
// {"format", "about", "identity"}; no timestamps: identical runs write identical bytes.
// The identity it records; std::nullopt when `path` does not exist; throws strata::Error when it
// is not a run record.
std::optional<std::map<std::string, std::string>> read_run_record(const std::string& path);
// The same from the record's text; `path` names it in errors.
std::map<std::string, std::string> parse_run_record(std::string_view text, const std::string& path);
// Written atomically and synced, with "experts_without_tokens": {"<layer>": [expert, ...]} for
// every MoE layer of `layers` (strata compare reports them; left out when `layers` is empty: a
// run that calibrated nothing).
void write_run_record(const std::string& path, const std::map<std::string, std::string>& identity,
                      const std::vector<LayerReport>& layers);

}  // namespace strata
