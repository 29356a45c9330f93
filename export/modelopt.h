// The ModelOpt Hugging Face writer (spec/format.md is the contract).
//
// Per decoder layer, after calibration, write_layer() turns the layer's checkpoint tensors into
// output tensors and streams them to the shards:
//   quantized module M (NVFP4):  M.weight U8 [out, in/2], M.weight_scale F8_E4M3 [out, in/16],
//                                M.weight_scale_2 F32 [], M.input_scale F32 [] (W4A4 only)
//   quantized module M (FP8):    M.weight F8_E4M3 [out, in], M.weight_scale F32 [], M.input_scale
//   F32 [] quantized module M (MXFP8):  M.weight F8_E4M3 [out, in], M.weight_scale U8 [out, in/32]
//   FP8 KV cache:                <layer>.self_attn.k_proj.k_scale, <layer>.self_attn.v_proj.v_scale
//   fused experts (plan.fused_experts, gpt-oss; docs/QUANTIZE.md "gpt-oss"): per projection P =
//                                <p>.experts.{gate_up_proj,down_proj} of out x in per expert,
//                                NVFP4: P U8 [E, in/2, out], P_weight_scale F8_E4M3 [E, in/16,
//                                out], P_weight_scale_2 F32 [], P_input_scale F32 []; FP8: P
//                                F8_E4M3 [E, in, out], P_weight_scale F32 [], P_input_scale F32
//                                []; excluded: P [E, in, out] in the source dtype (bf16 when
//                                compressed); always P_bias [E, out] as in the source
//   compressed source module M, excluded (io/source_weights.h): M.weight BF16 [out, in], the
//                                decompressed weight; its packed tensors and scales are dropped
//   kept in fp32 by transformers: the same values as F32 (DeepSeek-V3's / GLM-4.5's router
//                                e_score_correction_bias; model/arch.h tensor_kept_in_fp32)
//   everything else:             unchanged bytes under the same name
// Scales: NVFP4 weight_scale_2 from the max weight amax of the module's weight group and input
// scales from the max activation amax of its input group (export/plan.h weight_group_key,
// input_group_key: the quantized modules of one format reading the same input, as ModelOpt 0.47
// fuses them; for routed experts all experts of the layer for that projection; an expert no
// token reached gets the shared scale); FP8 weight and input scales per module, except that a
// routed expert's gate/up share one weight scale and the experts of a layer one input scale.
// Every output tensor is known from the plan before any work (output_plan()): the shards are
// laid out up front and written in place (io/safetensors_writer.h, PlannedShardWriter), so a
// killed run resumes at a step boundary. Steps: 0 the head (every tensor outside the decoder
// layers: the embedding first, then the final norm, lm_head, vision tower, MTP layers ..., none of
// which needs calibration, so that they are written while the first layers are read), 1..num_layers
// the decoder layers.
// The index, config.json (quantization_config replaced), hf_quant_config.json and a copy of
// every other source file (tokenizer, generation_config.json, chat template, ...) are staged under
// hidden names while the layers run (stage_final_files()); finish() renames them into place.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "calib/max_calib.h"
#include "export/plan.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "io/safetensors_writer.h"
#include "quant/fp8.h"
#include "quant/mxfp8.h"
#include "quant/nvfp4.h"
#include "quant/quantized.h"

namespace strata {

// The run record a finished quantize run writes into its export (engine/resume.h). finish()
// never copies a file of this name from the source checkpoint.
inline constexpr const char* kRunRecordName = "strata_run.json";

struct ExportOptions {
  uint64_t max_shard_bytes = 5ull << 30;
  std::string producer_version;  // written as the producer's version
  // MXFP4 source weights given an NVFP4 format are converted in closed form (quant/mxfp4.h),
  // exactly, where the fused group allows it; else every format requantizes the decompressed
  // bf16 weight like any other source.
  bool exact_mxfp4 = false;
};

// Per-layer summary for the end-of-run report.
struct LayerReport {
  int64_t layer = -1;
  int64_t experts = 0;  // routed experts in the layer
  int64_t experts_without_tokens = 0;
  // Calibration tokens routed to each expert, by expert index (its gate or gate_up input's rows;
  // -1 for an index the layer's plan has no expert module for); empty for a layer read from a
  // resume manifest of an older strata, which kept only the count.
  std::vector<int64_t> expert_tokens;
  // The experts no calibration token reached, ascending (from expert_tokens).
  std::vector<int64_t> idle_experts() const {
    std::vector<int64_t> idle;
    for (size_t e = 0; e < expert_tokens.size(); ++e) {
      if (expert_tokens[e] == 0) idle.push_back(static_cast<int64_t>(e));
    }
    return idle;
  }
};

// The threads ModeloptExporter quantizes modules on, at most this many at once: the hardware's,
// at most 16.
size_t export_workers();

class ModeloptExporter {
 public:
  ModeloptExporter(const QuantPlan& plan, const ModelConfig& config, const Checkpoint& ckpt,
                   std::string out_dir, ExportOptions options);
  ~ModeloptExporter();

  int64_t steps() const { return plan_.num_layers + 1; }
  // Takes steps [0, next_step) as written by an earlier run of the same plan (see
  // PlannedShardWriter::resume).
  void resume(int64_t next_step);
  // Makes everything written so far durable; then publish() renames the complete shards.
  void sync() { writer_->sync(); }
  void start_writeback() { writer_->start_writeback(); }  // PlannedShardWriter's
  void publish() { writer_->publish(); }
  // Files of the output directory that hold the work synced so far.
  std::vector<std::string> vouched_files() const { return writer_->vouched_files(); }
  uint64_t bytes_written() const { return writer_->bytes_written(); }
  double write_seconds() const { return writer_->write_seconds(); }  // in pwrite, so far
  // In sync_file_range on the writer's flusher thread, so far.
  double writeback_seconds() const { return writer_->writeback_seconds(); }
  uint64_t output_bytes() const;  // of every planned tensor
  // About the space the finished export takes on a filesystem of `block`-byte blocks, from
  // above: the shards and index (PlannedShardWriter::disk_bytes), config.json and
  // hf_quant_config.json with room for every module's name, and the source files copied.
  uint64_t disk_bytes(uint64_t block) const;
  uint64_t source_bytes(int64_t step) const;  // of the checkpoint tensors step `step` reads
  void release_source(int64_t step) const;    // drops them from the resident set

  // The tensors outside the decoder layers (step 0): the embeddings, final norm, lm_head, vision
  // tower, MTP layers ...; a module among them is quantized weight-only or not at all (the plan
  // refuses an input scale outside the decoder layers).
  void write_head();
  // Every tensor of decoder layer `layer`, quantized per the plan with `calib`'s statistics.
  LayerReport write_layer(int64_t layer, const MaxCalibrator& calib,
                          const PrecomputedWeights* precomputed = nullptr);
  // The index, config.json, hf_quant_config.json and the sidecar files (tokenizer, generation
  // config ...), which depend only on the plan and the source: written and synced under hidden
  // temporary names (io/safetensors_writer.h StagedFiles), for finish() to rename into place.
  // The run calls it on a helper thread beside the first layers (rank 0 only); finish() calls it
  // if nobody did.
  void stage_final_files();
  // After the last layer: syncs and renames the shards, then the staged files. Returns the output
  // file names (shards, index, config files, sidecars). `step` (optional) is called after each
  // part with its name (the run's --gpu_profile times them).
  std::vector<std::string> finish(const std::function<void(const char*)>& step = {});

  // Ranks (docs/SCALEOUT.md): this writer writes only the tensors rank `rank` of `ranks` owns and
  // skips the others, which the other ranks write into the same shards. Within each step the
  // checkpoint tensors form units (a quantized module's whole fused group, so that its weight
  // amax is read by one rank; any other tensor alone), split into contiguous ranges of about
  // equal source bytes; k/v cache scales belong to rank 0. Rank 0 publishes shards and writes
  // the index and config files (finish()); the output bytes do not depend on the rank count.
  // `pinned` (optional) names the rank that must own a decoder layer's checkpoint tensor, or -1
  // when any may: with expert parallelism a routed expert is written by the rank that holds it
  // for the forward (and so read once). The other units are split as above.
  void set_ranks(int rank, int ranks,
                 const std::function<int(const std::string&)>& pinned = nullptr);
  // The rank that writes checkpoint tensor `name` (0 when single-process).
  int owner_of(const std::string& name) const;
  // The checkpoint tensors step `step` reads (0 the head, 1..num_layers the layers).
  const std::vector<std::string>& step_sources(int64_t step) const;
  // The embedding tables among the head's (what the calibration forward's embedding reads).
  const std::vector<std::string>& embedding_tensors() const { return embedding_tensors_; }

  // The exclude list (format.md §5) for this plan, summarised with prefix wildcards as ModelOpt
  // 0.47 summarises it ("model.layers.0*", "model.layers.1.self_attn*"), none of which covers a
  // quantized module under vLLM's matching (substring or fnmatch). Sorted.
  static std::vector<std::string> exclude_modules(const QuantPlan& plan);

 private:
  std::vector<TensorSpec> outputs_of(const std::vector<std::string>& names) const;
  std::vector<TensorSpec> kv_outputs(int64_t layer) const;
  void write_tensors(const std::vector<std::string>& names, const MaxCalibrator* calib);
  bool owns(const std::string& name) const;
  // A bf16/f16 tensor that transformers holds in fp32 (model/arch.h tensor_kept_in_fp32): written
  // as F32, as ModelOpt's export writes the model's state dict.
  bool upcast_to_f32(const std::string& name) const;
  void assign_owners(const std::vector<std::string>& names,
                     const std::function<int(const std::string&)>& pinned = nullptr);
  // The planned module whose source weight tensor `name` is (M.weight, M.weight_packed,
  // M.weight_blocks); nullptr for any other tensor.
  const PlannedModule* module_of(const std::string& name) const;
  // The decompressed (or viewed) source weight of a planned module.
  Tensor source_weight(const std::string& module) const;
  // The largest MXFP4 scale byte of m's fused group when the exact MXFP4 -> NVFP4 conversion
  // applies to the whole group; -1 when it does not.
  int exact_mxfp4_group_max(const PlannedModule& m);
  // A fused-experts plan's routed expert tensor (weight, MXFP4 blocks or scales, bias).
  struct FusedMember {
    std::string fused;  // "<p>.experts.gate_up_proj"
    int64_t expert = 0;
    bool bias = false;
  };
  std::optional<FusedMember> fused_member(const std::string& name) const;
  // The fused tensors written in place of expert 0's tensor of f's kind (see the top).
  std::vector<TensorSpec> fused_outputs(const FusedMember& f) const;
  std::vector<std::pair<std::string, Tensor>> fused_tensors(const FusedMember& f,
                                                            const MaxCalibrator* calib);
  // The output tensors of quantized module m, in write order. Thread-safe: write_tensors runs
  // several at once (the memos below are guarded by memo_mu_) and adds their outputs in order.
  std::vector<std::pair<std::string, Tensor>> quantize_module(const PlannedModule& m,
                                                              const MaxCalibrator* calib);

  const QuantPlan& plan_;
  const ModelConfig& config_;
  const Checkpoint& ckpt_;
  std::string out_dir_;
  ExportOptions options_;
  ArchInfo arch_;
  std::unique_ptr<PlannedShardWriter> writer_;
  std::unique_ptr<StagedFiles> staged_;  // stage_final_files()'s, published by finish()
  std::vector<TensorSpec> outputs_;      // every output tensor, in write order
  uint64_t output_bytes_ = 0;            // the sum of their bytes
  std::vector<size_t> step_end_;         // step s writes outputs_ [step_end_[s-1], step_end_[s])
  std::map<int64_t, std::vector<std::string>> layer_tensors_;           // layer -> checkpoint names
  std::map<int64_t, std::vector<const PlannedModule*>> layer_modules_;  // layer -> its modules
  // Fused experts: "<p>.experts.<proj>" -> its experts' modules, by expert index.
  std::map<std::string, std::vector<const PlannedModule*>> fused_experts_;
  // Per-layer memos, keyed by group (the key names the layer): each fused group's weight amax and
  // each input-scale group's activation amax are computed once, not once per member.
  std::map<std::string, float> group_weight_amax_, group_input_amax_;
  std::map<std::string, int> group_mxfp4_max_;
  std::mutex memo_mu_;
  const PrecomputedWeights* pre_ = nullptr;  // during write_layer
  std::vector<std::string> head_tensors_, embedding_tensors_;
  std::vector<std::string> written_;  // shard names after finish
  int rank_ = 0, ranks_ = 1;
  std::map<std::string, int> owner_;  // checkpoint tensor -> rank writing it (when ranks_ > 1)
};

}  // namespace strata
