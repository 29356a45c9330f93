#include "engine/weight_quantizer.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"
#include "engine/quantize_steps.h"
#include "model/groups.h"

namespace strata {

WeightQuantizer::WeightQuantizer(const QuantPlan& plan, int64_t first_layer,
                                 const std::function<bool(const PlannedModule&)>& take,
                                 bool compressed) {
  layers_.resize(static_cast<size_t>(plan.num_layers));
  std::vector<std::map<std::string, int> > group_of(layers_.size());
  const WeightCalib& algo = plan.recipe.algorithm;
  if (algo.searches()) search_ = ops::WeightSearch{algo, {}};
  std::set<std::string> compressed_groups;
  for (const PlannedModule& m : plan.modules) {
    if (!compressed && m.source != SourceCompression::kNone)
      compressed_groups.insert(weight_group_key(plan, m.module));
  }
  for (const PlannedModule& m : plan.modules) {
    // The weight-only block formats (NVFP4 bs32, MXFP4, FP8 per 128x128 block) have no device
    // encoder: the exporter quantizes them on the host, as it does any module no precomputed
    // weight is given for.
    if (m.layer < first_layer || m.layer >= plan.num_layers || m.format == QFormat::kNone ||
        m.format == QFormat::kW4A16Nvfp4Bs32 || m.format == QFormat::kMxfp4 ||
        m.format == QFormat::kFp8PbWo ||
        (m.format == QFormat::kFp8 && algo.searches() && !algo.fp8_scale_sweep) ||
        compressed_groups.count(weight_group_key(plan, m.module)) || !take(m))
      continue;
    Layer& L = layers_[static_cast<size_t>(m.layer)];
    const uint64_t n = static_cast<uint64_t>(m.shape[0] * m.shape[1]);
    int group = -1;
    uint64_t out = 0;
    // FP8 routed experts share their group's weight amax, as NVFP4 groups do (export/plan.h).
    const bool shared_fp8 = fp8_shares_weight_amax(m.module);
    switch (m.format) {
      case QFormat::kNvfp4:
      case QFormat::kW4A16Nvfp4: {
        if (local_hessian_tracks(plan, m))  // gpt-oss's fused experts: the plain search
          hessian_bytes_ = std::max(hessian_bytes_, static_cast<uint64_t>(m.shape[1]) * 16 * 8);
        auto [it, fresh] = group_of[static_cast<size_t>(m.layer)].emplace(
            weight_group_key(plan, m.module), static_cast<int>(L.groups.size()));
        if (fresh) L.groups.emplace_back();
        group = it->second;
        out = n / 2 + n / 16;
        break;
      }
      case QFormat::kFp8:
        if (shared_fp8) {
          auto [it, fresh] = group_of[static_cast<size_t>(m.layer)].emplace(
              weight_group_key(plan, m.module), static_cast<int>(L.groups.size()));
          if (fresh) L.groups.emplace_back();
          group = it->second;
        } else {
          group = static_cast<int>(L.groups.size());
          L.groups.push_back({&m});
        }
        out = n;
        break;
      case QFormat::kMxfp8:
        out = n + n / 32;
        break;
      case QFormat::kW4A16Nvfp4Bs32:
      case QFormat::kMxfp4:
      case QFormat::kFp8PbWo:
      case QFormat::kNone:
        break;
    }
    L.jobs.push_back({&m, group, plan.fused_experts && m.kind == TensorKind::kRoutedExperts});
    encoded_bytes_ = std::max(encoded_bytes_, out);
    max_groups_ = std::max(max_groups_, L.groups.size());
  }
  // An NVFP4 group's amax (and a shared FP8 one's) covers every planned module of its group,
  // quantized here or not, as the exporter's does.
  for (const PlannedModule& m : plan.modules) {
    if (m.layer < first_layer || m.layer >= plan.num_layers) continue;
    const std::map<std::string, int>& g = group_of[static_cast<size_t>(m.layer)];
    auto it = g.find(weight_group_key(plan, m.module));
    if (it != g.end())
      layers_[static_cast<size_t>(m.layer)].groups[static_cast<size_t>(it->second)].push_back(&m);
  }
}

PrecomputedWeights WeightQuantizer::quantize(
    int64_t l, ops::Backend& backend,
    const std::function<ops::StoredWeight(const std::string&)>& weight,
    const std::function<std::vector<double>(const std::string&)>& hessian) {
  STRATA_ASSERT(!needs_hessians() || hessian, "local_hessian without the input statistics");
  const Layer& L = layers_[static_cast<size_t>(l)];
  PrecomputedWeights out;
  if (L.jobs.empty()) return out;
  std::vector<std::vector<ops::StoredWeight> > groups(L.groups.size());
  for (size_t g = 0; g < L.groups.size(); ++g) {
    for (const PlannedModule* m : L.groups[g])
      groups[g].push_back(weight(m->module));
  }
  std::vector<float> amax(groups.size(), 0.0f);
  backend.weight_amaxes(groups, amax.data());
  // The jobs in runs: the CUDA backend brings a run of NVFP4 weights back in one synchronization.
  // A local_hessian search's job runs alone, its module's statistics gathered just before.
  std::vector<ops::WeightJob> run;
  auto flush = [&]() {
    std::vector<QuantizedWeight> q = backend.quantize_weights(run);
    for (size_t i = 0; i < run.size(); ++i)
      out[std::string(run[i].name)] = std::move(q[i]);
    run.clear();
  };
  const std::optional<ops::WeightSearch> plain =
      search_ ? std::optional(ops::WeightSearch{search_->calib, {}}) : std::nullopt;
  for (const Job& j : L.jobs) {
    const PlannedModule& m = *j.module;
    ops::WeightJob job{weight(m.module), m.format,
                       j.group < 0 ? 0.0f : amax[static_cast<size_t>(j.group)], m.module};
    job.weight.fp32_quotient = j.fp32_quotient;
    const bool searched =
        plain && (m.format == QFormat::kNvfp4 || m.format == QFormat::kW4A16Nvfp4);
    if (searched && needs_hessians()) {
      flush();
      const std::vector<double> h = hessian(m.module);
      const ops::WeightSearch search{search_->calib, h};
      out[m.module] = backend.quantize_weight(job.weight, m.format, job.amax, m.module, &search);
      continue;
    }
    if (searched) job.search = &*plain;
    run.push_back(job);
  }
  flush();
  return out;
}

}  // namespace strata
