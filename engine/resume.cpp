#include "engine/resume.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/json.h"
#include "io/safetensors_writer.h"

namespace fs = std::filesystem;

namespace strata {

void Fnv64::add(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h_ ^= p[i];
    h_ *= 0x100000001b3ull;
  }
}

std::string Fnv64::hex() const {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h_));
  return buf;
}

std::map<std::string, std::string> run_identity(const ModelConfig& config, const Checkpoint& ckpt,
                                                const QuantPlan& plan,
                                                const std::vector<std::vector<int32_t>>& tokens,
                                                const std::string& options,
                                                const std::string& version) {
  std::map<std::string, std::string> id;
  Fnv64 source;
  {
    std::ifstream in(config.path, std::ios::binary);
    STRATA_CHECK(in, config.path, ": cannot open for reading");
    std::ostringstream ss;
    ss << in.rdbuf();
    source.add(ss.str());
  }
  for (const SafetensorsFile& f : ckpt.shards()) {
    source.add(fs::path(f.path()).filename().string());
    source.add_u64(f.file_size());
    source.add(f.mapping()->data(), f.header().data_offset);
  }
  id["source"] = source.hex();
  Fnv64 recipe;
  for (const PlannedModule& m : plan.modules) {
    recipe.add(m.module);
    recipe.add(qformat_name(m.format));
  }
  recipe.add(kv_cache_format_name(plan.recipe.kv_cache));
  // Only a method other than max is hashed, so that the identity of max-calibrated runs stays.
  if (plan.recipe.calibration != CalibrationMethod::kMax)
    recipe.add(calibration_method_name(plan.recipe.calibration));
  id["recipe"] = recipe.hex();
  Fnv64 calib;
  for (const std::vector<int32_t>& s : tokens) {
    calib.add_u64(s.size());
    calib.add(s.data(), s.size() * sizeof(int32_t));
  }
  id["calibration"] = calib.hex();
  Fnv64 opt;
  opt.add(options);
  id["options"] = opt.hex();
  id["version"] = version;
  return id;
}

std::string identity_changes(const std::map<std::string, std::string>& have,
                             const std::map<std::string, std::string>& want) {
  std::string changed;
  for (const char* part : {"source", "recipe", "calibration", "options", "version"}) {
    auto a = have.find(part), b = want.find(part);
    const bool same = a != have.end() && b != want.end() && a->second == b->second;
    if (!same) changed += (changed.empty() ? "" : ", ") + std::string(part);
  }
  return changed;
}

namespace {

constexpr const char* kDamagedManifest =
    " (a damaged resume manifest); run with --overwrite to start over";

// A count or checksum of the manifest: a JSON integer in [0, max]. nlohmann converts a number of
// another kind without checking its range (1e300 to int64_t is undefined behaviour), so the kind
// and range are checked here.
int64_t manifest_int(const Json& v, const std::string& path, const char* field, uint64_t max) {
  const bool ok = (v.is_number_unsigned() && v.get<uint64_t>() <= max) ||
                  (v.is_number_integer() && v.get<int64_t>() >= 0 &&
                   static_cast<uint64_t>(v.get<int64_t>()) <= max);
  STRATA_CHECK(ok, path, ": malformed resume manifest (", field, " must be an integer in [0, ", max,
               "], not ", v.dump(), "); run with --overwrite to start over");
  return static_cast<int64_t>(v.get<uint64_t>());
}

ResumeState resume_state_from_json(const Json& j, const std::string& path) {
  constexpr uint64_t kMaxCount = uint64_t{1} << 62;
  ResumeState s;
  try {
    STRATA_CHECK(j.at("format").get<std::string>() == "strata-resume-2", path,
                 ": not a strata resume manifest of this version; run with --overwrite");
    for (const auto& [k, v] : j.at("identity").items())
      s.identity[k] = v.get<std::string>();
    s.steps = manifest_int(j.at("steps"), path, "steps", kMaxCount);
    s.next_step = manifest_int(j.at("next_step"), path, "next_step", kMaxCount);
    s.hidden_file = j.at("hidden_file").get<std::string>();
    for (const Json& c : j.at("hidden_crc32c")) {
      s.hidden_sums.push_back(static_cast<uint32_t>(
          manifest_int(c, path, "each hidden_crc32c entry", uint64_t{0xFFFFFFFF})));
    }
    for (const Json& l : j.at("layers")) {
      LayerReport r;
      r.layer = manifest_int(l.at(0), path, "a layer's index", kMaxCount);
      r.experts = manifest_int(l.at(1), path, "a layer's expert count", kMaxCount);
      r.experts_without_tokens =
          manifest_int(l.at(2), path, "a layer's count of experts without tokens", kMaxCount);
      if (l.size() > 3) {  // tokens per expert (older manifests have only the count)
        for (const Json& e : l.at(3))
          r.expert_tokens.push_back(manifest_int(e, path, "an expert's token count", kMaxCount));
      }
      s.layers.push_back(r);
    }
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": malformed resume manifest (", e.what(), "); run with --overwrite to start over");
  }
  // A file name in the resume folder, or an absolute path to a spill file in --offload_folder.
  const std::string name = s.hidden_file.substr(s.hidden_file.rfind('/') + 1);
  const bool hidden_ok =
      s.hidden_file.find('/') == std::string::npos ||
      (s.hidden_file.starts_with("/") && s.hidden_file.find("/../") == std::string::npos &&
       name.starts_with("hidden-") && name.ends_with(".safetensors"));
  STRATA_CHECK(s.next_step >= 0 && s.next_step <= s.steps && hidden_ok, path,
               ": malformed resume manifest; run with --overwrite to start over");
  return s;
}

}  // namespace

std::optional<ResumeState> read_resume_manifest(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  Json j;
  try {
    j = json_read_file(path);
  } catch (const Error& e) {
    fail(e.what(), kDamagedManifest);
  }
  return resume_state_from_json(j, path);
}

ResumeState parse_resume_manifest(std::string_view text, const std::string& path) {
  Json j;
  try {
    j = json_parse_strict(text, path);
  } catch (const Error& e) {
    fail(e.what(), kDamagedManifest);
  }
  return resume_state_from_json(j, path);
}

void write_resume_manifest(const std::string& path, const ResumeState& s) {
  Json j = Json::object();
  j["format"] = "strata-resume-2";
  Json id = Json::object();
  for (const auto& [k, v] : s.identity)
    id[k] = v;
  j["identity"] = id;
  j["steps"] = s.steps;
  j["next_step"] = s.next_step;
  j["hidden_file"] = s.hidden_file;
  j["hidden_crc32c"] = s.hidden_sums;
  Json layers = Json::array();
  for (const LayerReport& r : s.layers)
    layers.push_back(
        Json::array({r.layer, r.experts, r.experts_without_tokens, Json(r.expert_tokens)}));
  j["layers"] = layers;
  write_file_atomic(path, j.dump(2) + "\n");
}

namespace {
constexpr const char* kRunRecordFormat = "strata-run-1";
}  // namespace

namespace {

std::map<std::string, std::string> run_record_from_json(const Json& j, const std::string& path) {
  std::map<std::string, std::string> id;
  try {
    STRATA_CHECK(j.at("format").get<std::string>() == kRunRecordFormat, path,
                 ": not a strata run record of this version; add --overwrite to replace the "
                 "export, or choose another --export_path");
    for (const auto& [k, v] : j.at("identity").items())
      id[k] = v.get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": malformed strata run record (", e.what(),
         "); add --overwrite to replace the export, or choose another --export_path");
  }
  return id;
}

}  // namespace

std::optional<std::map<std::string, std::string>> read_run_record(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  return run_record_from_json(json_read_file(path), path);
}

std::map<std::string, std::string> parse_run_record(std::string_view text,
                                                    const std::string& path) {
  return run_record_from_json(json_parse_strict(text, path), path);
}

void write_run_record(const std::string& path, const std::map<std::string, std::string>& identity,
                      const std::vector<LayerReport>& layers) {
  Json j = Json::object();
  j["format"] = kRunRecordFormat;
  j["about"] =
      "the identity of the strata quantize run that wrote this export, one hash per part "
      "(docs/QUANTIZE.md, Interrupted runs), and per MoE layer the routed experts no "
      "calibration token reached";
  Json id = Json::object();
  for (const auto& [k, v] : identity)
    id[k] = v;
  j["identity"] = id;
  Json idle = Json::object();
  for (const LayerReport& r : layers) {
    if (r.experts > 0 && !r.expert_tokens.empty()) idle[std::to_string(r.layer)] = r.idle_experts();
  }
  if (!layers.empty()) j["experts_without_tokens"] = idle;  // none: no calibration ran
  write_file_atomic(path, j.dump(2) + "\n");
}

}  // namespace strata
