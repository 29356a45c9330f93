// strata compare: a source checkpoint against its ModelOpt export (docs/COMPARE.md).
//
//   CompareJob job;  job.source_dir = ...;  job.quantized_dir = ...;   // cli/compare.cpp fills it
//   CompareResult r = run_compare(job);
//   std::string table = compare_table(r);   Json j = compare_json(r);
//
// Both models run on the CPU forward (model/forward.h), or with CompareJob::cuda their decoder
// layers on the GPU forward (engine/compare_layers.h), one decoder layer of each resident at a
// time, over the same token sequences (one batch). The export runs as a server runs it: weights
// dequantized, and, unless switched off, every quantized linear's input fake-quantized with the
// export's input scale and the KV cache stored through the export's kv_cache_quant_algo with its
// k/v scales (ForwardOptions::simulate_activations, kv_cache). Per decoder layer l, with h_s(l)
// and h_q(l) the two models' inputs to layer l (the embeddings for l = 0) and S_l, Q_l the
// source's and the export's layer l:
//   rel_error(l)            = |Q_l(h_s(l)) - S_l(h_s(l))| / |S_l(h_s(l))|   the error the layer
//   adds rel_error_end_to_end(l) = |Q_l(h_q(l)) - S_l(h_s(l))| / |S_l(h_s(l))|   the error
//   accumulated
// (Frobenius norms over every token's hidden state, in double), so the export's layer runs twice.
// At every token position the next-token distributions p (source) and q (export) from the logits:
//   KL(p || q) = sum_v p_v (log p_v - log q_v)   (log-softmax in double)
// reported as mean, median, 99th percentile (linear interpolation between order statistics, as
// numpy.percentile) and max over the positions; top-1 agreement is the fraction of positions
// whose argmax (the lowest index among ties) agree; the perplexities are exp(mean NLL of the
// actual next token) over the positions that have one. MoE layers: tokens routed to each expert
// (every top-k slot counts), and routing agreement: the mean over tokens of |E_s ∩ E_q| / k, the
// experts chosen by the source and by the export, end to end and given the source's inputs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "calib/dataset.h"
#include "io/json.h"

namespace strata {

struct CompareJob {
  std::string source_dir, quantized_dir;
  // The token sequences: token_file (JSONL, one list of ids per line; every sequence as given),
  // or the text sources of `text` (calib/dataset.h: --text FILE, or the held-out corpus when
  // text.sources is empty) through the source's tokenizer.
  std::string token_file;
  CalibOptions text;
  bool simulate_activations = true;  // --no_act_sim turns it off
  bool simulate_kv_cache = true;     // --no_kv_sim
  bool bf16_between_layers = true;   // --fp32 turns it off (both models)
  bool progress = true;              // per-layer progress on stderr
  // --device: the decoder layers on the GPU (engine/compare_layers.h; docs/COMPARE.md "On the
  // GPU"); device_explicit: asked for, so a model the GPU forward cannot run is an error rather
  // than a fall back to the CPU. The embedding, the logits and the measurements stay on the host.
  bool cuda = false, device_explicit = false;
  uint64_t max_gpu_memory_bytes = 0;  // --max_gpu_memory_gb; 0: the device's free memory
  bool gemm_bf16 = true;              // --gpu_gemm bf16|fp32
  int64_t test_chunk_tokens = 0;      // --test_gpu_chunk_tokens (CompareGpuOptions)
};

struct LayerError {
  int64_t index = 0;
  double rel_error = 0.0;             // given the source's inputs: the error the layer adds
  double rel_error_end_to_end = 0.0;  // given the export's own inputs: accumulated
};

struct ExpertStats {
  int64_t layer = 0;
  std::string router;  // the router's module name
  int64_t experts = 0, top_k = 0;
  std::vector<int64_t> tokens_source, tokens_quantized;  // slots routed to each expert
  double routing_agreement = 0.0;                        // end to end
  double routing_agreement_local = 0.0;                  // given the source's inputs
  // Experts that saw no calibration token, as the export's run record (strata_run.json) lists
  // them; std::nullopt when the export does not say.
  std::optional<std::vector<int64_t>> uncalibrated;
};

struct CompareResult {
  std::string source_dir, quantized_dir;
  std::string quant_algo;     // hf_quant_config.json's, "" when QUANTIZED has none
  std::string kv_cache_algo;  // its kv_cache_quant_algo, "" when none
  bool activations_simulated = false, kv_cache_simulated = false;
  std::string device;  // where the decoder layers ran: "cpu" or "cuda"
  int64_t sequences = 0, tokens = 0;
  int64_t positions = 0;  // KL and top-1 are taken at every position
  int64_t predicted = 0;  // positions with a next token: the perplexities'
  double mean_kl = 0, median_kl = 0, p99_kl = 0, max_kl = 0;
  double top1_agreement = 0;
  double ppl_source = 0, ppl_quantized = 0;  // NaN when no position has a next token
  std::vector<double> kl;  // KL at each position, sequence by sequence (the report's histogram)
  std::vector<LayerError> layers;
  std::vector<ExpertStats> experts;  // one per MoE layer
};

// Throws strata::Error for bad input: a missing directory, SRC and QUANTIZED of different
// architectures (model_type, layers, hidden size, vocabulary, experts), token ids outside the
// vocabulary, no sequences.
CompareResult run_compare(const CompareJob& job);

// The result as JSON (docs/COMPARE.md lists the fields).
Json compare_json(const CompareResult& r);
// The human-readable report printed on stdout.
std::string compare_table(const CompareResult& r);
// Its headline: the lines of the KL divergence (mean, median, p99, max), the top-1 agreement and
// both perplexities (also `strata quantize --eval_data`'s summary).
std::string compare_headline(const CompareResult& r);

// The p-quantile (p in [0, 1]) of `v` with linear interpolation between order statistics
// (numpy.percentile's default); NaN for an empty `v`.
double quantile(std::vector<double> v, double p);

}  // namespace strata
