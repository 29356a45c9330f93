// Fused expert tensors on disk, served per expert (docs/SOURCES.md "Fused expert tensors").
//
// transformers 5 keeps a MoE layer's routed experts as two 3-D parameters, and checkpoints saved
// from it (or shipped that way) store them so:
//
//   X.gate_up_proj   [E, 2I, H]  expert e's gate_proj weight is rows [0, I) of [e], its up_proj
//                                weight rows [I, 2I) (gate and up in halves, not interleaved)
//   X.down_proj      [E, H, I]   expert e's down_proj weight is [e]
//
// with X = "<layer>.mlp.experts." (BF16, F16 or F32), and the MXFP4 form of the same layout:
// X.gate_up_proj_blocks U8 [E, 2I, H/32, 16] with X.gate_up_proj_scales U8 [E, 2I, H/32], and
// X.down_proj_blocks [E, H, I/32, 16] with X.down_proj_scales [E, H, I/32].
//
// Every per-expert weight is then a contiguous byte range of the fused tensor, so the checkpoint
// serves it as a view (io/checkpoint.h) under the name a per-expert checkpoint gives it:
// X.{e}.gate_proj.weight [I, H], X.{e}.up_proj.weight [I, H], X.{e}.down_proj.weight [H, I] (or
// .weight_blocks / .weight_scales). Reads, prefetch, expert parallelism and the export then see
// a per-expert checkpoint, read only the bytes they need, and write what a per-expert source
// gives; the fused names are no longer listed.
//
// gpt-oss (recognised by X.gate_up_proj_bias [E, 2I]) keeps gate and up interleaved in one
// projection, with biases, and in bf16 stores the weights transposed:
//
//   X.gate_up_proj   [E, H, 2I]  (x · W + b), X.gate_up_proj_bias [E, 2I]
//   X.down_proj      [E, I, H],               X.down_proj_bias    [E, H]
//   MXFP4: X.gate_up_proj_blocks [E, 2I, H/32, 16] + _scales [E, 2I, H/32] (rows = outputs),
//          X.down_proj_blocks    [E, H, I/32, 16]  + _scales [E, H, I/32]
//
// served as one module per expert and projection (docs/QUANTIZE.md "gpt-oss"):
// X.{e}.gate_up_proj.{weight [2I, H] (rows interleaved gate, up), bias [2I]} and
// X.{e}.down_proj.{weight [H, I], bias [H]} (MXFP4: .weight_blocks / .weight_scales, byte ranges).
// The bf16 weights are transposed views: each expert's [H, 2I] slice is contiguous on disk and
// tensor() returns its transpose, a copy of one expert at a time (io/checkpoint.h).
//
// A ModelOpt export of gpt-oss (docs/QUANTIZE.md "gpt-oss": X.P U8 [E, in/2, out] with
// X.P_weight_scale F8_E4M3 [E, in/16, out], or FP8 X.P F8_E4M3 [E, in, out] with a scalar
// X.P_weight_scale; scalar X.P_weight_scale_2 / X.P_input_scale shared by all experts) is served
// as a per-module export, so that `strata eval` reads it: X.{e}.P.weight and .weight_scale
// transposed views of [e], X.{e}.P.weight_scale_2 / .input_scale views of the shared scalars.
//
// A pair that does not have one of these layouts is left fused (the quantize plan refuses it,
// naming the layout it takes): a gate_up_proj without its down_proj, shapes that disagree, other
// dtypes.
#pragma once

namespace strata {

class Checkpoint;

// Adds the views of every fused expert pair in the standard layout and hides the fused names.
// A checkpoint that holds both a fused pair and per-expert tensors of the same experts is a
// strata::Error naming both.
void split_fused_experts(Checkpoint& ckpt);

}  // namespace strata
