#include "engine/quantize_steps.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "io/checkpoint.h"

namespace fs = std::filesystem;

namespace strata {
std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) {
    b /= 1024.0;
    ++u;
  }
  std::ostringstream os;
  os.precision(u == 0 ? 0 : 2);
  os << std::fixed << b << " " << units[u];
  return os.str();
}

bool needs_activations(const QuantPlan& plan) {
  if (kv_cache_calibrated(plan.recipe.kv_cache)) return true;
  // local_hessian weighs the weight error by the module's inputs: W4A16 needs them too.
  for (int64_t l = 0; l < plan.num_layers; ++l) {
    if (!local_hessian_modules(plan, l).empty()) return true;
  }
  for (const PlannedModule& m : plan.modules) {
    if ((m.format == QFormat::kNvfp4 || m.format == QFormat::kFp8) && !m.input_amax) return true;
  }
  return false;
}

bool local_hessian_tracks(const QuantPlan& plan, const PlannedModule& m) {
  return plan.recipe.algorithm.method == WeightCalib::Method::kLocalHessian &&
         (m.format == QFormat::kNvfp4 || m.format == QFormat::kW4A16Nvfp4) &&
         !(plan.fused_experts && m.kind == TensorKind::kRoutedExperts);
}

std::set<std::string, std::less<>> local_hessian_modules(const QuantPlan& plan, int64_t layer) {
  std::set<std::string, std::less<>> out;
  for (const PlannedModule& m : plan.modules) {
    if (m.layer == layer && local_hessian_tracks(plan, m)) out.insert(m.module);
  }
  return out;
}

uint64_t local_hessian_device_bytes(const QuantPlan& plan, int64_t first_layer, int64_t experts) {
  // Per layer: the tracked modules' input features, a routed projection (its name with the expert
  // index taken out) counted once, times the experts.
  std::map<int64_t, uint64_t> features;
  std::set<std::pair<int64_t, std::string>> projections;
  for (const PlannedModule& m : plan.modules) {
    if (m.layer < first_layer || !local_hessian_tracks(plan, m)) continue;
    const auto in = static_cast<uint64_t>(m.shape[1]);
    if (routed_expert_of(m.module) < 0) {
      features[m.layer] += in;
    } else if (projections.emplace(m.layer, m.module.substr(m.module.rfind('.'))).second) {
      features[m.layer] += in * static_cast<uint64_t>(std::max<int64_t>(experts, 1));
    }
  }
  uint64_t most = 0;
  for (const auto& [layer, f] : features)
    most = std::max(most, f);
  return most * 16 * sizeof(double);
}

std::string resume_dir_of(const QuantizeJob& job) {
  return job.resume_dir.empty() ? job.export_path + ".strata_resume" : job.resume_dir;
}

std::vector<std::string> first_step_tensors(const Checkpoint& ckpt) {
  // `part` at the start of `name` or right after a dot.
  auto has_component = [](std::string_view name, std::string_view part) {
    for (size_t at = name.find(part); at != std::string_view::npos; at = name.find(part, at + 1)) {
      if (at == 0 || name[at - 1] == '.') return true;
    }
    return false;
  };
  std::vector<std::string> names;
  for (const std::string& n : ckpt.tensor_names()) {
    if (has_component(n, "embed_tokens.") || has_component(n, "lm_head.") ||
        has_component(n, "model.norm.") || has_component(n, "layers.0."))
      names.push_back(n);
  }
  return names;
}

bool use_expert_parallel(bool asked, int ranks, bool calibrated, bool gpu_without_nccl,
                         int64_t experts) {
  return asked && ranks > 1 && calibrated && !gpu_without_nccl && experts > 0;
}

MicroBatches group_micro_batches(const std::vector<std::vector<int32_t>>& sequences,
                                 int64_t batch_size) {
  MicroBatches mb;
  const int64_t bs = std::max<int64_t>(batch_size, 1);
  for (size_t i = 0; i < sequences.size(); i += static_cast<size_t>(bs)) {
    const size_t end = std::min(sequences.size(), i + static_cast<size_t>(bs));
    mb.groups.emplace_back(sequences.begin() + static_cast<int64_t>(i),
                           sequences.begin() + static_cast<int64_t>(end));
    int64_t t = 0;
    for (const auto& seq : mb.groups.back()) {
      t += static_cast<int64_t>(seq.size());
      mb.longest = std::max<int64_t>(mb.longest, static_cast<int64_t>(seq.size()));
    }
    mb.tokens.push_back(t);
  }
  return mb;
}

MemoryEstimate fit_memory_cap(MemoryEstimate m, uint64_t cap, std::optional<uint64_t> test_budget) {
  MemoryEstimate least = m;
  least.spilled = least.calibrated;
  least.activations = least.activations_one;
  if (least.on_gpu && !least.context_measured) least.device_context = 0;
  STRATA_CHECK(cap == 0 || least.total() <= cap, "--max_cpu_memory_gb ",
               static_cast<double>(cap) / (1024.0 * 1024.0 * 1024.0), " (", human_bytes(cap),
               ") is below the least this run needs, ", human_bytes(least.total()),
               least.calibrated ? " with the activation store spilled" : "",
               least.on_gpu && !least.context_measured ? ", before the CUDA context's" : "", ": ",
               least.describe(), "; raise it, or lower --batch_size or --calib_seq");
  const uint64_t fixed = m.fixed();
  const uint64_t budget =
      test_budget ? *test_budget : (cap == 0 ? UINT64_MAX : (cap > fixed ? cap - fixed : 0));
  if (m.calibrated && m.activations_all > budget) {
    m.spilled = true;
    m.activations = m.activations_one;
  }
  return m;
}

MemoryEstimate with_gpu_host_memory(MemoryEstimate m, uint64_t blob_bytes) {
  m.on_gpu = true;
  m.layer_weights /= 2;  // fp32 -> at most 2 bytes a value of codes and scales
  m.pinned = 2 * blob_bytes + m.activations_one;
  m.device_context = kCudaContextAllowance;
  m.context_measured = false;
  return m;
}

MemoryEstimate with_measured_context(MemoryEstimate m, uint64_t rss, uint64_t pinned,
                                     uint64_t pinned_hidden) {
  const uint64_t known = m.baseline + pinned + pinned_hidden;
  m.device_context = (rss > known ? rss - known : 0) + kCudaLazyLoadingAllowance;
  m.context_measured = true;
  m.pinned = pinned;
  m.activations = pinned_hidden;
  m.activations_one = 0;  // spilled, the stage (in `pinned`) is all the host holds
  return m;
}

void check_memory_cap(const MemoryEstimate& m, uint64_t cap, const std::string& when) {
  MemoryEstimate c = m;
  if (c.on_gpu && !c.context_measured) c.device_context = 0;
  STRATA_CHECK(cap == 0 || c.total() <= cap, "--max_cpu_memory_gb ",
               static_cast<double>(cap) / (1024.0 * 1024.0 * 1024.0), " (", human_bytes(cap),
               ") is below this run's memory bound ", when, ", ", human_bytes(c.total()),
               c.on_gpu && !c.context_measured ? " before the CUDA context's" : "", ": ",
               c.describe(), "; raise it, or lower --batch_size or --calib_seq");
}

std::optional<ResumeState> resumed_state(const std::optional<ResumeState>& prev,
                                         const std::map<std::string, std::string>& identity,
                                         int64_t steps, const std::string& manifest) {
  if (!prev) return std::nullopt;
  const std::string changed = identity_changes(prev->identity, identity);
  STRATA_CHECK(changed.empty(), manifest,
               " records an interrupted run of another job (changed: ", changed,
               "); run the same command as before to resume it, or add --overwrite to start "
               "over");
  STRATA_CHECK(prev->steps == steps, manifest, ": malformed resume manifest (", prev->steps,
               " steps, this run has ", steps, "); run with --overwrite to start over");
  return prev;
}

std::string expert_ranges(int64_t experts, int ranks) {
  std::string ranges;
  for (int r = 0; r < ranks; ++r) {
    const int64_t lo = experts * r / ranks, hi = experts * (r + 1) / ranks;
    ranges += str(r == 0 ? "" : ", ", "rank ", r, ": ", lo, "-", hi - 1);
  }
  return ranges;
}

std::string resume_point(int64_t next_step, int64_t num_layers) {
  return next_step <= num_layers ? str("layer ", next_step, "/", num_layers)
                                 : std::string("the config files");
}

int64_t first_layer_to_run(int64_t next_step, int64_t num_layers) {
  return std::min(std::max<int64_t>(next_step - 1, 0), num_layers);
}

std::string manifest_name(const std::string& path, const std::string& resume_dir) {
  return fs::path(path).parent_path() == fs::path(resume_dir) ? fs::path(path).filename().string()
                                                              : path;
}

size_t lockstep_rounds(size_t batches, bool expert_parallel, int ranks) {
  const size_t N = expert_parallel ? static_cast<size_t>(ranks) : 1;
  return (batches + N - 1) / N;
}

size_t round_micro_batch(size_t k, bool expert_parallel, int ranks, int rank) {
  const size_t N = expert_parallel ? static_cast<size_t>(ranks) : 1;
  return expert_parallel ? k * N + static_cast<size_t>(rank) : k;
}

}  // namespace strata
