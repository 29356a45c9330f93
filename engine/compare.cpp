#include "engine/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "core/parallel.h"
#include "core/progress.h"
#include "engine/compare_layers.h"
#include "engine/run_times.h"
#include "export/modelopt.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "model/forward.h"
#include "tokenizer/tokenizer.h"

namespace strata {

namespace fs = std::filesystem;

namespace {

// ---- inputs ------------------------------------------------------------------------------------

void check_dir(const std::string& dir, const char* what) {
  STRATA_CHECK(fs::is_directory(dir), dir, ": ", what, " is not a directory");
  STRATA_CHECK(fs::exists(fs::path(dir) / "config.json"), dir, ": ", what,
               " has no config.json; give a Hugging Face checkpoint directory");
}

// SRC and QUANTIZED must be the same model: what the forward's shapes depend on.
void check_same_architecture(const ModelConfig& s, const ModelConfig& q) {
  auto same = [&](const char* field, auto a, auto b) {
    STRATA_CHECK(a == b, "SRC and QUANTIZED are different architectures: ", field, " is ", a,
                 " in ", s.path, " but ", b, " in ", q.path);
  };
  same("model_type", s.model_type, q.model_type);
  same("num_hidden_layers", s.num_hidden_layers, q.num_hidden_layers);
  same("hidden_size", s.hidden_size, q.hidden_size);
  same("vocab_size", s.vocab_size, q.vocab_size);
  same("the number of routed experts", s.num_experts, q.num_experts);
  same("num_experts_per_tok", s.num_experts_per_tok, q.num_experts_per_tok);
}

struct ExportInfo {
  std::string quant_algo, kv_cache_algo;
};

// hf_quant_config.json of QUANTIZED, when it has one.
ExportInfo read_export_info(const std::string& dir) {
  ExportInfo info;
  const fs::path p = fs::path(dir) / "hf_quant_config.json";
  if (!fs::exists(p)) return info;
  const Json j = json_read_file(p.string());
  STRATA_CHECK(j.is_object() && j.contains("quantization") && j["quantization"].is_object(),
               p.string(), ": no \"quantization\" object; not a ModelOpt export");
  const Json& q = j["quantization"];
  auto text = [&](const char* key) -> std::string {
    if (!q.contains(key) || q[key].is_null()) return "";
    STRATA_CHECK(q[key].is_string(), p.string(), ": \"", key, "\" must be a string or null");
    return q[key].get<std::string>();
  };
  info.quant_algo = text("quant_algo");
  info.kv_cache_algo = text("kv_cache_quant_algo");
  return info;
}

// The experts without calibration tokens that the export's run record lists, per layer;
// std::nullopt when it has no such list (not a strata export, or an older one).
std::optional<std::map<int64_t, std::vector<int64_t>>> read_uncalibrated(const std::string& dir) {
  const fs::path p = fs::path(dir) / kRunRecordName;
  if (!fs::exists(p)) return std::nullopt;
  const Json j = json_read_file(p.string());
  if (!j.is_object() || !j.contains("experts_without_tokens")) return std::nullopt;
  const Json& e = j["experts_without_tokens"];
  STRATA_CHECK(e.is_object(), p.string(), ": \"experts_without_tokens\" must be an object");
  std::map<int64_t, std::vector<int64_t>> out;
  for (const auto& [layer, list] : e.items()) {
    STRATA_CHECK(list.is_array(), p.string(), ": experts_without_tokens[\"", layer,
                 "\"] must be a list of expert indices");
    std::vector<int64_t>& v = out[std::stoll(layer)];
    for (const Json& x : list) {
      STRATA_CHECK(x.is_number_integer(), p.string(), ": experts_without_tokens[\"", layer,
                   "\"] must be a list of expert indices");
      v.push_back(x.get<int64_t>());
    }
  }
  return out;
}

std::vector<std::vector<int32_t>> load_tokens(const CompareJob& job, int64_t vocab) {
  std::vector<std::vector<int32_t>> seqs;
  if (!job.token_file.empty()) {
    seqs = read_token_file(job.token_file);
  } else {
    CalibOptions text = job.text;
    if (text.sources.empty()) text.sources.push_back({bundled_heldout_path(), text.default_count});
    std::string tok_dir;  // SRC's tokenizer, else QUANTIZED's (an export copies it)
    for (const std::string& d : {job.source_dir, job.quantized_dir}) {
      if (tok_dir.empty() && (fs::exists(fs::path(d) / "tokenizer.json") ||
                              fs::exists(fs::path(d) / "tiktoken.model")))
        tok_dir = d;
    }
    STRATA_CHECK(!tok_dir.empty(), job.source_dir,
                 ": no tokenizer (tokenizer.json or tiktoken.model) to read text with; give "
                 "token ids with --tokens FILE");
    const Tokenizer tok = Tokenizer::load(tok_dir);
    Calibration cal = load_calibration(text, tok);
    for (const CalibSourceReport& s : cal.report.sources)
      log_info("compare data: ", s.path, ": ", s.taken, " sequences of at most ", text.seq_len,
               " tokens from ", s.records, " records, ", s.tokens, " tokens");
    seqs = std::move(cal.sequences);
  }
  STRATA_CHECK(!seqs.empty(), "no token sequences to compare on");
  const std::string from = job.token_file.empty() ? "the text" : job.token_file;
  for (const auto& s : seqs) {
    for (int32_t id : s)
      STRATA_CHECK(id < vocab, from, ": token id ", id, " is outside the vocabulary (", vocab, ")");
  }
  return seqs;
}

// ---- measurements ------------------------------------------------------------------------------

// MoE routing of one layer's run: the router's name and chosen [tokens, k] (the GPU reports it a
// chunk of tokens at a time, in token order).
class RoutingRecorder final : public Observer {
 public:
  void observe(std::string_view, const float*, int64_t, int64_t) override {}
  void observe_routing(std::string_view router, const int32_t* chosen, int64_t tokens,
                       int64_t k) override {
    router_ = router;
    k_ = k;
    chosen_.insert(chosen_.end(), chosen, chosen + tokens * k);
  }
  bool routed() const { return k_ > 0; }
  const std::string& router() const { return router_; }
  int64_t k() const { return k_; }
  const std::vector<int32_t>& chosen() const { return chosen_; }

 private:
  std::string router_;
  int64_t k_ = 0;
  std::vector<int32_t> chosen_;
};

// |a - b| / |b| over n values, in double (0 when both are 0).
// The CPU forward's layers (model/forward.h).
class CpuCompareLayers final : public CompareLayers {
 public:
  CpuCompareLayers(const ModelForward& src, const ModelForward& q, const Batch& batch)
      : src_(src), q_(q), batch_(batch) {}
  void run(int64_t l, float* hs, float* local, float* hq, Observer* rs, Observer* rl,
           Observer* rq) override {
    src_.layer(l)->forward(batch_, hs, rs);
    std::unique_ptr<DecoderLayer> lq = q_.layer(l);
    lq->forward(batch_, local, rl);
    lq->forward(batch_, hq, rq);
  }

 private:
  const ModelForward &src_, &q_;
  const Batch& batch_;
};

double relative_error(const float* a, const float* b, int64_t n) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

// Mean over tokens of |experts chosen in a ∩ in b| / k.
double routing_agreement(const RoutingRecorder& a, const RoutingRecorder& b, int64_t tokens) {
  STRATA_ASSERT(a.k() == b.k() && a.router() == b.router(), "routing of two different layers");
  const int64_t k = a.k();
  if (tokens == 0) return 1.0;
  double sum = 0.0;
  for (int64_t t = 0; t < tokens; ++t) {
    int64_t common = 0;
    for (int64_t i = 0; i < k; ++i) {
      const int32_t e = a.chosen()[t * k + i];
      for (int64_t j = 0; j < k; ++j)
        common += b.chosen()[t * k + j] == e ? 1 : 0;
    }
    sum += static_cast<double>(common) / static_cast<double>(k);
  }
  return sum / static_cast<double>(tokens);
}

std::vector<int64_t> tokens_per_expert(const RoutingRecorder& r, int64_t experts) {
  std::vector<int64_t> n(static_cast<size_t>(experts), 0);
  for (int32_t e : r.chosen()) {
    STRATA_ASSERT(e >= 0 && e < experts, "routed to expert ", e, " of ", experts);
    ++n[static_cast<size_t>(e)];
  }
  return n;
}

// log-softmax of row[V] in double.
void log_softmax(const float* row, int64_t V, std::vector<double>& out) {
  double mx = -INFINITY;
  for (int64_t v = 0; v < V; ++v)
    mx = std::max(mx, static_cast<double>(row[v]));
  double sum = 0.0;
  for (int64_t v = 0; v < V; ++v)
    sum += std::exp(static_cast<double>(row[v]) - mx);
  const double lse = mx + std::log(sum);
  out.resize(static_cast<size_t>(V));
  for (int64_t v = 0; v < V; ++v)
    out[static_cast<size_t>(v)] = static_cast<double>(row[v]) - lse;
}

int64_t argmax(const float* row, int64_t V) {
  int64_t best = 0;
  for (int64_t v = 1; v < V; ++v)
    if (row[v] > row[best]) best = v;
  return best;
}

// Per-position measurements from both models' logits.
struct TokenStats {
  std::vector<double> kl;
  int64_t top1_same = 0;
  double nll_source = 0.0, nll_quantized = 0.0;
  int64_t predicted = 0;
};

// One position's measurements (measure_logits).
struct RowStats {
  double kl = 0.0, nll_source = 0.0, nll_quantized = 0.0;
  bool top1_same = false, predicted = false;
};

void measure_logits(const LogitsHead& head_s, const LogitsHead& head_q, int64_t H, int64_t V,
                    const Batch& batch, const std::vector<float>& hs, const std::vector<float>& hq,
                    TokenStats& out) {
  const int64_t T = batch.n_tokens();
  // Slices of tokens whose logits take about 256 MiB per model.
  const int64_t slice = std::max<int64_t>(1, (int64_t{64} << 20) / V);
  std::vector<float> ls, lq;
  // next[t]: the token after t in its sequence, -1 at a sequence's end.
  std::vector<int64_t> next(static_cast<size_t>(T), -1);
  for (int64_t s = 0; s < batch.n_seqs(); ++s) {
    for (int64_t t = batch.seq_offsets[s]; t + 1 < batch.seq_offsets[s + 1]; ++t)
      next[static_cast<size_t>(t)] = batch.tokens[static_cast<size_t>(t + 1)];
  }
  for (int64_t first = 0; first < T; first += slice) {
    const int64_t n = std::min(slice, T - first);
    ls.assign(static_cast<size_t>(n * V), 0.0f);
    lq.assign(static_cast<size_t>(n * V), 0.0f);
    head_s.logits(hs.data() + first * H, n, ls.data());
    head_q.logits(hq.data() + first * H, n, lq.data());
    // Each row on its own (three passes of V exponentials in double: 37 s for 4096 positions of
    // a 151936-token vocabulary on one thread), the rows on several threads; their results are
    // then summed in row order, so the numbers do not depend on the thread count.
    std::vector<RowStats> rows(static_cast<size_t>(n));
    parallel_chunks(static_cast<size_t>(n), startup_threads(), 1, [&](size_t begin, size_t end) {
      std::vector<double> ps, pq;
      for (size_t r = begin; r < end; ++r) {
        const float* rs = ls.data() + static_cast<int64_t>(r) * V;
        const float* rq = lq.data() + static_cast<int64_t>(r) * V;
        log_softmax(rs, V, ps);
        log_softmax(rq, V, pq);
        RowStats& o = rows[r];
        for (int64_t v = 0; v < V; ++v)
          o.kl += std::exp(ps[v]) * (ps[v] - pq[v]);
        o.top1_same = argmax(rs, V) == argmax(rq, V);
        const int64_t nx = next[static_cast<size_t>(first) + r];
        if (nx >= 0) {
          o.predicted = true;
          o.nll_source = -ps[static_cast<size_t>(nx)];
          o.nll_quantized = -pq[static_cast<size_t>(nx)];
        }
      }
    });
    for (const RowStats& o : rows) {
      out.kl.push_back(o.kl);
      out.top1_same += o.top1_same ? 1 : 0;
      if (o.predicted) {
        out.nll_source += o.nll_source;
        out.nll_quantized += o.nll_quantized;
        ++out.predicted;
      }
    }
  }
}

Json number_or_null(double v) {
  return std::isfinite(v) ? Json(v) : Json(nullptr);
}

}  // namespace

double quantile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const double pos = p * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

CompareResult run_compare(const CompareJob& job) {
  PhaseTimer phase;
  double t_start = 0, t_embed = 0, t_layers = 0, t_logits = 0;  // the closing time line
  check_dir(job.source_dir, "SRC");
  check_dir(job.quantized_dir, "QUANTIZED");
  const ModelConfig cs = read_model_config(job.source_dir);
  const ModelConfig cq = read_model_config(job.quantized_dir);
  check_same_architecture(cs, cq);
  const Checkpoint ks = Checkpoint::open(job.source_dir);
  const Checkpoint kq = Checkpoint::open(job.quantized_dir);

  CompareResult r;
  r.source_dir = job.source_dir;
  r.quantized_dir = job.quantized_dir;
  const ExportInfo info = read_export_info(job.quantized_dir);
  r.quant_algo = info.quant_algo;
  r.kv_cache_algo = info.kv_cache_algo;

  ForwardOptions os;
  os.bf16_between_layers = job.bf16_between_layers;
  ForwardOptions oq = os;
  oq.simulate_activations = job.simulate_activations;
  r.activations_simulated = job.simulate_activations && !info.quant_algo.empty();
  if (job.simulate_kv_cache && !info.kv_cache_algo.empty()) {
    if (info.kv_cache_algo == "FP8") {
      oq.kv_cache = ActQuant::Kind::kFp8;
    } else if (info.kv_cache_algo == "NVFP4") {
      oq.kv_cache = ActQuant::Kind::kNvfp4;
    } else {
      log_warn(job.quantized_dir, ": kv_cache_quant_algo '", info.kv_cache_algo,
               "' is not simulated (FP8 and NVFP4 are); the KV cache runs unquantized");
    }
    r.kv_cache_simulated = oq.kv_cache != ActQuant::Kind::kNone;
  }
  const std::unique_ptr<ModelForward> src = ModelForward::create(cs, ks, os);
  const std::unique_ptr<ModelForward> q = ModelForward::create(cq, kq, oq);

  const Batch batch = Batch::from_sequences(load_tokens(job, src->vocab_size()));
  const int64_t T = batch.n_tokens(), H = src->hidden_size(), L = src->num_layers();
  r.sequences = batch.n_seqs();
  r.tokens = T;
  log_info("compare: ", r.sequences, " sequences, ", T, " tokens, ", L, " layers");

  std::optional<std::map<int64_t, std::vector<int64_t>>> uncalibrated =
      read_uncalibrated(job.quantized_dir);
  std::unique_ptr<CompareLayers> layers;
  bool cuda = job.cuda;
  CompareGpuOptions g;
  g.max_gpu_memory_bytes = job.max_gpu_memory_bytes;
  g.gemm_bf16 = job.gemm_bf16;
  g.test_chunk_tokens = job.test_chunk_tokens;
  g.bf16_between_layers = job.bf16_between_layers;
  g.simulate_activations = oq.simulate_activations;
  g.kv_cache = oq.kv_cache;
  if (cuda) {
    if (std::string why = gpu_compare_unsupported(cs, ks, cq, kq, g); !why.empty()) {
      STRATA_CHECK(!job.device_explicit, "--device cuda: ", why, "; use --device cpu");
      log_warn("compare: the GPU forward cannot run this model (", why, "); running on the CPU");
      cuda = false;
    }
  }
  if (cuda) {
    layers = gpu_compare_layers(cs, ks, cq, kq, batch, g);
  } else {
    layers = std::make_unique<CpuCompareLayers>(*src, *q, batch);
  }
  r.device = cuda ? "cuda" : "cpu";

  std::vector<float> hs(static_cast<size_t>(T * H)), hq(hs.size()), local(hs.size());
  phase.lap(&t_start);
  src->embed(batch, hs.data());
  q->embed(batch, hq.data());
  phase.lap(&t_embed);
  Progress progress("compare", L, "layers", job.progress);
  for (int64_t l = 0; l < L; ++l) {
    local = hs;  // the source's input of layer l
    RoutingRecorder route_s, route_local, route_q;
    layers->run(l, hs.data(), local.data(), hq.data(), &route_s, &route_local, &route_q);
    LayerError e;
    e.index = l;
    e.rel_error = relative_error(local.data(), hs.data(), T * H);
    e.rel_error_end_to_end = relative_error(hq.data(), hs.data(), T * H);
    r.layers.push_back(e);
    std::string detail = str("layer ", l, ": rel_error ", format_double("%.3g", e.rel_error),
                             ", end to end ", format_double("%.3g", e.rel_error_end_to_end));
    if (route_s.routed()) {
      STRATA_CHECK(route_q.routed() && route_local.routed(), job.quantized_dir, ": layer ", l,
                   " is a MoE layer in SRC but not in QUANTIZED");
      ExpertStats x;
      x.layer = l;
      x.router = route_s.router();
      x.experts = cs.num_experts;
      x.top_k = route_s.k();
      x.tokens_source = tokens_per_expert(route_s, x.experts);
      x.tokens_quantized = tokens_per_expert(route_q, x.experts);
      x.routing_agreement = routing_agreement(route_s, route_q, T);
      x.routing_agreement_local = routing_agreement(route_s, route_local, T);
      if (uncalibrated) {
        auto it = uncalibrated->find(l);
        x.uncalibrated = it == uncalibrated->end() ? std::vector<int64_t>{} : it->second;
      }
      detail += str(", routing agreement ", format_double("%.3f", x.routing_agreement));
      r.experts.push_back(std::move(x));
    }
    progress.step(detail);
  }
  progress.finish();
  phase.lap(&t_layers);

  // The final norms and lm_heads: on the GPU when the layers ran there (their device memory
  // released first) and both heads fit the cap; else the CPU's.
  layers.reset();
  LogitsHeads heads;
  if (cuda) {
    heads = gpu_logits_heads(ks, src->head_spec(), kq, q->head_spec(), g);
    if (!heads.source)
      log_info(
          "compare: the logits run on the CPU (the two lm_heads do not fit "
          "--max_gpu_memory_gb together, or one is stored quantized)");
  }
  if (!heads.source) heads = {src->head(), q->head()};
  TokenStats ts;
  measure_logits(*heads.source, *heads.quantized, H, src->vocab_size(), batch, hs, hq, ts);
  phase.lap(&t_logits);
  log_info("compare: time ", format_double("%.2f", t_start + t_embed + t_layers + t_logits),
           " s = start-up (configs, headers, tokens, device) ", format_double("%.2f", t_start),
           " + embedding ", format_double("%.2f", t_embed), " + layers ",
           format_double("%.2f", t_layers), " + logits and KL ", format_double("%.2f", t_logits));
  r.positions = static_cast<int64_t>(ts.kl.size());
  r.predicted = ts.predicted;
  double sum = 0.0;
  for (double k : ts.kl)
    sum += k;
  r.mean_kl = sum / static_cast<double>(r.positions);
  r.median_kl = quantile(ts.kl, 0.5);
  r.p99_kl = quantile(ts.kl, 0.99);
  r.max_kl = *std::max_element(ts.kl.begin(), ts.kl.end());
  r.top1_agreement = static_cast<double>(ts.top1_same) / static_cast<double>(r.positions);
  const double n = static_cast<double>(ts.predicted);
  r.ppl_source = ts.predicted ? std::exp(ts.nll_source / n) : NAN;
  r.ppl_quantized = ts.predicted ? std::exp(ts.nll_quantized / n) : NAN;
  r.kl = std::move(ts.kl);
  return r;
}

Json compare_json(const CompareResult& r) {
  Json j = Json::object();
  j["source"] = r.source_dir;
  j["quantized"] = r.quantized_dir;
  j["quant_algo"] = r.quant_algo.empty() ? Json(nullptr) : Json(r.quant_algo);
  j["kv_cache_quant_algo"] = r.kv_cache_algo.empty() ? Json(nullptr) : Json(r.kv_cache_algo);
  j["activations_simulated"] = r.activations_simulated;
  j["kv_cache_simulated"] = r.kv_cache_simulated;
  j["device"] = r.device;
  j["sequences"] = r.sequences;
  j["tokens"] = r.tokens;
  j["positions"] = r.positions;
  j["predicted"] = r.predicted;
  j["mean_kl"] = number_or_null(r.mean_kl);
  j["median_kl"] = number_or_null(r.median_kl);
  j["p99_kl"] = number_or_null(r.p99_kl);
  j["max_kl"] = number_or_null(r.max_kl);
  j["top1_agreement"] = number_or_null(r.top1_agreement);
  j["ppl_source"] = number_or_null(r.ppl_source);
  j["ppl_quantized"] = number_or_null(r.ppl_quantized);
  Json layers = Json::array();
  for (const LayerError& e : r.layers) {
    Json l = Json::object();
    l["index"] = e.index;
    l["rel_error"] = number_or_null(e.rel_error);
    l["rel_error_end_to_end"] = number_or_null(e.rel_error_end_to_end);
    layers.push_back(l);
  }
  j["layers"] = layers;
  Json experts = Json::array();
  for (const ExpertStats& x : r.experts) {
    Json e = Json::object();
    e["layer"] = x.layer;
    e["router"] = x.router;
    e["experts"] = x.experts;
    e["top_k"] = x.top_k;
    e["tokens_source"] = x.tokens_source;
    e["tokens_quantized"] = x.tokens_quantized;
    e["routing_agreement"] = number_or_null(x.routing_agreement);
    e["routing_agreement_local"] = number_or_null(x.routing_agreement_local);
    e["uncalibrated"] = x.uncalibrated ? Json(*x.uncalibrated) : Json(nullptr);
    experts.push_back(e);
  }
  j["experts"] = experts;
  return j;
}

std::string compare_headline(const CompareResult& r) {
  std::ostringstream os;
  os << "KL divergence (source || quantized) per position\n";
  os << "  mean " << format_double("%.6g", r.mean_kl) << "  median "
     << format_double("%.6g", r.median_kl) << "  p99 " << format_double("%.6g", r.p99_kl)
     << "  max " << format_double("%.6g", r.max_kl) << "\n";
  os << "top-1 agreement " << format_double("%.4f", r.top1_agreement) << "\n";
  os << "perplexity  source " << format_double("%.4f", r.ppl_source) << "  quantized "
     << format_double("%.4f", r.ppl_quantized) << "\n";
  return os.str();
}

std::string compare_table(const CompareResult& r) {
  std::ostringstream os;
  os << "source     " << r.source_dir << "\n";
  os << "quantized  " << r.quantized_dir;
  if (r.quant_algo.empty()) {
    os << " (no hf_quant_config.json: run as is)\n";
  } else {
    os << " (" << r.quant_algo << ", KV cache "
       << (r.kv_cache_algo.empty() ? "unquantized" : r.kv_cache_algo) << ")\n";
  }
  os << "simulated  activations " << (r.activations_simulated ? "yes" : "no") << ", KV cache "
     << (r.kv_cache_simulated ? "yes" : "no") << "  (layers on " << r.device << ")\n";
  os << "sequences " << r.sequences << "  tokens " << r.tokens << "  positions " << r.positions
     << "  predicted " << r.predicted << "\n\n";
  os << compare_headline(r) << "\n";
  os << "layer   rel_error  end_to_end\n";
  for (const LayerError& e : r.layers)
    os << format_double("%5.0f", static_cast<double>(e.index)) << "  "
       << format_double("%10.4g", e.rel_error) << "  "
       << format_double("%10.4g", e.rel_error_end_to_end) << "\n";
  for (const ExpertStats& x : r.experts) {
    os << "\nMoE layer " << x.layer << " (" << x.router << "): " << x.experts << " experts, top-"
       << x.top_k << "; routing agreement " << format_double("%.4f", x.routing_agreement)
       << " (given the source's inputs " << format_double("%.4f", x.routing_agreement_local)
       << ")\n";
    os << "  tokens per expert, source/quantized:";
    for (int64_t e = 0; e < x.experts; ++e)
      os << (e % 8 == 0 ? "\n   " : "") << " " << e << ":" << x.tokens_source[e] << "/"
         << x.tokens_quantized[e];
    os << "\n";
    if (x.uncalibrated) {
      os << "  experts without calibration tokens:";
      if (x.uncalibrated->empty()) os << " none";
      for (int64_t e : *x.uncalibrated)
        os << " " << e;
      os << "\n";
    }
  }
  return os.str();
}

}  // namespace strata
