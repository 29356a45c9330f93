// strata compare: a source checkpoint against its quantized export (engine/compare.h,
// docs/COMPARE.md): KL divergence, top-1 agreement, perplexities, per-layer errors, MoE routing.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/device_flag.h"
#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/compare.h"
#include "engine/compare_report.h"
#include "io/safetensors_writer.h"

namespace strata::cli {

int cmd_compare(const std::vector<std::string>& argv) {
  Args args(
      "compare",
      "Runs SRC and its quantized export QUANTIZED side by side, one decoder layer at a time (on\n"
      "the GPU by default when there is one), the export as a server runs it (weights "
      "dequantized;\n"
      "each quantized linear's input quantized with the export's input scales, NVFP4 per-16 "
      "blocks\n"
      "under the static global scale or FP8 per tensor; the KV cache through the export's\n"
      "kv_cache_quant_algo with its k/v scales), and reports the KL divergence of the export's\n"
      "next-token distributions from the source's (mean, median, p99, max), top-1 agreement, both\n"
      "perplexities, each decoder layer's relative output error (given the source's inputs, and "
      "end\n"
      "to end) and, per MoE layer, the tokens routed to each expert and the routing agreement.\n"
      "Data: --tokens, --text, or by default the held-out slice of the bundled corpus\n"
      "(data/calib/heldout, never calibrated on).");
  args.positional("SRC", "the source Hugging Face checkpoint directory");
  args.positional(
      "QUANTIZED",
      "its quantized export (a ModelOpt checkpoint), or any checkpoint of the same architecture");
  args.option("--tokens", "FILE.jsonl",
              "token-id sequences, one JSON list per line, each used whole");
  args.option("--text", "FILE|DIR",
              "text (a file, a directory of *.txt, or JSONL with a text field) cut into "
              "--max_tokens windows "
              "by SRC's tokenizer; default: data/calib/heldout");
  args.option("--num_seqs", "N", "sequences taken from the text", "8");
  args.option("--max_tokens", "N", "tokens per text sequence at most, special tokens included",
              "512");
  args.option("--seed", "N", "seed of the text windows' sampling", "1234");
  args.option("--json", "FILE", "also write every number as JSON (docs/COMPARE.md)");
  args.option("--report", "DIR",
              "also write DIR/report.html, a self-contained page (plots embedded) with the "
              "numbers, the per-layer and per-MoE-layer tables and three plots, also written as "
              "DIR/*.png: each layer's relative error, a histogram of the per-position KL, and "
              "the tokens each expert received per MoE layer with the experts the calibration "
              "left without tokens marked (docs/COMPARE.md \"The report\")");
  args.flag("--no_act_sim",
            "do not quantize the linears' inputs (with --no_kv_sim: the weights' error alone)");
  args.flag("--no_kv_sim", "do not quantize the KV cache");
  args.flag("--fp32",
            "keep hidden states in fp32 between layers instead of rounding to bf16 (both models)");
  args.option("--device", "cpu|cuda",
              "where the decoder layers run: cuda reads each layer of both models into GPU "
              "memory and runs the comparison there, the same simulation bit for bit (default: "
              "cuda when strata was built with CUDA and a GPU is visible and the GPU forward runs "
              "the model, else cpu)");
  args.option("--max_gpu_memory_gb", "GB",
              "GPU memory in GiB the comparison may use (a layer of each model, and as many "
              "sequences at a time as fit beside them) (0: the GPU's free memory)",
              "0");
  args.option("--gpu_gemm", "bf16|fp32",
              "GEMM inputs of the GPU forward (fp32 accumulation either way); fp32 is closer to "
              "the CPU's fp32 forward",
              "bf16");
  args.hidden_option("--test_gpu_chunk_tokens", "N",
                     "the GPU comparison runs chunks of at most N tokens (one sequence when "
                     "longer), as a tight --max_gpu_memory_gb would make them");
  args.flag("--quiet,-q", "no progress, only warnings and errors");
  if (!args.parse(argv)) return 0;
  if (args.flag_set("--quiet")) log_set_level(LogLevel::kWarn);

  CompareJob job;
  job.source_dir = args.get("SRC");
  job.quantized_dir = args.get("QUANTIZED");
  const auto tokens = args.get_optional("--tokens");
  const auto text = args.get_optional("--text");
  STRATA_CHECK(!(tokens && text), "--tokens and --text: give one of them");
  if (tokens) job.token_file = *tokens;
  const int64_t num_seqs = args.get_int("--num_seqs"), max_tokens = args.get_int("--max_tokens");
  STRATA_CHECK(num_seqs >= 1, "--num_seqs must be at least 1, not ", num_seqs);
  STRATA_CHECK(max_tokens >= 2, "--max_tokens must be at least 2, not ", max_tokens);
  job.text.seq_len = max_tokens;
  job.text.default_count = num_seqs;
  job.text.seed = static_cast<uint64_t>(args.get_int("--seed"));
  if (text) job.text.sources.push_back({*text, num_seqs});
  job.simulate_activations = !args.flag_set("--no_act_sim");
  job.simulate_kv_cache = !args.flag_set("--no_kv_sim");
  job.bf16_between_layers = !args.flag_set("--fp32");
  job.progress = !args.flag_set("--quiet");
  const std::optional<bool> cuda = device_flag(args);
  job.device_explicit = cuda.has_value();
  job.cuda = cuda.value_or(cuda_usable());
  const double gpu_gb = args.get_double("--max_gpu_memory_gb");
  STRATA_CHECK(gpu_gb >= 0, "--max_gpu_memory_gb must not be negative");
  job.max_gpu_memory_bytes = static_cast<uint64_t>(gpu_gb * 1024.0 * 1024.0 * 1024.0);
  job.gemm_bf16 = args.choice("--gpu_gemm", "bf16|fp32") == 0;
  if (args.has("--test_gpu_chunk_tokens")) {
    job.test_chunk_tokens = args.get_int("--test_gpu_chunk_tokens");
    STRATA_CHECK(job.test_chunk_tokens > 0, "--test_gpu_chunk_tokens must be positive");
  }

  const auto report = args.get_optional("--report");
  if (report) prepare_report_dir(*report);  // a bad DIR fails before the comparison runs
  const CompareResult r = run_compare(job);
  if (auto out = args.get_optional("--json"))
    write_file_atomic(*out, compare_json(r).dump(2) + "\n");
  if (report) write_compare_report(r, *report);
  std::fputs(compare_table(r).c_str(), stdout);
  return 0;
}

}  // namespace strata::cli
