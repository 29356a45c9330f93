// strata eval: runs a checkpoint's forward over token-id sequences, layer by layer, and reports
// the mean negative log-likelihood of each next token and the perplexity.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "calib/dataset.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "io/safetensors_writer.h"
#include "model/forward.h"

namespace strata::cli {

int cmd_eval(const std::vector<std::string>& argv) {
  Args args(
      "eval",
      "Runs the model natively over token-id sequences (one JSON list of ints per line), one "
      "decoder\n"
      "layer at a time, and prints the mean negative log-likelihood of each next token and the\n"
      "perplexity. Hidden states are rounded to bf16 between layers, as the model runs in "
      "transformers.");
  args.option("--model,--pyt_ckpt_path", "DIR", "the Hugging Face checkpoint directory");
  args.option("--tokens", "FILE.jsonl", "token-id sequences, one JSON list per line");
  args.option("--dump-logits", "OUT.safetensors",
              "also write each sequence's logits as fp32 logits_<i> [len, vocab]");
  args.flag("--fp32", "keep hidden states in fp32 between layers instead of rounding to bf16");
  args.flag("--quiet,-q", "no progress, only warnings and errors");
  if (!args.parse(argv)) return 0;
  if (args.flag_set("--quiet")) log_set_level(LogLevel::kWarn);

  const std::string dir = args.get("--model");
  ModelConfig config = read_model_config(dir);
  Checkpoint ckpt = Checkpoint::open(dir);
  ForwardOptions options;
  options.bf16_between_layers = !args.flag_set("--fp32");
  auto fwd = ModelForward::create(config, ckpt, options);
  auto seqs = read_token_file(args.get("--tokens"));
  Batch batch = Batch::from_sequences(seqs);
  for (int32_t id : batch.tokens) {
    STRATA_CHECK(id < fwd->vocab_size(), args.get("--tokens"), ": token id ", id,
                 " is outside the vocabulary (", fwd->vocab_size(), ")");
  }

  const int64_t T = batch.n_tokens(), H = fwd->hidden_size(), V = fwd->vocab_size();
  std::vector<float> hidden(T * H);
  fwd->embed(batch, hidden.data());
  Progress progress("eval", fwd->num_layers(), "layers");
  for (int64_t l = 0; l < fwd->num_layers(); ++l) {
    fwd->layer(l)->forward(batch, hidden.data(), nullptr);
    progress.step();
  }
  progress.finish();
  std::vector<float> logits(T * V);
  fwd->logits(batch, hidden.data(), logits.data());

  double nll = 0.0;
  int64_t predicted = 0;
  for (int64_t s = 0; s < batch.n_seqs(); ++s) {
    for (int64_t t = batch.seq_offsets[s]; t + 1 < batch.seq_offsets[s + 1]; ++t) {
      const float* row = &logits[t * V];
      double mx = -INFINITY;
      for (int64_t v = 0; v < V; ++v)
        mx = std::max(mx, static_cast<double>(row[v]));
      double sum = 0.0;
      for (int64_t v = 0; v < V; ++v)
        sum += std::exp(row[v] - mx);
      nll += (std::log(sum) + mx) - row[batch.tokens[t + 1]];
      ++predicted;
    }
  }
  if (auto out = args.get_optional("--dump-logits")) {
    NamedTensors tensors;
    for (int64_t s = 0; s < batch.n_seqs(); ++s) {
      const int64_t b = batch.seq_offsets[s], len = batch.seq_offsets[s + 1] - b;
      Tensor t = Tensor::zeros(DType::kF32, {len, V});
      std::copy_n(&logits[b * V], len * V, t.mutable_data<float>());
      tensors.emplace_back("logits_" + std::to_string(s), std::move(t));
    }
    write_safetensors(*out, tensors);
  }
  std::printf("sequences %lld  tokens %lld  predicted %lld\n",
              static_cast<long long>(batch.n_seqs()), static_cast<long long>(T),
              static_cast<long long>(predicted));
  if (predicted == 0) {
    std::printf("mean_nll n/a  perplexity n/a (every sequence has one token)\n");
  } else {
    const double mean = nll / static_cast<double>(predicted);
    std::printf("mean_nll %.6f  perplexity %.4f\n", mean, std::exp(mean));
  }
  return 0;
}

}  // namespace strata::cli
