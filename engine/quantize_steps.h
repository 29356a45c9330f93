// The pure steps of run_quantize (engine/quantize.cpp): inputs in, a value out, no files and no
// ranks touched; each is unit-tested (tests/engine/quantize_steps_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engine/quantize.h"
#include "engine/resume.h"
#include "io/checkpoint.h"

namespace strata {

// "12.00 MiB": binary units, two decimals (none for bytes).
std::string human_bytes(double b);

// Whether any module's format or the KV cache needs activation statistics (a calibration forward).
bool needs_activations(const QuantPlan& plan);

// Whether local_hessian weighs module m's search by its input statistics: its NVFP4 and W4A16
// NVFP4 weights under a local_hessian recipe, except gpt-oss's fused experts, whose search is the
// plain one as in ModelOpt 0.47 (its input hooks pair inputs with per-expert weight quantizers,
// which _QuantGptOssExperts does not have: one quantizer per projection).
bool local_hessian_tracks(const QuantPlan& plan, const PlannedModule& m);
// The modules of decoder layer `layer` that local_hessian_tracks.
std::set<std::string, std::less<>> local_hessian_modules(const QuantPlan& plan, int64_t layer);
// The GPU forward's device bytes for one layer's local_hessian statistics
// (ops::CudaBackendOptions::hessian_bytes), the most of layers [first_layer, num_layers): 16
// doubles per input feature of every tracked module (inputs several modules read are counted once
// each of them: a bound), a routed projection counted for all `experts` of its layer when any of
// them is tracked (the device keeps a layer's experts' statistics side by side). 0 unless
// local_hessian.
uint64_t local_hessian_device_bytes(const QuantPlan& plan, int64_t first_layer, int64_t experts);

// The resume folder: --resume_dir, or "<export_path>.strata_resume".
std::string resume_dir_of(const QuantizeJob& job);

// What a run reads first, by name alone (no plan yet): the embedding, the final norm and the
// lm_head ("embed_tokens.", "lm_head.", "model.norm."), and decoder layer 0 ("layers.0." at the
// start of a name or after a dot). For the page cache only: a name missed or taken costs no
// correctness.
std::vector<std::string> first_step_tensors(const Checkpoint& ckpt);

// Whether the routed experts of each layer are split over the ranks (docs/SCALEOUT.md "Expert
// parallel"): asked for, with ranks, a calibration forward (on the CPU, or on the GPU when
// strata has NCCL to exchange the rows: gpu_without_nccl false), and routed experts.
bool use_expert_parallel(bool asked, int ranks, bool calibrated, bool gpu_without_nccl,
                         int64_t experts);

// Consecutive sequences by index, batch_size (at least 1) at a time.
struct MicroBatches {
  std::vector<std::vector<std::vector<int32_t>>> groups;  // the sequences of each micro-batch
  std::vector<int64_t> tokens;                            // tokens of each micro-batch
  int64_t longest = 0;                                    // the longest sequence's tokens
};
MicroBatches group_micro_batches(const std::vector<std::vector<int32_t>>& sequences,
                                 int64_t batch_size);

// Fits `m` under --max_cpu_memory_gb (`cap`, 0: none): refuses a cap below the least the run
// needs (the store spilled; on the GPU path before the CUDA context is measured, without the
// context's allowance, which check_memory_cap then adds as measured); spills the activation
// store when it does not fit beside the rest, the allowance included (or exceeds `test_budget`,
// the hidden --test_activation_budget, when given).
MemoryEstimate fit_memory_cap(MemoryEstimate m, uint64_t cap, std::optional<uint64_t> test_budget);

// The GPU path's host memory, before the CUDA context exists (MemoryEstimate): the layer's codes
// from the device instead of its fp32 weights, two pinned layer blobs of `blob_bytes` and a
// one-micro-batch pinned stage, and kCudaContextAllowance for the context.
MemoryEstimate with_gpu_host_memory(MemoryEstimate m, uint64_t blob_bytes);

// Once the device placement exists (its CUDA context, its pinned buffers): `rss` the process's
// RSS measured then; `pinned` the placement's pinned layer blobs and stage, `pinned_hidden` the
// hidden states it keeps in pinned host memory (0 when on the device or in files). The context's
// host memory is what `rss` holds beyond the baseline and those buffers, plus
// kCudaLazyLoadingAllowance; the hidden states held are the pinned ones (the GPU path's store
// keeps none in memory).
MemoryEstimate with_measured_context(MemoryEstimate m, uint64_t rss, uint64_t pinned,
                                     uint64_t pinned_hidden);

// Refuses a run whose bound (m.total()) exceeds --max_cpu_memory_gb (`cap`, 0: none), `when`
// naming the moment ("once the exporter exists"); on the GPU path before the context is
// measured, without its allowance (as fit_memory_cap).
void check_memory_cap(const MemoryEstimate& m, uint64_t cap, const std::string& when);

// The fresh-or-resumed decision for a manifest read at `manifest` (`prev`, nullopt when none):
// the state to resume, nullopt for a fresh run; refuses a manifest of another job or of another
// step count.
std::optional<ResumeState> resumed_state(const std::optional<ResumeState>& prev,
                                         const std::map<std::string, std::string>& identity,
                                         int64_t steps, const std::string& manifest);

// "rank 0: 0-3, rank 1: 4-7": the routed experts each rank holds (expert_owner's ranges).
std::string expert_ranges(int64_t experts, int ranks);

// Where a run resumes, as logged: "layer K/N" or "the config files".
std::string resume_point(int64_t next_step, int64_t num_layers);

// The first decoder layer still to run: step s > 0 is layer s - 1, clamped to [0, num_layers].
int64_t first_layer_to_run(int64_t next_step, int64_t num_layers);

// A file holding the next layer's inputs, as the manifest names it: its file name when it lies
// in the resume folder, else its path.
std::string manifest_name(const std::string& path, const std::string& resume_dir);

// The micro-batch a rank runs in round k of a layer: with expert parallelism the ranks run in
// lockstep rounds (the MoE exchanges are collective), round k being micro-batch k*ranks + rank;
// else round k is micro-batch k. lockstep_rounds: the rounds that cover `batches`.
size_t lockstep_rounds(size_t batches, bool expert_parallel, int ranks);
size_t round_micro_batch(size_t k, bool expert_parallel, int ranks, int rank);

}  // namespace strata
