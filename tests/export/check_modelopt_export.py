#!/usr/bin/env python3
"""Independent checker of a strata ModelOpt-format export against the consumer contract.

    python3 tests/export/check_modelopt_export.py SRC_DIR OUT_DIR [--amax REF.safetensors]
    python3 tests/export/check_modelopt_export.py --self-test

SRC_DIR is the Hugging Face checkpoint that was quantized, OUT_DIR strata's export of it. The
rules come from /work/shared/spec/format.md (the output contract) and from the consumers it
cites (vLLM's ModelOpt loader, ModelOpt's unified HF export, the safetensors library); see
tests/export/README.md. Prints one line per violation and a final `N passed, M failed`; exit
status 1 when anything failed.

Written without reading strata's exporter. Needs only numpy: safetensors files are parsed here
with struct + json, and the number formats (bf16, float8_e4m3fn, e2m1, e8m0) are implemented
with integer/float arithmetic in numpy, so neither `safetensors` nor `ml_dtypes` is required.
--self-test also checks those numerics against tests/quant/fixtures/quant_vectors.bin (the
ml_dtypes/PyTorch-derived reference vectors) and then proves that the checker fails on a list of
broken exports it builds itself.
"""

import argparse
import fnmatch
import json
import os
import re
import shutil
import struct
import sys
import tempfile

import numpy as np

F32 = np.float32
# ModelOpt divides CUDA tensors by Python floats, which the GPU evaluates as x * fl32(1/c).
INV_2688 = F32(1.0) / F32(2688.0)
INV_448 = F32(1.0) / F32(448.0)

# ------------------------------------------------------------------------------------ safetensors

ST_DTYPES = {  # name -> (numpy dtype used to view the bytes, element size)
    "BOOL": (np.uint8, 1), "U8": (np.uint8, 1), "I8": (np.int8, 1),
    "F8_E4M3": (np.uint8, 1), "F8_E5M2": (np.uint8, 1), "F8_E8M0": (np.uint8, 1),
    "I16": (np.int16, 2), "U16": (np.uint16, 2), "F16": (np.float16, 2), "BF16": (np.uint16, 2),
    "I32": (np.int32, 4), "U32": (np.uint32, 4), "F32": (np.float32, 4),
    "I64": (np.int64, 8), "U64": (np.uint64, 8), "F64": (np.float64, 8),
}
FLOAT_DTYPES = ("BF16", "F16", "F32", "F64")


def _no_dup_pairs(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError(f"duplicate key {k!r}")
        d[k] = v
    return d


class SafeFile:
    """One safetensors file, parsed by hand. `problems` lists what the reference library rejects."""

    def __init__(self, path):
        self.path = path
        self.problems = []
        self.tensors = {}  # name -> (dtype, shape, begin, end), in header order
        self.metadata = None
        self.data = np.zeros(0, np.uint8)
        self.data_start = 0
        size = os.path.getsize(path)
        if size < 8:
            self.problems.append("file shorter than 8 bytes")
            return
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size - 8:
                self.problems.append(f"header length {n} exceeds file size {size}")
                return
            raw = f.read(n)
        try:
            text = raw.decode("utf-8")
            if not text.startswith("{"):
                raise ValueError("header does not start with '{'")
            header = json.loads(text, object_pairs_hook=_no_dup_pairs)
            if not isinstance(header, dict):
                raise ValueError("header is not a JSON object")
        except (UnicodeDecodeError, ValueError) as e:
            self.problems.append(f"invalid header JSON: {e}")
            return
        self.data_start = 8 + n
        if size > self.data_start:
            self.data = np.memmap(path, dtype=np.uint8, mode="r", offset=self.data_start)
        data_len = size - self.data_start
        meta = header.pop("__metadata__", None)
        if meta is not None and not (isinstance(meta, dict)
                                     and all(isinstance(v, str) for v in meta.values())):
            self.problems.append("__metadata__ is not a string-to-string map")
        self.metadata = meta
        spans = []
        for name, info in header.items():
            try:
                dtype, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
                if dtype not in ST_DTYPES:
                    raise ValueError(f"unknown dtype {dtype}")
                if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
                    raise ValueError(f"bad shape {shape}")
                if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)
                        and 0 <= offs[0] <= offs[1]):
                    raise ValueError(f"bad data_offsets {offs}")
                nbytes = int(np.prod(shape, dtype=np.int64)) * ST_DTYPES[dtype][1]
                if offs[1] - offs[0] != nbytes:
                    raise ValueError(f"data_offsets span {offs[1] - offs[0]} bytes, shape/dtype need {nbytes}")
                if offs[1] > data_len:
                    raise ValueError(f"data_offsets end {offs[1]} beyond the data ({data_len} bytes)")
            except (KeyError, TypeError, ValueError) as e:
                self.problems.append(f"tensor {name}: {e}")
                continue
            self.tensors[name] = (dtype, tuple(shape), offs[0], offs[1])
            spans.append((offs[0], offs[1], name))
        # The library requires the data to be exactly covered: sorted by offset, no gaps, no overlap.
        spans.sort()
        pos = 0
        for b, e, name in spans:
            if b != pos:
                self.problems.append(f"tensor {name} starts at {b}, expected {pos} "
                                     f"({'gap' if b > pos else 'overlap'})")
            pos = max(pos, e)
        if pos != data_len:
            self.problems.append(f"data section is {data_len} bytes, tensors cover {pos}")
        if [s[2] for s in spans] != list(self.tensors):
            # Not a library error, but the header's order should follow the data.
            pass

    def raw(self, name):
        dtype, shape, b, e = self.tensors[name]
        return bytes(self.data[b:e])

    def array(self, name):
        dtype, shape, b, e = self.tensors[name]
        npdt = ST_DTYPES[dtype][0]
        return np.frombuffer(self.raw(name), dtype=npdt).reshape(shape)


# ------------------------------------------------------------------------------ number formats

def bf16_bits_to_f32(u16):
    return (np.asarray(u16, np.uint32) << 16).view(np.float32)


def round_bf16(x):
    """fp32 -> nearest bf16 (ties to even), returned as fp32."""
    x = np.asarray(x, np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    out = (r & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), x, out).astype(np.float32)


def round_to(x, kind):
    if kind == "bf16":
        return round_bf16(x)
    if kind == "f16":
        return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)
    return np.asarray(x, np.float32)


def _e4m3_table():
    t = np.zeros(256, np.float32)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            v = np.nan
        elif e == 0:
            v = m * 2.0 ** -9
        else:
            v = (1 + m / 8.0) * 2.0 ** (e - 7)
        t[b] = -v if s else v
    return t


E4M3_TABLE = _e4m3_table()


def e4m3_encode(x):
    """fp32 -> float8_e4m3fn bytes, round to nearest even, no saturation (> 464 or inf -> NaN 0x7F)."""
    x = np.asarray(x, np.float32)
    sign = np.signbit(x).astype(np.uint8) << 7
    a = np.abs(x).astype(np.float64)
    finite = np.isfinite(a)
    a = np.where(finite, a, 0.0)
    _, e = np.frexp(a)
    ex = np.maximum(e - 1, -6)                    # floor(log2 a), at least the min normal exponent
    q = np.ldexp(1.0, ex - 3)                     # spacing of e4m3 values in that binade
    v = np.rint(a / q) * q                        # exact: a / q scales by a power of two
    _, e2 = np.frexp(v)
    ex2 = e2 - 1
    sub = v < 2.0 ** -6
    mant_sub = np.rint(v / 2.0 ** -9)
    mant_norm = np.rint((np.ldexp(v, -np.where(sub, 0, ex2)) - 1.0) * 8.0)
    code = np.where(sub, mant_sub, (ex2 + 7) * 8 + mant_norm)
    code = np.where((v > 448.0) | ~finite, 0x7F, code).astype(np.uint8)
    return code | sign


def e2m1_codes(x):
    """fp32 -> 4-bit e2m1 codes (format.md §1.5): RNE on {0,.5,1,1.5,2,3,4,6}, sign in bit 3."""
    ax = np.abs(x)
    c = ((ax > 0.25).astype(np.uint8) + (ax >= 0.75) + (ax > 1.25) + (ax >= 1.75)
         + (ax > 2.5) + (ax >= 3.5) + (ax > 5.0)).astype(np.uint8)
    c = np.where(np.isnan(x), 7, c).astype(np.uint8)
    return c | ((x < 0).astype(np.uint8) << 3)


def nvfp4_quantize(w32, g, bs=16, sb=None):
    """Expected (packed U8 [out,in/2], block scale bytes [out,in/bs]) given weight_scale_2 g; bs 32
    is ModelOpt's nvfp4_bs32 (the same arithmetic on blocks of 32); with `sb` (block scale bytes
    [out,in/bs], e.g. searched ones) the codes under those scales."""
    g = F32(g)
    out, inn = w32.shape
    blocks = w32.reshape(out, inn // bs, bs)
    with np.errstate(all="ignore"):
        if sb is None:
            a_b = np.abs(blocks).max(axis=-1).astype(F32)
            s = (a_b / F32(F32(6.0) * g)).astype(F32)
            s = np.where(s == 0, F32(1.0), s)
            s = np.clip(s, F32(2.0 ** -9), F32(448.0)).astype(F32)
            sb = e4m3_encode(s)
        else:
            sb = sb.reshape(out, inn // bs)
        desc = (E4M3_TABLE[sb] * g).astype(F32)
        x = (blocks / desc[..., None]).astype(F32)
    codes = e2m1_codes(x).reshape(out, inn)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed, sb.reshape(out, inn // bs)


def mxfp4_quantize(w32):
    """Expected (packed U8 [out,in/2], E8M0 scale bytes [out,in/32]) of ModelOpt 0.47's MXFP4
    weight export (MXFP4QTensor.quantize): per 32-block e = max(ceil(log2(amax / 6)), -127),
    x = w / 2^e, code = the number of {.25, .75, 1.25, 1.75, 2.5, 3.5, 5} strictly below |x|
    (ties round down, unlike NVFP4), sign bit set unless x > 0 (a zero is 0x8)."""
    out, inn = w32.shape
    blocks = w32.reshape(out, inn // 32, 32)
    d = (np.abs(blocks).max(axis=-1) / F32(6.0)).astype(F32)
    mant, ex = np.frexp(d)
    ceil_log2 = np.where(mant == 0.5, ex - 1, ex)
    e = np.maximum(np.where(d > 0, ceil_log2, -127), -127).astype(np.int32)
    x = np.ldexp(blocks, -e[..., None]).astype(F32)
    ax = np.abs(x)
    c = sum((ax > F32(t)).astype(np.uint8) for t in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0))
    codes = (c.astype(np.uint8) | ((~(x > 0)).astype(np.uint8) << 3)).reshape(out, inn)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed, (e + 127).astype(np.uint8)


def fp8_quantize(w32, scale, kind):
    """Expected F8_E4M3 bytes given weight_scale (format.md §2: bf16 double rounding)."""
    divisor = round_to(np.array([scale], F32), kind)[0]
    with np.errstate(all="ignore"):
        q = round_to((w32 / divisor).astype(F32), kind)
    q = np.clip(q, F32(-448.0), F32(448.0))
    return e4m3_encode(q)


def mxfp8_quantize(w32):
    """Expected (F8_E4M3 bytes [out,in], E8M0 scale bytes [out,in/32]) (format.md §7)."""
    out, inn = w32.shape
    blocks = w32.reshape(out, inn // 32, 32)
    d = (np.abs(blocks).max(axis=-1) * INV_448).astype(F32)
    mant, ex = np.frexp(d)
    ceil_log2 = np.where(mant == 0.5, ex - 1, ex)
    e = np.clip(np.where(d > 0, ceil_log2, -127), -127, 127).astype(np.int32)
    q = np.clip(np.ldexp(blocks, -e[..., None]).astype(F32), F32(-448.0), F32(448.0))
    return e4m3_encode(q).reshape(out, inn), (e + 127).astype(np.uint8)


# ------------------------------------------------------------------------ compressed sources
# Decompression of the source layouts of format.md §8 (io/source_weights.h documents the same
# layouts): each value is one fp32 product of the decoded operands, rounded once more to bf16
# (nearest even), as DeepSeek's fp8_cast_bf16 and compressed-tensors write a bf16 checkpoint.

E2M1_VALUES = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def float_array(dtype, a):
    return bf16_bits_to_f32(a) if dtype == "BF16" else np.asarray(a).astype(F32)


def decompress_fp8_block(w8, scale_inv, block=128):
    """W[r, c] = e4m3(W8[r, c]) * S[r // 128, c // 128], fp32 product, then bf16."""
    s = np.repeat(np.repeat(scale_inv.astype(F32), block, axis=0), block, axis=1)
    s = s[: w8.shape[0], : w8.shape[1]]
    with np.errstate(all="ignore"):
        return round_bf16((E4M3_TABLE[w8] * s).astype(F32))


def decompress_int4_pack(packed, scale, out, inn, group):
    """compressed-tensors pack-quantized: nibble c % 8 of int32 word c // 8 (lowest first),
    value nibble - 8, times scale[r, c // group]; fp32 product, then bf16."""
    words = packed.astype(np.int64) & 0xFFFFFFFF
    nib = (words[:, :, None] >> (4 * np.arange(8))) & 0xF  # [out, ncols, 8]
    q = nib.reshape(out, -1)[:, :inn].astype(F32) - F32(8)
    s = np.repeat(scale, group, axis=1)[:, :inn]
    return round_bf16((q * s).astype(F32))


def decompress_mxfp4(blocks, scales):
    """gpt-oss MXFP4: byte j of a 16-byte block holds elements 2j (low nibble), 2j+1 (high);
    value e2m1(code) * 2^(scale - 127); fp32 product, then bf16."""
    out, groups, _ = blocks.shape
    codes = np.empty((out, groups, 32), np.uint8)
    codes[..., 0::2] = blocks & 0xF
    codes[..., 1::2] = blocks >> 4
    p2 = np.ldexp(F32(1), scales.astype(np.int32) - 127).astype(F32)  # 0xFF never written
    with np.errstate(all="ignore"):
        v = (E2M1_VALUES[codes] * p2[..., None]).astype(F32)
    return round_bf16(v.reshape(out, groups * 32))


def bf16_bytes(x32):
    """bf16 values held in fp32 -> their BF16 bytes."""
    return (np.asarray(x32, F32).view(np.uint32) >> 16).astype(np.uint16).tobytes()


# ------------------------------------------------------------------------------------ checkpoint

def load_dir_tensors(d, prefer_index=True):
    """name -> SafeFile for the weight files of a checkpoint directory (not the sidecars)."""
    idx = os.path.join(d, "model.safetensors.index.json")
    files = []
    if prefer_index and os.path.exists(idx):
        try:
            files = sorted(set(json.load(open(idx))["weight_map"].values()))
        except (ValueError, KeyError):
            files = []
    if not files and os.path.exists(os.path.join(d, "model.safetensors")):
        files = ["model.safetensors"]
    if not files:
        files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    out = {}
    for f in files:
        p = os.path.join(d, f)
        if os.path.exists(p):
            sf = SafeFile(p)
            for n in sf.tensors:
                out[n] = sf
    return out


WEIGHT_EXT = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack")
EXPERT_RE = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)$")
GATE_UP = {"gate_proj": "gate", "up_proj": "up", "w1": "gate", "w3": "up",
           "down_proj": "down", "w2": "down"}
FUSED_SIBLINGS = [  # (members, vLLM fused name)
    (("q_proj", "k_proj", "v_proj"), "qkv_proj"),
    (("gate_proj", "up_proj"), "gate_up_proj"),
    (("w1", "w3"), "w13"),
    (("q_a_proj", "kv_a_proj_with_mqa"), "fused_qkv_a_proj"),
    # Qwen3.5's Gated DeltaNet (vLLM qwen3_5.py's stacked_params_mapping).
    (("in_proj_qkv", "in_proj_z"), "in_proj_qkvz"),
    (("in_proj_b", "in_proj_a"), "in_proj_ba"),
]


# The attention projections that read an attention block's input (Llama q/k/v, MLA with or
# without q LoRA, Kimi-Linear KDA's gates and beta).
ATTENTION_INPUT = ("q_proj", "k_proj", "v_proj", "q_a_proj", "kv_a_proj_with_mqa", "f_a_proj",
                   "g_a_proj", "b_proj")
# DeepSeek-V3.2's lightning indexer (<attention>.indexer.*) projections of that same input.
INDEXER_ATTENTION_INPUT = ("wk", "weights_proj")


# A vision tower or projector under any wrapper prefix of at most 4 components (format.md §6).
VISION_RE = re.compile(r"^(?:[A-Za-z_]\w*\.){0,4}(?:vision_tower|visual|vision_model|"
                       r"multi_modal_projector|mm_projector)\.")


def is_tower(name):
    return VISION_RE.match(name) is not None


def is_embedding(module):
    leaf = module.rsplit(".", 1)[-1]
    return "embed" in leaf or leaf in ("wte", "wpe")


class Source:
    """The source checkpoint's linear modules and their fp32 weights."""

    def __init__(self, d):
        self.dir = d
        self.tensors = load_dir_tensors(d)
        self.modules = {}  # module -> (getter, shape, kind)
        self.replaced = {}  # source tensor name -> modules it feeds (when it is not kept as is)
        self.compressed = {}  # module -> (layout, the source tensors it is stored in)
        # gpt-oss (transformers' GptOssExperts, as stored): "<p>.experts." -> {projection: (kind,
        # the source tensors of its weight)}, the weight [E, in, out] in bf16/f16/f32 (x @ W + b)
        # or MXFP4 blocks [E, out, in/32, 16] with scales [E, out, in/32]; biases [E, out].
        self.gptoss = {}
        for name in self.tensors:
            if name.endswith("experts.gate_up_proj_bias"):
                x = name[: -len("gate_up_proj_bias")]
                self.gptoss[x] = {}
                for p in ("gate_up_proj", "down_proj"):
                    if (x + p) in self.tensors:
                        dt = self.tensors[x + p].tensors[x + p][0]
                        self.gptoss[x][p] = ({"BF16": "bf16", "F16": "f16"}.get(dt, "f32"), [x + p])
                    elif (x + p + "_blocks") in self.tensors:
                        self.gptoss[x][p] = ("mxfp4", [x + p + "_blocks", x + p + "_scales"])
                for p, (_, stored) in self.gptoss[x].items():
                    for n in stored:
                        self.replaced[n] = []
        for name, sf in self.tensors.items():
            if name in self.replaced:
                continue
            dtype, shape = sf.tensors[name][:2]
            if name.endswith(".weight") and len(shape) == 2 and not is_embedding(name[:-7]):
                m = name[:-7]
                if dtype in FLOAT_DTYPES:
                    kind = {"BF16": "bf16", "F16": "f16"}.get(dtype, "f32")
                    self.modules[m] = (lambda n=name, s=sf: self._float(s, n), shape, kind)
                elif dtype == "F8_E4M3" and (m + ".weight_scale_inv") in self.tensors:
                    self.modules[m] = (lambda m=m: self._fp8_block(m), shape, "bf16")
                    self.compressed[m] = ("fp8_block", [name, m + ".weight_scale_inv"])
            elif name.endswith(".weight_packed") and len(shape) == 2:
                m = name[: -len(".weight_packed")]
                ws = self.tensors.get(m + ".weight_shape")
                if ws is not None:
                    out_in = tuple(int(v) for v in ws.array(m + ".weight_shape").reshape(-1))
                    self.modules[m] = (lambda m=m, oi=out_in: self._int4(m, oi), out_in, "bf16")
                    self.compressed[m] = ("int4_pack", [name, m + ".weight_scale", m + ".weight_shape"])
            elif name.endswith(".weight_blocks") and len(shape) == 3 and shape[2] == 16:
                m = name[: -len(".weight_blocks")]
                if (m + ".weight_scales") in self.tensors:
                    self.modules[m] = (lambda m=m: self._mxfp4(m), (shape[0], shape[1] * 32), "bf16")
                    self.compressed[m] = ("mxfp4", [name, m + ".weight_scales"])
            elif (name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj")) \
                    and len(shape) == 3 and dtype in FLOAT_DTYPES:
                prefix, leaf = name.rsplit(".", 1)
                kind = {"BF16": "bf16", "F16": "f16"}.get(dtype, "f32")
                E = shape[0]
                feeds = []
                for e in range(E):
                    if leaf == "gate_up_proj":
                        half = shape[1] // 2
                        for j, part in enumerate(("gate_proj", "up_proj")):
                            m = f"{prefix}.{e}.{part}"
                            self.modules[m] = (lambda n=name, s=sf, e=e, j=j, h=half:
                                               self._float(s, n)[e, j * h:(j + 1) * h],
                                               (half, shape[2]), kind)
                            feeds.append(m)
                    else:
                        m = f"{prefix}.{e}.down_proj"
                        self.modules[m] = (lambda n=name, s=sf, e=e: self._float(s, n)[e],
                                           (shape[1], shape[2]), kind)
                        feeds.append(m)
                self.replaced[name] = feeds
        self._cache = {}

    def _float(self, sf, name):
        key = (sf.path, name)
        if key not in self._cache:
            dtype = sf.tensors[name][0]
            a = sf.array(name)
            if dtype == "BF16":
                a = bf16_bits_to_f32(a)
            self._cache = {key: a.astype(F32)}  # keep one array: sources may be large
        return self._cache[key]

    def _arr(self, name):
        sf = self.tensors[name]
        return sf.tensors[name][0], sf.array(name)

    def _fp8_block(self, m):
        """DeepSeek FP8 source (format.md §8), decompressed to bf16 values."""
        _, w8 = self._arr(m + ".weight")
        dt, s = self._arr(m + ".weight_scale_inv")
        return decompress_fp8_block(w8, float_array(dt, s))

    def _int4(self, m, out_in):
        """compressed-tensors pack-quantized INT4 (format.md §8), decompressed to bf16 values."""
        _, p = self._arr(m + ".weight_packed")
        dt, s = self._arr(m + ".weight_scale")
        out, inn = out_in
        group = inn // s.shape[1] if inn % s.shape[1] == 0 else 32
        return decompress_int4_pack(p, float_array(dt, s), out, inn, group)

    def _mxfp4(self, m):
        """MXFP4 blocks (gpt-oss layout), decompressed to bf16 values."""
        _, b = self._arr(m + ".weight_blocks")
        _, sc = self._arr(m + ".weight_scales")
        return decompress_mxfp4(b, sc)

    def weight(self, m):
        getter = self.modules[m][0]
        return None if getter is None else getter()

    def gptoss_weight(self, x, p):
        """gpt-oss projection p of <x> as fp32 [E, out, in] (the blocks run along `in`)."""
        kind, stored = self.gptoss[x][p]
        if kind == "mxfp4":
            _, b = self._arr(stored[0])
            _, sc = self._arr(stored[1])
            return np.stack([decompress_mxfp4(b[e], sc[e]) for e in range(b.shape[0])])
        dt, a = self._arr(stored[0])
        return np.ascontiguousarray(float_array(dt, a).transpose(0, 2, 1))


# ------------------------------------------------------------------------------- exclusion rules

def vllm_expand(patterns):
    """ModelOptQuantConfigBase.apply_vllm_mapper: `x*` (no dot before *) becomes `x` and `x.*`."""
    out = []
    for p in patterns:
        if len(p) >= 2 and p[-1] == "*" and p[-2] != ".":
            out += [p[:-1], p[:-1] + ".*"]
        else:
            out.append(p)
    return out


def vllm_excluded(prefix, shards, patterns):
    """vLLM ModelOptQuantConfigBase.is_layer_excluded for a vLLM layer prefix.

    The rule, learned from vLLM's modelopt.py and quant_utils.is_layer_skipped:
      1. exact: a fused layer (qkv_proj, gate_up_proj, fused_qkv_a_proj) is skipped when every
         shard's unfused name is listed exactly; some-but-not-all raises at load time. A prefix
         containing "experts" is skipped when it is a substring of a listed name containing
         "experts". Anything else: exact membership.
      2. substring: any listed string (other than the prefix itself) occurring inside the prefix
         (also after stripping a leading "language_model.").
      3. fnmatch wildcards against the prefix.
    Returns (excluded, error message or None).
    """
    if not patterns:
        return False, None
    err = None
    if shards:
        st = [s in patterns for s in shards]
        if any(st) and not all(st):
            err = f"vLLM raises 'Detected some but not all shards of {prefix} are quantized'"
        skipped = all(st)
    elif "experts" in prefix:
        skipped = any(prefix in p for p in patterns if "experts" in p)
    else:
        skipped = prefix in patterns
    if skipped:
        return True, err
    stripped = prefix[len("language_model."):] if prefix.startswith("language_model.") else None
    for p in patterns:
        if p != prefix and (p in prefix or (stripped is not None and p in stripped)):
            return True, err
    for p in patterns:
        if fnmatch.fnmatchcase(prefix, p):
            return True, err
    return False, err


def name_covered(name, patterns):
    """The same substring + wildcard rule applied to an unfused checkpoint module name."""
    return any(p == name or p in name or fnmatch.fnmatchcase(name, p) for p in patterns)


# ------------------------------------------------------------------------------------ the checker

class Checker:
    def __init__(self, verbose=True):
        self.passed = 0
        self.failed = 0
        self.messages = []
        self.notes = []
        self.verbose = verbose

    def check(self, ok, msg):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            line = "FAIL " + msg
            self.messages.append(line)
            if self.verbose:
                print(line, flush=True)
        return ok

    def note(self, msg):
        self.notes.append(msg)
        if self.verbose:
            print("note " + msg, flush=True)


def scalar_f32(out_t, name):
    sf = out_t.get(name)
    if sf is None:
        return None
    dtype, shape = sf.tensors[name][:2]
    if dtype != "F32":
        return None
    return F32(sf.array(name).reshape(-1)[0]) if int(np.prod(shape)) == 1 else None


def f32_bits(v):
    return None if v is None else int(np.array([v], F32).view(np.uint32)[0])


def fmt_f32(v):
    return "missing" if v is None else f"{float(v):.9g} (0x{f32_bits(v):08x})"


SHARD_RE = re.compile(r"^model-(\d{5})-of-(\d{5})\.safetensors$")
ALGOS = ("FP8", "NVFP4", "W4A16_NVFP4", "MXFP8", "MIXED_PRECISION",
         "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO")
# ModelOpt 0.47 writes MXFP4 weights (mxfp4_mlp_weight_only) under its internal lower-case name:
# process_layer_quant_config has no branch for it. TensorRT-LLM reads it; vLLM's ModelOpt path
# does not (format.md §7).
# FP8 weights with one F32 scale per 128x128 block (Kimi-K3's recipe: fp8_pb_wo, hf_ptq's
# fake-quant per-block FP8) likewise: vLLM's ModelOpt path knows only the upper-case FP8_PB_WO.
LOWER_CASE_ALGOS = ("mxfp4", "fp8_pb_wo")


def check_files(C, src_dir, out_dir):
    """§1: shards, index, sidecars. Returns name -> SafeFile of OUT."""
    out_files = sorted(os.listdir(out_dir))
    idx_path = os.path.join(out_dir, "model.safetensors.index.json")
    out_t = {}
    # transformers' save_pretrained (which ModelOpt's export calls) writes a checkpoint that fits
    # one shard as model.safetensors without an index, and several as model-0000k-of-0000n with
    # model.safetensors.index.json.
    if "model.safetensors" in out_files:
        C.check(not os.path.exists(idx_path) and
                [f for f in out_files if f.endswith(".safetensors")] == ["model.safetensors"],
                "[files] model.safetensors beside an index or other shards (save_pretrained writes "
                "one file without an index, or indexed shards)")
        sf = SafeFile(os.path.join(out_dir, "model.safetensors"))
        for p in sf.problems:
            C.check(False, f"[files] model.safetensors: invalid safetensors: {p}")
        for n in sf.tensors:
            out_t[n] = sf
        check_sidecars(C, src_dir, out_dir)
        return out_t
    C.check(os.path.exists(idx_path), "[files] model.safetensors.index.json missing")
    index = {}
    if os.path.exists(idx_path):
        try:
            index = json.load(open(idx_path))
        except ValueError as e:
            C.check(False, f"[files] index is not valid JSON: {e}")
    wmap = index.get("weight_map", {}) if isinstance(index, dict) else {}
    C.check(isinstance(wmap, dict) and wmap, "[files] index has no weight_map")
    shards = [f for f in out_files if f.endswith(".safetensors")]
    named = [f for f in shards if SHARD_RE.match(f)]
    for f in shards:
        C.check(SHARD_RE.match(f) is not None,
                f"[files] {f}: safetensors file not named model-0000k-of-0000n.safetensors "
                "(glob-based loaders would read it)")
    if named:
        totals = {int(SHARD_RE.match(f).group(2)) for f in named}
        ks = sorted(int(SHARD_RE.match(f).group(1)) for f in named)
        C.check(len(totals) == 1 and ks == list(range(1, len(named) + 1)) and totals == {len(named)},
                f"[files] shard names are not model-00001..n-of-n: {named}")
    listed_files = set(wmap.values()) if isinstance(wmap, dict) else set()
    for f in sorted(listed_files):
        C.check(f in shards, f"[files] index lists {f}, which does not exist")
    for f in named:
        C.check(f in listed_files, f"[files] shard {f} is not listed in the index (vLLM ignores it)")
    total = 0
    for f in shards:
        sf = SafeFile(os.path.join(out_dir, f))
        for p in sf.problems:
            C.check(False, f"[files] {f}: invalid safetensors: {p}")
        for n in sf.tensors:
            if f in listed_files:
                C.check(n not in out_t, f"[files] tensor {n} appears in two shards")
                out_t[n] = sf
            total += sf.tensors[n][3] - sf.tensors[n][2]
            C.check(wmap.get(n) == f, f"[files] index maps {n} to {wmap.get(n)}, it is in {f}")
    for n, f in (wmap.items() if isinstance(wmap, dict) else []):
        C.check(n in out_t, f"[files] index lists tensor {n} ({f}) that no shard holds")
    ts = index.get("metadata", {}).get("total_size") if isinstance(index, dict) else None
    if ts is not None:
        C.check(ts == total, f"[files] index total_size {ts} != {total} bytes of tensor data")
    check_sidecars(C, src_dir, out_dir)
    return out_t


def check_sidecars(C, src_dir, out_dir):
    """Every non-weight file of SRC, byte-identical in OUT."""
    for root, dirs, files in os.walk(src_dir):
        dirs[:] = [x for x in dirs if not x.startswith(".")]
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), src_dir)
            if (f.endswith(WEIGHT_EXT) or f.endswith(".safetensors.index.json")
                    or rel in ("config.json", "hf_quant_config.json") or f.startswith(".")):
                continue
            o = os.path.join(out_dir, rel)
            if not C.check(os.path.isfile(o), f"[files] sidecar {rel} of SRC not copied"):
                continue
            C.check(open(os.path.join(src_dir, rel), "rb").read() == open(o, "rb").read(),
                    f"[files] sidecar {rel} differs from SRC")


def detect_format(out_t, m):
    """Format of module m in OUT from its tensors, or None when its weight is unquantized."""
    sf = out_t.get(m + ".weight")
    if sf is None:
        return None
    dt = sf.tensors[m + ".weight"][0]
    if dt == "U8":
        ws = out_t.get(m + ".weight_scale")
        if ws is not None and ws.tensors[m + ".weight_scale"][0] == "U8":
            return "mxfp4"
        return "NVFP4" if (m + ".input_scale") in out_t else "W4A16_NVFP4"
    if dt == "F8_E4M3":
        ws = out_t.get(m + ".weight_scale")
        if ws is not None and ws.tensors[m + ".weight_scale"][0] == "U8":
            return "MXFP8"
        # Per-block FP8 is weight-only: FP8 per tensor always carries an input_scale.
        return "FP8" if (m + ".input_scale") in out_t else "fp8_pb_wo"
    return None


def quant_tensor_names(m, fmt):
    if fmt == "NVFP4":
        return [m + s for s in (".weight", ".weight_scale", ".weight_scale_2", ".input_scale")]
    if fmt == "W4A16_NVFP4":
        return [m + s for s in (".weight", ".weight_scale", ".weight_scale_2")]
    if fmt == "FP8":
        return [m + s for s in (".weight", ".weight_scale", ".input_scale")]
    if fmt in ("MXFP8", "mxfp4", "fp8_pb_wo"):
        return [m + s for s in (".weight", ".weight_scale")]
    return [m + ".weight"]


PB = 128  # fp8_pb_wo block (rows and columns)


def fp8_pb_scale_shape(out_f, in_f):
    """ModelOpt 0.47's fp8_pb_wo weight_scale shape: the block-reduced amax with its dimensions of
    1, [ceil(out/128), 1, ceil(in/128), 1], or 0-d when the weight is a single block."""
    nr, nc = -(-out_f // PB), -(-in_f // PB)
    return () if nr * nc == 1 else (nr, 1, nc, 1)


def fp8_pb_quantize(w32, group_amax=None):
    """Expected (F8_E4M3 bytes [out,in], F32 scales [nr, nc]) of fp8_pb_wo (quant/fp8.h): block
    amax (zero -> 448, clamped to FLT_MIN), scale fl32(a * fl32(1/448)), bytes
    e4m3(clip(fl32(w / scale))) with an fp32 true division. group_amax replaces a single block's
    amax (ModelOpt unifies a fused group of single-block weights)."""
    out_f, in_f = w32.shape
    nr, nc = -(-out_f // PB), -(-in_f // PB)
    pad = np.zeros((nr * PB, nc * PB), F32)
    pad[:out_f, :in_f] = np.abs(w32)
    a = pad.reshape(nr, PB, nc, PB).max(axis=(1, 3)).astype(F32)
    if group_amax is not None:
        a[...] = group_amax
    a = np.where(a == 0, F32(448.0), np.maximum(a, F32(np.finfo(F32).tiny))).astype(F32)
    scale = (a * INV_448).astype(F32)
    full = np.repeat(np.repeat(scale, PB, axis=0), PB, axis=1)[:out_f, :in_f]
    with np.errstate(all="ignore"):
        q = np.clip((w32 / full).astype(F32), F32(-448.0), F32(448.0))
    return e4m3_encode(q), scale


def nvfp4_dequantize(packed, sb, g):
    """NVFP4 [out, in/2] packed codes and [out, in/16] E4M3 block scale bytes -> fp32 [out, in]."""
    out, half = packed.shape
    codes = np.empty((out, half * 2), np.uint8)
    codes[:, 0::2] = packed & 0xF
    codes[:, 1::2] = packed >> 4
    with np.errstate(all="ignore"):
        d = (E4M3_TABLE[sb] * F32(g)).astype(F32)
        return (E2M1_VALUES[codes] * np.repeat(d, 16, axis=1)).astype(F32), np.repeat(d, 16, axis=1)


def check_gptoss(C, src, out_t, algo, qlayers, excl, amax_path, searched_scales=False):
    """gpt-oss's experts as ModelOpt 0.47 exports transformers' GptOssExperts (docs/QUANTIZE.md
    "gpt-oss"): per projection P = <p>.experts.{gate_up_proj,down_proj}, fused and transposed
    back to transformers' [E, in, out]: NVFP4 P U8 [E, in/2, out] (byte [e, c, r] packs inputs
    2c, 2c+1 of output r), P_weight_scale F8_E4M3 [E, in/16, out], P_weight_scale_2 and
    P_input_scale F32 [] for all experts (one quantizer per projection: the weight amax is the
    max over every expert); FP8 P F8_E4M3 [E, in, out] with scalar P_weight_scale and
    P_input_scale; unquantized P [E, in, out] as the source (an MXFP4 source decompressed to
    BF16). P_bias stays as stored ([keep]). vLLM's layer is <p>.experts. Returns the OUT tensor
    names accounted for."""
    expected = set()
    rv = {}
    if amax_path:
        ref = SafeFile(amax_path)
        rv = {n: float(ref.array(n).reshape(-1)[0]) for n in ref.tensors if n.startswith("ref32.")}
    for x, projs in sorted(src.gptoss.items()):
        layer = x[:-1]  # vLLM's FusedMoE prefix "<p>.experts"
        status = {}
        C.check(set(projs) == {"gate_up_proj", "down_proj"},
                f"[gptoss] {layer}: SRC has projections {sorted(projs)}")
        for p, (kind, stored) in sorted(projs.items()):
            P = x + p
            w = src.gptoss_weight(x, p)  # [E, out, in]
            E, out_f, in_f = w.shape
            o = out_t.get(P)
            if not C.check(o is not None, f"[gptoss] {P} missing from OUT"):
                continue
            dt, shp = o.tensors[P][:2]
            if dt == "U8":
                f = "NVFP4" if (P + "_input_scale") in out_t else "W4A16_NVFP4"
            elif dt == "F8_E4M3":
                f = "FP8"
            else:
                f = None
            status[p] = f
            declared = algo
            if algo == "MIXED_PRECISION":
                entry = qlayers.get(layer)
                declared = entry.get("quant_algo") if isinstance(entry, dict) else None
            if f is None:
                expected.add(P)
                want_dt = "BF16" if kind == "mxfp4" else dt
                C.check(dt == want_dt and shp == (E, in_f, out_f),
                        f"[gptoss] unquantized {P}: {dt} {list(shp)}, want {want_dt} {[E, in_f, out_f]}")
                want = (bf16_bytes(w.transpose(0, 2, 1)) if kind == "mxfp4"
                        else src.tensors[stored[0]].raw(stored[0]))
                C.check(o.raw(P) == want, f"[gptoss] unquantized {P}: bytes differ from the "
                        + ("mxfp4 source decompressed to bf16" if kind == "mxfp4" else "source"))
                continue
            C.check(declared == f, f"[gptoss] {P}: tensors are {f} but the config declares {declared}")
            names = {"NVFP4": {"": ("U8", (E, in_f // 2, out_f)),
                               "_weight_scale": ("F8_E4M3", (E, in_f // 16, out_f)),
                               "_weight_scale_2": ("F32", ()), "_input_scale": ("F32", ())},
                     "FP8": {"": ("F8_E4M3", (E, in_f, out_f)), "_weight_scale": ("F32", ()),
                             "_input_scale": ("F32", ())}}
            names["W4A16_NVFP4"] = {k: v for k, v in names["NVFP4"].items() if k != "_input_scale"}
            ok = True
            for suf, (want_dt, want_shp) in names[f].items():
                n = P + suf
                expected.add(n)
                sf = out_t.get(n)
                if not C.check(sf is not None, f"[gptoss] {n} missing ({f})"):
                    ok = False
                    continue
                got_dt, got_shp = sf.tensors[n][:2]
                ok &= C.check(got_dt == want_dt and got_shp == want_shp,
                              f"[gptoss] {n}: {got_dt} {list(got_shp)}, want {want_dt} {list(want_shp)}")
                if ok and want_dt == "F32":
                    v = sf.array(n).reshape(-1)
                    ok &= C.check(np.isfinite(v).all() and (v > 0).all(),
                                  f"[gptoss] {n} = {v.tolist()} is not a finite positive scalar")
            if not ok:
                continue
            wq = out_t[P].array(P)
            amax = F32(np.abs(w).max())  # one quantizer over every expert of the projection
            if f in ("NVFP4", "W4A16_NVFP4"):
                g = scalar_f32(out_t, P + "_weight_scale_2")
                sbq = out_t[P + "_weight_scale"].array(P + "_weight_scale")
                vals = E4M3_TABLE[sbq]
                C.check(np.isfinite(vals).all() and (vals > 0).all(),
                        f"[gptoss] {P}_weight_scale has zero, negative or NaN block scales")
                # Dequantized (the fused tensors transposed back per expert), every value within
                # NVFP4's bound: half the widest e2m1 step (1 x block scale) inside the block's
                # range, plus the excess of a value clipped at 6 x block scale.
                worst = 0.0
                deq_all = np.empty_like(w)
                for e in range(E):
                    deq, d = nvfp4_dequantize(wq[e].T, sbq[e].T, g)
                    deq_all[e] = deq
                    with np.errstate(all="ignore"):
                        bound = d * F32(1.0001) + np.maximum(np.abs(w[e]) - F32(6) * d, 0)
                        excess = np.abs(deq - w[e]) - bound
                    worst = max(worst, float(np.nanmax(np.where(np.isnan(excess), np.inf, excess))))
                C.check(worst <= 0, f"[gptoss] {P}: dequantized values exceed NVFP4's error bound "
                        f"by up to {worst:.3g}")
                want_g = F32(amax * INV_2688)
                if kind == "mxfp4" and f32_bits(g) != f32_bits(want_g):
                    # --exact_mxfp4: the closed-form conversion must reproduce the source exactly.
                    nbad = int((deq_all != w).sum())
                    C.check(nbad == 0, f"[gptoss] {P}: weight_scale_2 {fmt_f32(g)} is not the amax "
                            f"formula over all experts ({fmt_f32(want_g)}) and the export is not an "
                            f"exact MXFP4 conversion: {nbad} of {w.size} values differ from the source")
                else:
                    C.check(f32_bits(g) == f32_bits(want_g), f"[gptoss] {P}_weight_scale_2 {fmt_f32(g)} "
                            f"!= amax over all {E} experts {float(amax):.9g} * fl32(1/2688) = {fmt_f32(want_g)}")
                    nbad_w = nbad_s = 0
                    for e in range(E):
                        # A searched export (mse, fp8_scale_sweep): the block scales are the
                        # search's, positive finite e4m3 bytes; the codes their encoding.
                        packed, sb = (nvfp4_quantize(w[e], g, 16, sbq[e].T) if searched_scales
                                      else nvfp4_quantize(w[e], g))
                        nbad_w += int((packed != wq[e].T).sum())
                        nbad_s += (int(((sbq[e] == 0) | (sbq[e] >= 0x7F)).sum()) if searched_scales
                                   else int((sb != sbq[e].T).sum()))
                    C.check(nbad_w == 0, f"[gptoss] {P}: {nbad_w} of {wq.size} bytes differ from the "
                            "NVFP4 recomputation of each expert's [out, in] rows, transposed"
                            + (" (under the exported searched scales)" if searched_scales else ""))
                    C.check(nbad_s == 0, f"[gptoss] {P}_weight_scale: {nbad_s} of {sbq.size} block "
                            + ("scales are not positive finite e4m3 values" if searched_scales
                               else "scales differ"))
            else:
                s = scalar_f32(out_t, P + "_weight_scale")
                want_s = F32(amax * INV_448)
                C.check(f32_bits(s) == f32_bits(want_s), f"[gptoss] {P}_weight_scale {fmt_f32(s)} != "
                        f"amax over all {E} experts {float(amax):.9g} * fl32(1/448) = {fmt_f32(want_s)}")
                # ModelOpt exports the stacked [E, in, out] tensor as weight / scale.unsqueeze(-1):
                # the 1-D scale promotes a bf16 weight to fp32, so the quotient is fp32, never
                # rounded to bf16 (unlike a 2-D weight's division by the 0-dim scale, format.md §2).
                nbad = 0
                for e in range(E):
                    nbad += int((fp8_quantize(w[e], s, "f32") != wq[e].T).sum())
                C.check(nbad == 0, f"[gptoss] {P}: {nbad} of {wq.size} bytes differ from the FP8 "
                        "recomputation with the exported weight_scale (fp32 quotient)")
            if f in ("NVFP4", "FP8"):
                refs = [rv[f"ref32.amax.{x}{e}.{p}"] for e in range(E) if f"ref32.amax.{x}{e}.{p}" in rv]
                if refs:
                    inv = INV_2688 if f == "NVFP4" else INV_448
                    want = F32(F32(max(refs)) * inv)
                    got = scalar_f32(out_t, P + "_input_scale")
                    C.check(abs(float(got) - float(want)) <= 0.01 * float(want),
                            f"[amax] {P}_input_scale {fmt_f32(got)} != max reference amax over the "
                            f"experts {max(refs):.7g} x inverse = {float(want):.7g} within 1%")
                elif amax_path:
                    C.note(f"{P}: no reference amax; input_scale not compared")
        if len(status) == 2:
            C.check(len(set(status.values())) == 1,
                    f"[gptoss] {layer}: gate_up_proj is {status.get('gate_up_proj')} but down_proj "
                    f"{status.get('down_proj')} (vLLM's FusedMoE is one layer)")
            quant = status["gate_up_proj"] is not None
            for pats, tag in ((excl, "as listed"), (vllm_expand(excl), "after vLLM's x* -> x, x.* rewrite")):
                ex, _ = vllm_excluded(layer, [], pats)
                C.check(ex == (not quant), f"[exclude] vLLM layer {layer} is "
                        f"{'excluded' if ex else 'quantized'} under vLLM's rule ({tag}) but its "
                        f"experts are {'quantized' if quant else 'unquantized'}")
    return expected


# Text model types whose transformers class keeps the router's e_score_correction_bias in fp32
# (_keep_in_fp32_modules_strict): DeepSeek-V3 (Kimi-K2 and Kimi-K2.5's text model are deepseek_v3),
# DeepSeek-V3.2 and GLM-4.5. Kimi-Linear's and MiniMax-M2's classes do not.
FP32_ROUTER_BIAS = ("deepseek_v3", "kimi_k2", "deepseek_v32", "glm4_moe")


def in_mtp_layer(name, cfg):
    """Whether `name` lies in a layer at or past the text model's num_hidden_layers (MTP)."""
    for k in ("text_config", "language_config", "llm_config"):
        if isinstance(cfg.get(k), dict):
            return in_mtp_layer(name, cfg[k])
    n = cfg.get("num_hidden_layers")
    hit = re.search(r"(?:^|\.)layers\.(\d+)\.", name)
    return isinstance(n, int) and hit is not None and int(hit.group(1)) >= n


def text_model_type(cfg):
    for k in ("text_config", "language_config", "llm_config"):
        if isinstance(cfg.get(k), dict):
            return text_model_type(cfg[k])
    return cfg.get("model_type")


def run_checks(src_dir, out_dir, amax_path=None, verbose=True, searched_scales=False):
    C = Checker(verbose)
    src = Source(src_dir)
    C.check(bool(src.tensors), f"[files] no source tensors found in {src_dir}")
    out_t = check_files(C, src_dir, out_dir)

    # ---------------------------------------------------------------- §5 config files
    hq = {}
    hq_path = os.path.join(out_dir, "hf_quant_config.json")
    if C.check(os.path.exists(hq_path), "[config] hf_quant_config.json missing"):
        try:
            hq = json.load(open(hq_path))
        except ValueError as e:
            C.check(False, f"[config] hf_quant_config.json invalid JSON: {e}")
    q = hq.get("quantization", {}) if isinstance(hq, dict) else {}
    C.check(list(hq.keys()) == ["producer", "quantization"],
            f"[config] hf_quant_config.json keys {list(hq.keys())}, want ['producer', 'quantization']")
    prod = hq.get("producer", {})
    C.check(isinstance(prod, dict) and list(prod.keys()) == ["name", "version"]
            and prod.get("name") == "modelopt" and isinstance(prod.get("version"), str),
            f"[config] producer must be {{'name': 'modelopt', 'version': str}}, got {prod}")
    algo = q.get("quant_algo")
    kv_algo = q.get("kv_cache_quant_algo", "absent")
    C.check(isinstance(algo, str) and ((algo == algo.upper() and algo in ALGOS)
                                       or algo in LOWER_CASE_ALGOS),
            f"[config] quant_algo {algo!r} is not an upper-case algorithm vLLM accepts "
            f"(nor one of ModelOpt's lower-case {LOWER_CASE_ALGOS})")
    C.check(kv_algo in ("FP8", "NVFP4", "NVFP4_AFFINE", None),
            f"[config] kv_cache_quant_algo {kv_algo!r} must be 'FP8', 'NVFP4', 'NVFP4_AFFINE' or null")
    keys = list(q.keys())
    # NVFP4 W4A4 has blocks of 16; weight-only NVFP4 also 32 (nvfp4_bs32).
    gs = q.get("group_size") if algo == "W4A16_NVFP4" and q.get("group_size") in (16, 32) else 16
    if algo == "NVFP4" or algo == "W4A16_NVFP4":
        want = ["quant_algo", "kv_cache_quant_algo", "group_size", "exclude_modules"]
        C.check(keys == want, f"[config] hf_quant_config quantization keys {keys}, want {want}")
        C.check(q.get("group_size") == gs, f"[config] group_size {q.get('group_size')} != {gs}")
    elif algo in ("mxfp4", "fp8_pb_wo"):
        want = ["quant_algo", "kv_cache_quant_algo", "exclude_modules"]
        C.check(keys == want, f"[config] hf_quant_config quantization keys {keys}, want {want} "
                f"(ModelOpt 0.47 writes no group_size for {algo})")
    elif algo == "MIXED_PRECISION":
        C.check(keys[:2] == ["quant_algo", "kv_cache_quant_algo"]
                and set(keys) <= {"quant_algo", "kv_cache_quant_algo", "group_size",
                                  "exclude_modules", "quantized_layers"}
                and "quantized_layers" in keys and "exclude_modules" in keys,
                f"[config] MIXED_PRECISION quantization keys {keys}")
    else:
        allowed = ["quant_algo", "kv_cache_quant_algo", "group_size", "exclude_modules"]
        C.check([k for k in allowed if k in keys] == keys and "exclude_modules" in keys
                and keys[:2] == ["quant_algo", "kv_cache_quant_algo"],
                f"[config] hf_quant_config quantization keys {keys}, want order {allowed}")
    excl = q.get("exclude_modules", [])
    if not C.check(isinstance(excl, list) and all(isinstance(x, str) for x in excl),
                   "[exclude] exclude_modules is not a list of strings"):
        excl = []
    C.check(excl == sorted(excl), "[exclude] exclude_modules not sorted lexicographically")
    C.check(len(set(excl)) == len(excl), "[exclude] exclude_modules has duplicates")
    qlayers = q.get("quantized_layers", {}) if algo == "MIXED_PRECISION" else {}

    src_cfg, out_cfg = {}, {}
    try:
        src_cfg = json.load(open(os.path.join(src_dir, "config.json")))
    except (OSError, ValueError):
        C.note("SRC has no readable config.json")
    try:
        out_cfg = json.load(open(os.path.join(out_dir, "config.json")))
    except (OSError, ValueError) as e:
        C.check(False, f"[config] OUT config.json missing or invalid: {e}")
    qc = out_cfg.get("quantization_config")
    strip = lambda c: {k: v for k, v in c.items() if k != "quantization_config"}
    if src_cfg and out_cfg:
        C.check(strip(src_cfg) == strip(out_cfg),
                "[config] config.json differs from SRC's outside quantization_config: "
                + ", ".join(sorted(k for k in set(src_cfg) | set(out_cfg) if k != "quantization_config"
                                   and src_cfg.get(k, "<absent>") != out_cfg.get(k, "<absent>"))))
    for sub in ("text_config", "language_config", "llm_config"):
        if isinstance(out_cfg.get(sub), dict):
            C.check("quantization_config" not in out_cfg[sub],
                    f"[config] stale quantization_config left in config.json[{sub!r}]")
    if C.check(isinstance(qc, dict), "[config] config.json has no quantization_config"):
        C.check(qc.get("quant_method") == "modelopt",
                f"[config] quantization_config.quant_method {qc.get('quant_method')!r} != 'modelopt' "
                "(a stale source quantization_config?)")
        C.check(qc.get("quant_algo") == algo, f"[config] quantization_config.quant_algo "
                f"{qc.get('quant_algo')!r} != hf_quant_config's {algo!r}")
        C.check(qc.get("ignore") == excl, "[config] quantization_config.ignore != exclude_modules")
        C.check(qc.get("producer") == prod, "[config] quantization_config.producer != hf_quant_config's")
        kvs = {"dynamic": False, "num_bits": 8, "type": "float"}
        if kv_algo == "FP8":
            C.check(qc.get("kv_cache_scheme") == kvs, f"[config] kv_cache_scheme {qc.get('kv_cache_scheme')} != {kvs}")
        elif kv_algo in ("NVFP4", "NVFP4_AFFINE"):
            # ModelOpt 0.47's convert_hf_config writes another KV algorithm's name as the scheme.
            C.check(qc.get("kv_cache_scheme") == kv_algo,
                    f"[config] kv_cache_scheme {qc.get('kv_cache_scheme')!r} != {kv_algo!r}")
        else:
            C.check(qc.get("kv_cache_scheme") is None, "[config] kv_cache_scheme set but KV cache not quantized")
        nv = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
        f8 = {"dynamic": False, "num_bits": 8, "type": "float"}
        groups = qc.get("config_groups")
        if algo == "NVFP4":
            want = {"group_0": {"input_activations": nv, "weights": nv, "targets": ["Linear"]}}
            C.check(groups == want, f"[config] config_groups {groups} != {want}")
        elif algo == "W4A16_NVFP4":
            want = {"group_0": {"weights": dict(nv, group_size=gs), "targets": ["Linear"]}}
            C.check(groups == want, f"[config] config_groups {groups} != {want}")
        elif algo in ("mxfp4", "fp8_pb_wo"):
            C.check(groups is None, f"[config] config_groups {groups} for {algo}: ModelOpt 0.47's "
                    "convert_hf_config writes none")
            # ModelOpt 0.47's convert_hf_config puts group_size in config_groups only.
            C.check("group_size" not in qc, "[config] quantization_config.group_size set at the top "
                    "level (ModelOpt 0.47 writes it in config_groups only)")
        elif algo == "FP8":
            want = {"group_0": {"input_activations": f8, "weights": f8, "targets": ["Linear"]}}
            C.check(groups == want, f"[config] config_groups {groups} != {want}")
        elif algo == "MIXED_PRECISION":
            C.check(qc.get("quantized_layers") == qlayers,
                    "[config] quantization_config.quantized_layers != hf_quant_config's")
            C.check(isinstance(groups, dict) and groups, "[config] MIXED_PRECISION without config_groups")
            seen = []
            for gname, g in (groups or {}).items():
                seen += g.get("targets", [])
                # ModelOpt 0.47's convert_hf_quant_config_format: one group per distinct layer
                # config, its targets the sorted layer names, all of one config.
                tg = g.get("targets", [])
                C.check(tg == sorted(tg), f"[config] config_groups.{gname}.targets not sorted")
                cfgs = {json.dumps(qlayers.get(t), sort_keys=True) for t in tg}
                C.check(len(cfgs) == 1, f"[config] config_groups.{gname} targets layers of "
                        f"{len(cfgs)} different quantized_layers configs")
                if len(cfgs) == 1 and tg and isinstance(qlayers.get(tg[0]), dict) and \
                        qlayers[tg[0]].get("quant_algo") in LOWER_CASE_ALGOS:
                    C.check(list(g) == ["quant_algo", "targets"]
                            and g["quant_algo"] == qlayers[tg[0]]["quant_algo"],
                            f"[config] config_groups.{gname} {list(g)}: ModelOpt 0.47 writes only "
                            "quant_algo and targets for an algorithm it has no scheme for")
            C.check(sorted(seen) == sorted(qlayers), "[config] config_groups targets != quantized_layers")

    # ---------------------------------------------------------------- §2 quantized modules
    modules = src.modules
    fmt = {}
    for m in modules:
        f = detect_format(out_t, m)
        if f:
            fmt[m] = f
    for n, sf in out_t.items():
        if n.endswith(".weight") and sf.tensors[n][0] in ("U8", "F8_E4M3") and n[:-7] not in modules:
            src_dt = src.tensors[n].tensors[n][0] if n in src.tensors else None
            if src_dt != "F8_E4M3":
                C.check(False, f"[quant] {n[:-7]}: quantized in OUT but no such linear weight in SRC")
    for m, f in sorted(fmt.items()):
        declared = algo
        if algo == "MIXED_PRECISION":
            entry = qlayers.get(m)
            if entry is None:
                entry = next((v for k, v in qlayers.items() if fnmatch.fnmatchcase(m, k)), None)
            declared = entry.get("quant_algo") if isinstance(entry, dict) else None
            if declared in ("NVFP4", "W4A16_NVFP4"):
                C.check(entry.get("group_size") == 16, f"[config] quantized_layers[{m}] group_size != 16")
            if declared in ("mxfp4", "fp8_pb_wo"):
                C.check("group_size" not in entry, f"[config] quantized_layers[{m}] has a group_size")
        C.check(declared == f, f"[quant] {m}: tensors are {f} but the config declares {declared}")
        out_f, in_f = modules[m][1]
        shapes = {"NVFP4": {".weight": ("U8", (out_f, in_f // 2)), ".weight_scale": ("F8_E4M3", (out_f, in_f // 16)),
                            ".weight_scale_2": ("F32", ()), ".input_scale": ("F32", ())},
                  "FP8": {".weight": ("F8_E4M3", (out_f, in_f)), ".weight_scale": ("F32", ()),
                          ".input_scale": ("F32", ())},
                  "MXFP8": {".weight": ("F8_E4M3", (out_f, in_f)), ".weight_scale": ("U8", (out_f, in_f // 32))},
                  "mxfp4": {".weight": ("U8", (out_f, in_f // 2)), ".weight_scale": ("U8", (out_f, in_f // 32))},
                  "fp8_pb_wo": {".weight": ("F8_E4M3", (out_f, in_f)),
                                ".weight_scale": ("F32", fp8_pb_scale_shape(out_f, in_f))}}
        shapes["W4A16_NVFP4"] = {k: v for k, v in shapes["NVFP4"].items() if k != ".input_scale"}
        shapes["W4A16_NVFP4"][".weight_scale"] = ("F8_E4M3", (out_f, in_f // gs))
        if f in ("NVFP4", "W4A16_NVFP4"):
            C.check(in_f % 16 == 0, f"[quant] {m}: in_features {in_f} not a multiple of 16")
        if f in ("MXFP8", "mxfp4") or (f == "W4A16_NVFP4" and gs == 32):
            C.check(in_f % 32 == 0, f"[quant] {m}: in_features {in_f} not a multiple of 32")
        for suf, (dt, shp) in shapes[f].items():
            n = m + suf
            sf = out_t.get(n)
            if not C.check(sf is not None, f"[quant] {n} missing ({f})"):
                continue
            got_dt, got_shp = sf.tensors[n][:2]
            C.check(got_dt == dt and got_shp == shp,
                    f"[quant] {n}: {got_dt} {list(got_shp)}, want {dt} {list(shp)}")
            if dt == "F32" and got_dt == "F32":
                v = sf.array(n).reshape(-1)
                C.check((v.size == 1 or f == "fp8_pb_wo") and np.isfinite(v).all() and (v > 0).all(),
                        f"[quant] {n} = {v.tolist()[:8]} is not a finite positive scalar"
                        + (" (block scales)" if f == "fp8_pb_wo" else ""))
        if f == "NVFP4" and (m + ".weight_scale") in out_t and out_t[m + ".weight_scale"].tensors[m + ".weight_scale"][0] == "F8_E4M3":
            sb = out_t[m + ".weight_scale"].array(m + ".weight_scale")
            vals = E4M3_TABLE[sb]
            C.check(np.isfinite(vals).all() and (vals > 0).all(),
                    f"[quant] {m}.weight_scale has zero, negative or NaN block scales")
        if f == "MXFP8" and (m + ".weight_scale") in out_t:
            C.check(not (out_t[m + ".weight_scale"].array(m + ".weight_scale") == 255).any(),
                    f"[quant] {m}.weight_scale has E8M0 NaN (0xFF)")
        if f in ("W4A16_NVFP4", "MXFP8", "mxfp4", "fp8_pb_wo"):
            C.check((m + ".input_scale") not in out_t or f == "W4A16_NVFP4",
                    f"[quant] {m}: {f} carries an input_scale")
        if f == "mxfp4" and (m + ".weight_scale") in out_t:
            C.check(not (out_t[m + ".weight_scale"].array(m + ".weight_scale") == 255).any(),
                    f"[quant] {m}.weight_scale has E8M0 NaN (0xFF)")

    # ---------------------------------------------------------------- §3 fused groups, MoE
    groups = []  # (label, [modules], vLLM prefix or None)
    by_parent = {}
    for m in modules:
        if "." in m:
            p, leaf = m.rsplit(".", 1)
            by_parent.setdefault(p, set()).add(leaf)
    for p, leaves in sorted(by_parent.items()):
        for members, fused in FUSED_SIBLINGS:
            if all(x in leaves for x in members):
                groups.append((fused, [f"{p}.{x}" for x in members], f"{p}.{fused}"))
    fused_of = {m: g for g in groups for m in g[1]}
    # NVFP4 scales are shared more widely, by the quantized linears of one format that read the
    # same input tensor (ModelOpt 0.47 _fuse_shared_input_modules; not for FP8): in an attention
    # block every projection of the block's input, MLA's and Kimi-Linear KDA's included.
    shared_in = {}  # module -> the modules of its format reading its input (itself included)
    for p, leaves in sorted(by_parent.items()):
        members = [f"{p}.{x}" for x in ATTENTION_INPUT if x in leaves]
        # DeepSeek-V3.2's lightning indexer: wk and weights_proj read the attention block's input;
        # wq_b reads the q LoRA output that q_b_proj reads.
        idx = by_parent.get(f"{p}.indexer", set())
        members += [f"{p}.indexer.{x}" for x in INDEXER_ATTENTION_INPUT if x in idx]
        groups_in = [members]
        if "q_b_proj" in leaves and "wq_b" in idx:
            groups_in.append([f"{p}.q_b_proj", f"{p}.indexer.wq_b"])
        for members in groups_in:
            for m in members:
                same = [o for o in members if fmt.get(o) == fmt.get(m)]
                if fmt.get(m) in ("NVFP4", "W4A16_NVFP4", "fp8_pb_wo") and len(same) > 1:
                    shared_in[m] = same
    for m, same in sorted(shared_in.items()):
        if m != same[0] or fmt.get(m) == "fp8_pb_wo":  # fp8_pb_wo: see §6 numerics
            continue
        for n, fmt_ok in (("weight_scale_2", True), ("input_scale", fmt.get(m) == "NVFP4")):
            vals = {f32_bits(scalar_f32(out_t, o + "." + n)) for o in same}
            C.check(not fmt_ok or len(vals) == 1,
                    f"[group] shared input {same}: {n} differ (ModelOpt fuses linears reading one input)")
    moe = {}  # experts prefix -> {expert id -> {gate/up/down -> module}}
    for m in modules:
        mm = EXPERT_RE.match(m)
        if mm:
            moe.setdefault(mm.group(1), {}).setdefault(int(mm.group(2)), {})[GATE_UP[mm.group(3)]] = m
    for label, members, _ in groups:
        fs = [fmt.get(m) for m in members]
        C.check(len(set(fs)) == 1, f"[group] {label} {members}: mixed status/format {fs}")
        if fs[0] in ("NVFP4", "W4A16_NVFP4") and len(set(fs)) == 1:
            g2 = [f32_bits(scalar_f32(out_t, m + ".weight_scale_2")) for m in members]
            C.check(len(set(g2)) == 1, f"[group] {label} {members[0]}..: weight_scale_2 differ "
                    + ", ".join(fmt_f32(scalar_f32(out_t, m + ".weight_scale_2")) for m in members))
        if fs[0] == "NVFP4" and len(set(fs)) == 1:
            ins = [f32_bits(scalar_f32(out_t, m + ".input_scale")) for m in members]
            C.check(len(set(ins)) == 1, f"[group] {label} {members[0]}..: input_scale differ "
                    + ", ".join(fmt_f32(scalar_f32(out_t, m + ".input_scale")) for m in members))
    for pre, experts in sorted(moe.items()):
        all_mods = [m for e in experts.values() for m in e.values()]
        fs = {fmt.get(m) for m in all_mods}
        C.check(len(fs) == 1, f"[moe] {pre}: experts not all in one format/status: {sorted(map(str, fs))} "
                "(vLLM's FusedMoE is one layer)")
        for e, parts in sorted(experts.items()):
            C.check(set(parts) == {"gate", "up", "down"}, f"[moe] {pre}.{e}: SRC expert lacks {parts}")
            for part, m in parts.items():
                f = fmt.get(m)
                for n in quant_tensor_names(m, f) if f else [m + ".weight"]:
                    C.check(n in out_t, f"[moe] {pre}.{e}: {n} missing")
        for which in (("gate", "up"), ("down",)):
            mods = [p[w] for p in experts.values() for w in which if w in p]
            if any(fmt.get(m) in ("NVFP4", "FP8") for m in mods):
                vals = {f32_bits(scalar_f32(out_t, m + ".input_scale")) for m in mods}
                C.check(len(vals) == 1 and None not in vals,
                        f"[moe] {pre}: {'/'.join(which)} input_scale not one shared value over "
                        f"all {len(experts)} experts ({len(vals)} distinct{', some missing' if None in vals else ''})")

    # ---------------------------------------------------------------- §4 unquantized tensors
    replaced = set()
    for m, f in fmt.items():
        replaced.add(m + ".weight")
        if (m + ".weight_scale_inv") in src.tensors:
            replaced.add(m + ".weight_scale_inv")
    for n, feeds in src.replaced.items():
        replaced.add(n)
    for m, (layout, stored) in sorted(src.compressed.items()):
        replaced.update(stored)
        if m in fmt:
            continue
        # Excluded: the decompressed weight, BF16 [out, in], under M.weight.
        n = m + ".weight"
        o = out_t.get(n)
        if not C.check(o is not None, f"[keep] {m}: excluded {layout} source module has no {n} in OUT"):
            continue
        odt, oshp = o.tensors[n][:2]
        want = src.weight(m)
        if C.check(odt == "BF16" and oshp == want.shape,
                   f"[keep] {n}: {odt} {list(oshp)}, want the decompressed BF16 {list(want.shape)}"):
            C.check(o.raw(n) == bf16_bytes(want),
                    f"[keep] {n}: bytes differ from the {layout} source decompressed to bf16 (format.md §8)")
    for n, sf in sorted(src.tensors.items()):
        if n in replaced:
            continue
        if n in src.replaced:
            continue
        o = out_t.get(n)
        if not C.check(o is not None, f"[keep] SRC tensor {n} missing from OUT"):
            continue
        sdt, sshp = sf.tensors[n][:2]
        odt, oshp = o.tensors[n][:2]
        if sdt == "F8_E4M3" and odt in FLOAT_DTYPES:
            C.note(f"{n}: FP8 source weight written unquantized as {odt}; values not compared")
            continue
        if n.endswith(".e_score_correction_bias") and text_model_type(src_cfg) in FP32_ROUTER_BIAS \
                and sdt in ("BF16", "F16") and not in_mtp_layer(n, src_cfg):
            # transformers keeps this buffer in fp32 (_keep_in_fp32_modules_strict of these
            # models), so ModelOpt's export writes the widened values as F32 (not in MTP layers,
            # which the HF model never loads: copied as the checkpoint holds them).
            if C.check(odt == "F32" and sshp == oshp,
                       f"[keep] {n}: {odt} {list(oshp)} in OUT, want F32 {list(sshp)} (transformers keeps it fp32)"):
                want = bf16_bits_to_f32(np.frombuffer(sf.raw(n), np.uint16)) if sdt == "BF16" \
                    else np.frombuffer(sf.raw(n), np.float16).astype(F32)
                C.check(np.frombuffer(o.raw(n), F32).tobytes() == want.tobytes(),
                        f"[keep] {n}: F32 values are not the SRC {sdt} values widened")
            continue
        C.check(sdt == odt and sshp == oshp, f"[keep] {n}: {odt} {list(oshp)} in OUT, {sdt} {list(sshp)} in SRC")
        C.check(sf.raw(n) == o.raw(n), f"[keep] {n}: bytes differ from SRC")
    # Every OUT tensor must be accounted for.
    expected = set(n for n in src.tensors if n not in replaced)
    for n, feeds in src.replaced.items():
        for m in feeds:
            if m not in fmt:
                expected.add(m + ".weight")
                C.check((m + ".weight") in out_t, f"[keep] {m}.weight (split from SRC {n}) missing")
    for m in src.compressed:
        if m not in fmt:
            expected.add(m + ".weight")
    for m, f in fmt.items():
        expected.update(quant_tensor_names(m, f))
        if (m + ".bias") in src.tensors:
            expected.add(m + ".bias")
    # Multi-token-prediction layers (model.layers.N with N >= num_hidden_layers: DeepSeek-V3,
    # GLM-4.5) never run in calibration: ModelOpt 0.47 lists each as `<prefix>*` in exclude_modules
    # (unified_export_hf._add_mtp_exclusions) and copies its tensors as the checkpoint holds them
    # (unified_export_hf_streaming: weights the HF model never loads), so they have no KV scales.
    # Qwen3-Next's and Qwen3.5's MTP module is top-level `mtp.*` (ModelOpt's default-disabled
    # `mtp.*`): the same.
    text_cfg = next((src_cfg[k] for k in ("text_config", "language_config", "llm_config")
                     if isinstance(src_cfg.get(k), dict)), src_cfg)
    n_layers = text_cfg.get("num_hidden_layers") if isinstance(text_cfg, dict) else None

    def is_mtp(m):
        if m.startswith("mtp."):
            return True
        hit = re.search(r"(?:^|\.)layers\.(\d+)\.", m)
        return isinstance(n_layers, int) and hit is not None and int(hit.group(1)) >= n_layers

    attn = []  # attention prefixes with a KV cache
    for m in modules:
        if is_mtp(m):
            continue
        if m.endswith(".o_proj") and ".self_attn" in m or m.endswith(".attn.o_proj"):
            p = m[: -len(".o_proj")]
            if not any(k.startswith(p + ".") and ("conv1d" in k or "A_log" in k or "dt_bias" in k)
                       for k in src.tensors):
                attn.append(p)
    # A calibrated KV cache has k/v scales on every attention layer; a cast one (constant amax,
    # ModelOpt's use_constant_amax) has none at all: ModelOpt exports the k/v scales from the
    # quantizers' calibrated _amax buffers, which the cast modes never register.
    kv_cast = kv_algo in ("FP8", "NVFP4") and not any(n.endswith(("k_proj.k_scale", "v_proj.v_scale"))
                                                      for n in out_t)
    if kv_cast:
        C.note(f"kv_cache_quant_algo {kv_algo} without k/v scales: the cast mode (constant amax)")
    # The affine modes (ModelOpt's kv_*_affine units): a static bias per head and channel beside
    # every k/v scale, k_proj.k_bias / v_proj.v_bias [1, heads, 1, head_dim] in the model's dtype;
    # NVFP4's is named NVFP4_AFFINE, FP8's stays FP8 (then the biases themselves say so).
    kv_affine = kv_algo == "NVFP4_AFFINE" or (
        kv_algo == "FP8" and any(n.endswith(("k_proj.k_bias", "v_proj.v_bias")) for n in out_t))
    if kv_algo in ("FP8", "NVFP4", "NVFP4_AFFINE") and not kv_cast:
        bias_dt = {"bfloat16": "BF16", "float16": "F16"}.get(
            text_cfg.get("torch_dtype", text_cfg.get("dtype", src_cfg.get("torch_dtype",
                                                                         src_cfg.get("dtype")))), "F32")
        mla = (text_cfg.get("kv_lora_rank") or 0) > 0
        heads = text_cfg.get("num_attention_heads") if mla else text_cfg.get(
            "num_key_value_heads", text_cfg.get("num_attention_heads"))
        head_dim = text_cfg.get("head_dim") or (text_cfg.get("hidden_size", 0)
                                                // max(text_cfg.get("num_attention_heads", 1), 1))
        widths = ({"k": text_cfg.get("qk_nope_head_dim", 0) + text_cfg.get("qk_rope_head_dim", 0),
                   "v": text_cfg.get("v_head_dim")} if mla else {"k": head_dim, "v": head_dim})
        for p in sorted(attn):
            for kv in ("k", "v"):
                n = f"{p}.{kv}_proj.{kv}_scale"
                expected.add(n)
                if C.check(n in out_t, f"[kv] {n} missing (kv_cache_quant_algo {kv_algo})"):
                    dt, shp = out_t[n].tensors[n][:2]
                    v = out_t[n].array(n).reshape(-1) if dt == "F32" else np.array([np.nan])
                    C.check(dt == "F32" and shp == () and np.isfinite(v).all() and (v > 0).all(),
                            f"[kv] {n}: {dt} {list(shp)} {v.tolist()}, want a finite positive F32 []")
                if not kv_affine:
                    continue
                b = f"{p}.{kv}_proj.{kv}_bias"
                expected.add(b)
                want = [1, heads, 1, widths[kv]]
                if C.check(b in out_t, f"[kv] {b} missing (affine KV cache, {kv_algo})"):
                    dt, shp = out_t[b].tensors[b][:2]
                    ok = C.check(dt == bias_dt and list(shp) == want,
                                 f"[kv] {b}: {dt} {list(shp)}, want {bias_dt} {want} (the model's "
                                 "dtype; heads and head_dim of the K/V states)")
                    if ok:
                        bv = float_array(dt, out_t[b].array(b)).reshape(-1)
                        C.check(np.isfinite(bv).all(), f"[kv] {b}: not finite")
    expected |= check_gptoss(C, src, out_t, algo, qlayers, excl, amax_path, searched_scales)
    for n in sorted(out_t):
        C.check(n in expected, f"[keep] OUT tensor {n} is neither a SRC tensor nor a quantization tensor "
                "of a quantized module" + (" (k/v scale without kv_cache_quant_algo FP8?)"
                                            if n.endswith(("k_scale", "v_scale")) else ""))

    # ---------------------------------------------------------------- §6 multimodal wrappers
    # The vision tower and projector are copied unquantized and bit-identical, and listed in
    # exclude_modules; the language model keeps its prefix (config.json is the parent's: checked
    # under [config]).
    tower = [n for n in src.tensors if is_tower(n)]
    if tower:
        C.check(isinstance(src_cfg.get("text_config"), dict) or isinstance(src_cfg.get("language_config"), dict),
                "[multimodal] SRC has vision/projector tensors but config.json has no text_config")
        C.check(out_cfg.get("model_type") == src_cfg.get("model_type"),
                f"[multimodal] OUT model_type {out_cfg.get('model_type')!r} is not the parent's "
                f"{src_cfg.get('model_type')!r}")
    for n in sorted(tower):
        o = out_t.get(n)
        C.check(o is not None and o.tensors[n][:2] == src.tensors[n].tensors[n][:2]
                and o.raw(n) == src.tensors[n].raw(n),
                f"[multimodal] {n}: not copied bit-identical to OUT")
    for m in sorted(modules):
        if is_tower(m):
            C.check(m not in fmt, f"[multimodal] {m}: vision/projector module quantized")
            C.check(name_covered(m, excl), f"[multimodal] {m}: not covered by exclude_modules")

    # ---------------------------------------------------------------- §5 exclude_modules
    expanded = vllm_expand(excl)
    unq = [m for m in modules if m not in fmt]
    for m in sorted(unq):
        C.check(name_covered(m, excl), f"[exclude] unquantized {m} not covered by exclude_modules")
    # ModelOpt 0.47 lists every module that carries a quantizer, also a disabled one: the token
    # embedding (nn.Embedding) and lm_head, which the CausalLM has also when tied to the embedding.
    for n in sorted(src.tensors):
        if n.endswith("embed_tokens.weight") and not is_tower(n):
            C.check(name_covered(n[:-7], excl), f"[exclude] embedding {n[:-7]} not in exclude_modules")
        # The Gated DeltaNet's causal conv, an nn.Conv1d (Qwen3-Next, Qwen3.5).
        if n.endswith(".linear_attn.conv1d.weight") and not is_tower(n):
            C.check(name_covered(n[:-7], excl), f"[exclude] conv {n[:-7]} not in exclude_modules")
    if not any(n.endswith("lm_head.weight") for n in src.tensors):
        head = "language_model.lm_head" if any(n.startswith("language_model.model.") for n in src.tensors) \
            else "lm_head"
        C.check(name_covered(head, excl), f"[exclude] tied {head} not in exclude_modules")
    for m in sorted(fmt):
        hit = [p for p in excl if p == m or p in m or fnmatch.fnmatchcase(m, p)]
        C.check(not hit, f"[exclude] quantized {m} is covered by exclude_modules entries {hit}")
    # vLLM layers: fused groups, one FusedMoE per experts prefix, everything else on its own.
    layers = []
    for label, members, prefix in groups:
        if not any(EXPERT_RE.match(x) for x in members):
            layers.append((prefix, members, members))
    for pre, experts in moe.items():
        layers.append((pre, [m for e in experts.values() for m in e.values()], []))
    grouped = {m for _, mem, _ in layers for m in mem}
    for m in modules:
        if m not in grouped:
            layers.append((m, [m], []))
    for prefix, members, shards in sorted(layers):
        quant = [m in fmt for m in members]
        for pats, tag in ((excl, "as listed"), (expanded, "after vLLM's x* -> x, x.* rewrite")):
            ex, err = vllm_excluded(prefix, shards, pats)
            C.check(err is None, f"[exclude] {prefix}: {err} ({tag})")
            if len(set(quant)) != 1:
                continue  # the status mismatch itself is reported under [group]/[moe]
            C.check(ex == (not quant[0]), f"[exclude] vLLM layer {prefix} is {'excluded' if ex else 'quantized'} "
                    f"under vLLM's rule ({tag}) but its weights are {'quantized' if quant[0] else 'unquantized'}")

    # ---------------------------------------------------------------- §6 numerics
    group_of = {}
    for label, members, _ in groups:
        for m in members:
            group_of[m] = members
    for m, f in sorted(fmt.items()):
        if any(n not in out_t for n in quant_tensor_names(m, f)):
            continue
        w = src.weight(m)
        out_f, in_f = w.shape
        wq = out_t[m + ".weight"].array(m + ".weight")
        amax = F32(np.abs(w).max()) if w.size else F32(0)
        if f in ("NVFP4", "W4A16_NVFP4"):
            g = scalar_f32(out_t, m + ".weight_scale_2")
            bs = gs if f == "W4A16_NVFP4" else 16
            if g is None or in_f % bs or wq.shape != (out_f, in_f // 2):
                continue
            gam = amax
            for o in shared_in.get(m, group_of.get(m, [m])):
                if o != m:
                    gam = max(gam, F32(np.abs(src.weight(o)).max()))
            want_g = F32(gam * INV_2688)
            if src.compressed.get(m, ("",))[0] == "mxfp4" and f32_bits(g) != f32_bits(want_g):
                # The closed-form MXFP4 -> NVFP4 conversion (--exact_mxfp4): the export must
                # dequantize to the source's values exactly.
                got_sb = out_t[m + ".weight_scale"].array(m + ".weight_scale")
                codes = np.empty((out_f, in_f), np.uint8)
                codes[:, 0::2] = wq & 0xF
                codes[:, 1::2] = wq >> 4
                with np.errstate(all="ignore"):
                    d = (E4M3_TABLE[got_sb] * g).astype(F32)
                    deq = (E2M1_VALUES[codes] * np.repeat(d, 16, axis=1)).astype(F32)
                nbad = int((deq != w).sum())
                C.check(nbad == 0, f"[numerics] {m}: weight_scale_2 {fmt_f32(g)} is not the group amax "
                        f"formula ({fmt_f32(want_g)}) and the export is not an exact MXFP4 conversion: "
                        f"{nbad} of {w.size} values differ from the source")
                continue
            C.check(f32_bits(g) == f32_bits(want_g), f"[numerics] {m}.weight_scale_2 {fmt_f32(g)} != "
                    f"group amax {float(gam):.9g} * fl32(1/2688) = {fmt_f32(want_g)}")
            got_sb = out_t[m + ".weight_scale"].array(m + ".weight_scale")
            if searched_scales:
                # Block scales chosen by a search (mse, local_hessian): any positive finite e4m3
                # byte; the codes must be the encoding under exactly those scales.
                if not C.check(got_sb.shape == (out_f, in_f // 16), f"[numerics] {m}.weight_scale "
                               f"shape {got_sb.shape} != {(out_f, in_f // 16)}"):
                    continue
                nbad = int(((got_sb == 0) | (got_sb >= 0x7F)).sum())
                C.check(nbad == 0, f"[numerics] {m}.weight_scale: {nbad} block scales are not "
                        "positive finite e4m3 values")
                packed, _ = nvfp4_quantize(w, g, 16, got_sb)
                nbad = int((packed != wq).sum())
                C.check(nbad == 0, f"[numerics] {m}.weight: {nbad} of {packed.size} bytes differ from "
                        "the NVFP4 encoding under the exported (searched) scales")
                continue
            packed, sb = nvfp4_quantize(w, g, bs)
            nbad = int((packed != wq).sum())
            C.check(nbad == 0, f"[numerics] {m}.weight: {nbad} of {packed.size} bytes differ from the "
                    "NVFP4 recomputation with the exported weight_scale_2")
            if got_sb.shape == sb.shape:
                nbad = int((sb != got_sb).sum())
                C.check(nbad == 0, f"[numerics] {m}.weight_scale: {nbad} of {sb.size} block scales differ")
        elif f == "FP8":
            s = scalar_f32(out_t, m + ".weight_scale")
            if s is None or wq.shape != (out_f, in_f):
                continue
            # A routed expert's gate and up share one weight amax: transformers 5 holds them as
            # one gate_up_proj per expert, which ModelOpt 0.47 quantizes with one weight
            # quantizer (format.md §2). Dense and shared-expert gate/up keep their own.
            fam = amax
            mm = EXPERT_RE.match(m)
            if mm and GATE_UP[mm.group(3)] != "down":
                for o in group_of.get(m, [m]):
                    if o != m:
                        fam = max(fam, F32(np.abs(src.weight(o)).max()))
            want_s = F32(fam * INV_448)
            C.check(searched_scales or f32_bits(s) == f32_bits(want_s), f"[numerics] {m}.weight_scale {fmt_f32(s)} != "
                    f"{'expert gate/up ' if fam is not amax else ''}amax {float(fam):.9g} * fl32(1/448) = {fmt_f32(want_s)}")
            q8 = fp8_quantize(w, s, modules[m][2])
            nbad = int((q8 != wq).sum())
            C.check(nbad == 0, f"[numerics] {m}.weight: {nbad} of {q8.size} bytes differ from the FP8 "
                    "recomputation with the exported weight_scale")
        elif f == "fp8_pb_wo":
            if wq.shape != (out_f, in_f):
                continue
            # ModelOpt 0.47 unifies the amax of the quantizers reading one input (attention's
            # projections; gate/up) where each has one element: a group of single-block weights
            # shares its max; multi-block weights keep their own blocks (quant/fp8.h).
            grp = [o for o in shared_in.get(m, group_of.get(m, [m])) if fmt.get(o) == f]
            singles = [fp8_pb_scale_shape(*src.weight(o).shape) == () for o in grp]
            C.check(all(singles) or not any(singles), f"[numerics] {m}: fused with {grp}, partly single "
                    "128x128 blocks and partly more (ModelOpt 0.47 cannot export such a group)")
            gam = None
            if len(grp) > 1 and all(singles):
                gam = max(F32(np.abs(src.weight(o)).max()) for o in grp)
            q8, want_s = fp8_pb_quantize(w, gam)
            got = out_t[m + ".weight_scale"].array(m + ".weight_scale")
            if got.size == want_s.size:
                nbad = int((got.reshape(-1).view(np.uint32) != want_s.reshape(-1).view(np.uint32)).sum())
                C.check(nbad == 0, f"[numerics] {m}.weight_scale: {nbad} of {want_s.size} block scales "
                        "differ from block amax * fl32(1/448)"
                        + (f" (group amax {float(gam):.9g})" if gam is not None else ""))
                if nbad == 0:
                    nbad = int((q8 != wq).sum())
                    C.check(nbad == 0, f"[numerics] {m}.weight: {nbad} of {q8.size} bytes differ from "
                            "the FP8 per-block recomputation")
        elif f == "MXFP8":
            if in_f % 32 or wq.shape != (out_f, in_f):
                continue
            q8, e8 = mxfp8_quantize(w)
            got = out_t[m + ".weight_scale"].array(m + ".weight_scale")
            C.check(int((q8 != wq).sum()) == 0, f"[numerics] {m}.weight: MXFP8 bytes differ")
            C.check(got.shape == e8.shape and int((got != e8).sum()) == 0,
                    f"[numerics] {m}.weight_scale: E8M0 exponents differ")
        elif f == "mxfp4":
            if in_f % 32 or wq.shape != (out_f, in_f // 2):
                continue
            q4, e8 = mxfp4_quantize(w)
            got = out_t[m + ".weight_scale"].array(m + ".weight_scale")
            nbad = int((q4 != wq).sum())
            C.check(nbad == 0, f"[numerics] {m}.weight: {nbad} of {q4.size} MXFP4 bytes differ from "
                    "the recomputation")
            C.check(got.shape == e8.shape and int((got != e8).sum()) == 0,
                    f"[numerics] {m}.weight_scale: E8M0 exponents differ")

    # ---------------------------------------------------------------- §7 calibration reference
    if amax_path:
        ref = SafeFile(amax_path)
        for p in ref.problems:
            C.check(False, f"[amax] reference file {amax_path}: {p}")
        rv = {n: float(ref.array(n).reshape(-1)[0]) for n in ref.tensors if n.startswith("ref32.")}
        sets = []  # (modules sharing one input scale)
        done = set()
        for pre, experts in moe.items():
            for which in (("gate", "up"), ("down",)):
                mods = [p[w] for p in experts.values() for w in which if w in p]
                sets.append(mods)
                done.update(mods)
        for label, members, _ in groups:
            if not (set(members) & done):
                sets.append(members)
                done.update(members)
        sets += [[m] for m in fmt if m not in done]
        for mods in sets:
            qm = [m for m in mods if fmt.get(m) in ("NVFP4", "FP8") and (m + ".input_scale") in out_t]
            if not qm:
                continue
            refs = [rv[f"ref32.amax.{m}"] for m in mods if f"ref32.amax.{m}" in rv]
            if not refs:
                C.note(f"{mods[0]}: no reference amax; input_scale not compared")
                continue
            a = F32(max(refs))
            for m in qm:
                inv = INV_2688 if fmt[m] == "NVFP4" else INV_448
                want = F32(a * inv)
                got = scalar_f32(out_t, m + ".input_scale")
                C.check(got is not None and abs(float(got) - float(want)) <= 0.01 * float(want),
                        f"[amax] {m}.input_scale {fmt_f32(got)} != reference amax {float(a):.7g} x "
                        f"fl32(1/{2688 if fmt[m] == 'NVFP4' else 448}) = {float(want):.7g} within 1%")
        if kv_algo in ("FP8", "NVFP4", "NVFP4_AFFINE"):
            for p in sorted(attn):
                mm = re.search(r"layers\.(\d+)\.", p)
                if not mm:
                    continue
                for kv, n in (("k", p + ".k_proj.k_scale"), ("v", p + ".v_proj.v_scale")):
                    key = f"ref32.kv_amax.{mm.group(1)}.{kv}"
                    if key not in rv or n not in out_t:
                        continue
                    if kv_affine:
                        # The bias is a mean of K (V): |b| <= max |K|; the amax is max |K - b| as
                        # the running bias stood after each sequence: at most 2 max |K|. (Its
                        # value needs the K states themselves: tests/peer compares it.)
                        ref, b = float(rv[key]), f"{p}.{kv}_proj.{kv}_bias"
                        got = scalar_f32(out_t, n)
                        C.check(got is not None and float(got) * 448 <= 2 * ref * 1.01,
                                f"[amax] {n} {fmt_f32(got)} x 448 exceeds twice the kv amax {ref:.7g}")
                        if b in out_t and out_t[b].tensors[b][0] in FLOAT_DTYPES:
                            bv = float(np.abs(float_array(out_t[b].tensors[b][0],
                                                          out_t[b].array(b))).max())
                            C.check(bv <= ref * 1.01,
                                    f"[amax] {b}: max |bias| {bv:.7g} exceeds the kv amax {ref:.7g}")
                        continue
                    want = F32(F32(rv[key]) * INV_448)
                    got = scalar_f32(out_t, n)
                    C.check(got is not None and abs(float(got) - float(want)) <= 0.01 * float(want),
                            f"[amax] {n} {fmt_f32(got)} != kv amax {rv[key]:.7g} x fl32(1/448) = "
                            f"{float(want):.7g} within 1%")
    return C


# ------------------------------------------------------------------------------------ self-test

def write_safetensors(path, tensors, gap_after=None):
    """tensors: name -> (dtype, shape, bytes). Sorted names, header padded to 8, contiguous."""
    header, blobs, off = {}, [], 0
    for n in sorted(tensors):
        dt, shp, raw = tensors[n]
        header[n] = {"dtype": dt, "shape": list(shp), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
        if n == gap_after:  # self-test only: 8 stray bytes the header does not account for
            blobs.append(b"\0" * 8)
            off += 8
    text = json.dumps({"__metadata__": {"format": "pt"}, **header}, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def bf16_tensor(a):
    a = round_bf16(np.asarray(a, F32))
    return ("BF16", a.shape, (a.view(np.uint32) >> 16).astype(np.uint16).tobytes())


def f32_scalar(v):
    return ("F32", (), np.array(v, F32).tobytes())


def synth_source(d, rng, n_experts=4):
    """A tiny two-layer model: GQA attention + dense SwiGLU, then MLA + routed/shared MoE."""
    os.makedirs(d)
    H = 32
    t = {}
    w = lambda o, i, s=0.05: bf16_tensor(rng.normal(0, s, (o, i)))
    t["model.embed_tokens.weight"] = w(64, H, 1.0)
    t["lm_head.weight"] = w(64, H)
    t["model.norm.weight"] = bf16_tensor(1 + rng.normal(0, 0.1, H))
    L0 = "model.layers.0."
    for n, (o, i) in {"self_attn.q_proj": (32, H), "self_attn.k_proj": (16, H), "self_attn.v_proj": (16, H),
                      "self_attn.o_proj": (H, 32), "mlp.gate_proj": (64, H), "mlp.up_proj": (64, H),
                      "mlp.down_proj": (H, 64)}.items():
        t[L0 + n + ".weight"] = w(o, i, 0.05 if "v_proj" not in n else 0.2)
    L1 = "model.layers.1."
    for n, (o, i) in {"self_attn.q_a_proj": (32, H), "self_attn.q_b_proj": (64, 32),
                      "self_attn.kv_a_proj_with_mqa": (48, H), "self_attn.kv_b_proj": (64, 32),
                      "self_attn.o_proj": (H, 32), "mlp.gate": (n_experts, H),
                      "mlp.shared_experts.gate_proj": (32, H), "mlp.shared_experts.up_proj": (32, H),
                      "mlp.shared_experts.down_proj": (H, 32)}.items():
        t[L1 + n + ".weight"] = w(o, i)
    for e in range(n_experts):
        for n, (o, i) in {"gate_proj": (32, H), "up_proj": (32, H), "down_proj": (H, 32)}.items():
            t[f"{L1}mlp.experts.{e}.{n}.weight"] = w(o, i, 0.03 * (e + 1))
    t[L1 + "mlp.gate.e_score_correction_bias"] = ("F32", (n_experts,), rng.normal(0, 1, n_experts).astype(F32).tobytes())
    t[L1 + "self_attn.q_a_layernorm.weight"] = bf16_tensor(np.ones(32))
    t[L1 + "self_attn.kv_a_layernorm.weight"] = bf16_tensor(np.ones(32))
    for L in (L0, L1):
        t[L + "input_layernorm.weight"] = bf16_tensor(1 + rng.normal(0, 0.1, H))
        t[L + "post_attention_layernorm.weight"] = bf16_tensor(1 + rng.normal(0, 0.1, H))
    write_safetensors(os.path.join(d, "model.safetensors"), t)
    cfg = {"architectures": ["SynthForCausalLM"], "model_type": "synth", "hidden_size": H,
           "num_hidden_layers": 2, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}}
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
    json.dump({"bos_token_id": 0, "eos_token_id": 1}, open(os.path.join(d, "generation_config.json"), "w"))
    open(os.path.join(d, "tokenizer.json"), "w").write('{"model": {"type": "BPE"}}\n')
    open(os.path.join(d, "chat_template.jinja"), "w").write("{{ messages }}\n")
    # Reference activation amax (as make_fixtures.py writes it); experts 3 never reached.
    ref = {}
    names = [n[:-7] for n in t if n.endswith(".weight") and len(t[n][1]) == 2 and "embed" not in n]
    for m in names:
        if ".experts.3." in m:
            continue
        ref[f"ref32.amax.{m}"] = f32_scalar(F32(rng.uniform(1, 20)))
    for L in (0, 1):
        for kv in "kv":
            ref[f"ref32.kv_amax.{L}.{kv}"] = f32_scalar(F32(rng.uniform(1, 30)))
    write_safetensors(os.path.join(d, "reference.safetensors"), ref)
    return t, ref


def build_export(src_dir, out_dir, t, ref, scheme, n_shards=2):
    """A correct export written with this file's own numerics. scheme: module -> format or None."""
    os.makedirs(out_dir)
    ra = {n[len("ref32.amax."):]: float(np.frombuffer(v[2], F32)[0]) for n, v in ref.items() if ".amax." in n}
    modules = sorted(n[:-7] for n in t if n.endswith(".weight") and len(t[n][1]) == 2 and "embed" not in n)
    w32 = {m: bf16_bits_to_f32(np.frombuffer(t[m + ".weight"][2], np.uint16)).reshape(t[m + ".weight"][1])
           for m in modules}
    groups = {}
    for m in modules:
        if "." not in m:
            continue
        p, leaf = m.rsplit(".", 1)
        for members, _ in FUSED_SIBLINGS:
            if leaf in members and all(f"{p}.{x}" in w32 for x in members):
                groups[m] = [f"{p}.{x}" for x in members]
    # shared input amax sets: fused groups, and MoE gate/up resp. down across experts
    def in_amax(m):
        mm = EXPERT_RE.match(m)
        if mm:
            part = GATE_UP[mm.group(3)]
            mates = [x for x in modules if EXPERT_RE.match(x) and EXPERT_RE.match(x).group(1) == mm.group(1)
                     and (GATE_UP[EXPERT_RE.match(x).group(3)] == "down") == (part == "down")]
        else:
            mates = groups.get(m, [m])
        return F32(max(ra[x] for x in mates if x in ra))
    out = {n: v for n, v in t.items()}
    for m in modules:
        f = scheme(m)
        if f is None:
            continue
        del out[m + ".weight"]
        w = w32[m]
        if f in ("NVFP4", "W4A16_NVFP4"):
            gam = max(F32(np.abs(w32[x]).max()) for x in groups.get(m, [m]))
            g = F32(gam * INV_2688)
            packed, sb = nvfp4_quantize(w, g)
            out[m + ".weight"] = ("U8", packed.shape, packed.tobytes())
            out[m + ".weight_scale"] = ("F8_E4M3", sb.shape, sb.tobytes())
            out[m + ".weight_scale_2"] = f32_scalar(g)
            if f == "NVFP4":
                out[m + ".input_scale"] = f32_scalar(F32(in_amax(m) * INV_2688))
        elif f == "FP8":
            # a routed expert's gate and up share one weight amax (format.md §2)
            mates = groups.get(m, [m]) if EXPERT_RE.match(m) else [m]
            s = F32(max(F32(np.abs(w32[x]).max()) for x in mates) * INV_448)
            q8 = fp8_quantize(w, s, "bf16")
            out[m + ".weight"] = ("F8_E4M3", q8.shape, q8.tobytes())
            out[m + ".weight_scale"] = f32_scalar(s)
            out[m + ".input_scale"] = f32_scalar(F32(in_amax(m) * INV_448))
    for m in modules:
        mm = re.match(r"^(.*layers\.(\d+)\.self_attn)\.o_proj$", m)
        if mm:
            for k, proj in (("k", "k_proj"), ("v", "v_proj")):
                a = F32(np.frombuffer(ref[f"ref32.kv_amax.{mm.group(2)}.{k}"][2], F32)[0])
                out[f"{mm.group(1)}.{proj}.{k}_scale"] = f32_scalar(F32(a * INV_448))
    names = sorted(out)
    wmap = {}
    for k in range(n_shards):
        part = {n: out[n] for i, n in enumerate(names) if i * n_shards // len(names) == k}
        fn = f"model-{k + 1:05d}-of-{n_shards:05d}.safetensors"
        write_safetensors(os.path.join(out_dir, fn), part)
        wmap.update({n: fn for n in part})
    total = sum(len(v[2]) for v in out.values())
    json.dump({"metadata": {"total_size": total}, "weight_map": wmap},
              open(os.path.join(out_dir, "model.safetensors.index.json"), "w"), indent=2)
    excl = sorted([m for m in modules if scheme(m) is None] + ["model.embed_tokens"])
    fmts = sorted({scheme(m) for m in modules} - {None})
    algo = fmts[0] if len(fmts) == 1 else "MIXED_PRECISION"
    prod = {"name": "modelopt", "version": "0.0.0-selftest"}
    qd = {"quant_algo": algo, "kv_cache_quant_algo": "FP8"}
    if algo in ("NVFP4", "W4A16_NVFP4"):
        qd["group_size"] = 16
    qd["exclude_modules"] = excl
    ql = {}
    if algo == "MIXED_PRECISION":
        for m in modules:
            f = scheme(m)
            if f:
                ql[m] = {"quant_algo": f, "group_size": 16} if "NVFP4" in f else {"quant_algo": f}
        qd["quantized_layers"] = ql
    json.dump({"producer": prod, "quantization": qd}, open(os.path.join(out_dir, "hf_quant_config.json"), "w"), indent=4)
    cfg = json.load(open(os.path.join(src_dir, "config.json")))
    nv = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
    f8 = {"dynamic": False, "num_bits": 8, "type": "float"}
    qc = {}
    if algo == "NVFP4":
        qc["config_groups"] = {"group_0": {"input_activations": nv, "weights": nv, "targets": ["Linear"]}}
    elif algo == "FP8":
        qc["config_groups"] = {"group_0": {"input_activations": f8, "weights": f8, "targets": ["Linear"]}}
    else:
        cg = {}
        for i, f in enumerate(fmts):
            grp = {"input_activations": nv, "weights": nv} if f == "NVFP4" else {"input_activations": f8, "weights": f8}
            grp["targets"] = sorted(m for m in ql if ql[m]["quant_algo"] == f)
            cg[f"group_{i}"] = grp
        qc["config_groups"] = cg
        qc["quantized_layers"] = ql
    qc.update({"ignore": excl, "quant_algo": algo, "kv_cache_scheme": f8, "producer": prod,
               "quant_method": "modelopt"})
    cfg["quantization_config"] = qc
    json.dump(cfg, open(os.path.join(out_dir, "config.json"), "w"), indent=2)
    for f in os.listdir(src_dir):
        if not f.endswith(WEIGHT_EXT) and f not in ("config.json", "model.safetensors.index.json"):
            shutil.copy(os.path.join(src_dir, f), os.path.join(out_dir, f))


def _edit_json(path, fn):
    d = json.load(open(path))
    r = fn(d)
    d = r if isinstance(r, dict) else d
    json.dump(d, open(path, "w"), indent=2)


def _rewrite_tensors(out_dir, fn):
    """Apply fn(dict name -> (dtype, shape, bytes)) to every shard's tensors and rewrite the shards."""
    for f in sorted(os.listdir(out_dir)):
        if not f.endswith(".safetensors"):
            continue
        p = os.path.join(out_dir, f)
        sf = SafeFile(p)
        t = {n: (sf.tensors[n][0], sf.tensors[n][1], sf.raw(n)) for n in sf.tensors}
        del sf
        t2 = fn(t)
        write_safetensors(p, t if t2 is None else t2)
    _refresh_total_size(out_dir)


def _refresh_total_size(out_dir):
    """Keep the index's total_size right, so a mutation is flagged for what it breaks."""
    p = os.path.join(out_dir, "model.safetensors.index.json")
    if os.path.exists(p):
        tot = sum(e - b for f in os.listdir(out_dir) if f.endswith(".safetensors")
                  for (_, _, b, e) in SafeFile(os.path.join(out_dir, f)).tensors.values())
        _edit_json(p, lambda d: d["metadata"].update(total_size=tot))


def _set_scalar(name, value):
    def fn(t):
        if name in t:
            t[name] = f32_scalar(value)
    return fn


def _scalar_of(out_dir, name):
    return F32(load_dir_tensors(out_dir)[name].array(name).reshape(-1)[0])


def mutations():
    """(label, fn(out_dir)) pairs; each must make the checker fail."""
    L0, L1 = "model.layers.0.", "model.layers.1."
    idx = "model.safetensors.index.json"
    hq = "hf_quant_config.json"

    def drop(*names):
        def fn(o):
            _rewrite_tensors(o, lambda t: {n: v for n, v in t.items() if n not in names})
            _edit_json(os.path.join(o, idx), lambda d: d.update(weight_map=
                {n: f for n, f in d["weight_map"].items() if n not in names}))
        return fn

    def flip_byte(name, pos=0, bit=1):
        def fn(o):
            def g(t):
                if name in t:
                    dt, shp, raw = t[name]
                    b = bytearray(raw)
                    b[pos] ^= bit
                    t[name] = (dt, shp, bytes(b))
            _rewrite_tensors(o, g)
        return fn

    def scale_scalar(name, factor):
        def fn(o):
            v = _scalar_of(o, name)
            _rewrite_tensors(o, _set_scalar(name, F32(v * F32(factor))))
        return fn

    def both_cfgs(edit):
        def fn(o):
            _edit_json(os.path.join(o, hq), lambda d: edit(d["quantization"], "exclude_modules"))
            _edit_json(os.path.join(o, "config.json"), lambda d: edit(d["quantization_config"], "ignore"))
        return fn

    def gap(o):
        shard = sorted(f for f in os.listdir(o) if f.endswith(".safetensors"))[0]
        p = os.path.join(o, shard)
        sf = SafeFile(p)
        names = sorted(sf.tensors)
        t = {n: (sf.tensors[n][0], sf.tensors[n][1], sf.raw(n)) for n in names}
        del sf
        write_safetensors(p, t, gap_after=names[0])

    def rename_shard(o):
        a = "model-00002-of-00002.safetensors"
        os.rename(os.path.join(o, a), os.path.join(o, "model-2-of-2.safetensors"))
        _edit_json(os.path.join(o, idx), lambda d: d["weight_map"].update(
            {n: "model-2-of-2.safetensors" for n, f in d["weight_map"].items() if f == a}))

    def overlap(o):
        shard = sorted(f for f in os.listdir(o) if f.endswith(".safetensors"))[0]
        p = os.path.join(o, shard)
        raw = open(p, "rb").read()
        (n,) = struct.unpack("<Q", raw[:8])
        h = json.loads(raw[8:8 + n])
        ks = [k for k in h if k != "__metadata__"]
        b0, e0 = h[ks[0]]["data_offsets"]
        b1, e1 = h[ks[1]]["data_offsets"]
        h[ks[1]]["data_offsets"] = [b0, b0 + (e1 - b1)] if e1 - b1 <= e0 - b0 else [b1, e1]
        h[ks[0]]["data_offsets"], h[ks[1]]["data_offsets"] = h[ks[1]]["data_offsets"], [b0, e0]
        text = json.dumps(h).encode()
        text += b" " * (-len(text) % 8)
        open(p, "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])

    def bad_header(o):
        shard = sorted(f for f in os.listdir(o) if f.endswith(".safetensors"))[0]
        p = os.path.join(o, shard)
        raw = bytearray(open(p, "rb").read())
        raw[9] = ord("#")
        open(p, "wb").write(bytes(raw))

    def requant_group_ws2(o):
        # Consistent bytes for a wrong global scale: numerics pass, the amax rule must fail.
        src = os.path.join(os.path.dirname(o), "src")
        S = Source(src)
        def g(t):
            for m in (L0 + "self_attn.q_proj", L0 + "self_attn.k_proj", L0 + "self_attn.v_proj"):
                gs = F32(np.frombuffer(t[m + ".weight_scale_2"][2], F32)[0] * F32(1.5))
                packed, sb = nvfp4_quantize(S.weight(m), gs)
                t[m + ".weight"] = ("U8", packed.shape, packed.tobytes())
                t[m + ".weight_scale"] = ("F8_E4M3", sb.shape, sb.tobytes())
                t[m + ".weight_scale_2"] = f32_scalar(gs)
        # all of q/k/v sit in one of the shards or across both: rewrite with the union
        allt = {}
        for f in sorted(os.listdir(o)):
            if f.endswith(".safetensors"):
                sf = SafeFile(os.path.join(o, f))
                allt.update({n: (sf.tensors[n][0], sf.tensors[n][1], sf.raw(n)) for n in sf.tensors})
        g(allt)
        _rewrite_tensors(o, lambda t: {n: allt[n] for n in t})

    def stale_qc(o):
        _edit_json(os.path.join(o, "config.json"), lambda d: d.update(
            quantization_config={"quant_method": "fp8", "fmt": "e4m3"}))

    def nested_stale(o):
        _edit_json(os.path.join(o, "config.json"), lambda d: d.update(
            text_config={"quantization_config": {"quant_method": "fp8"}}))

    def key_order(o):
        _edit_json(os.path.join(o, hq), lambda d: {"producer": d["producer"], "quantization": dict(
            reversed(list(d["quantization"].items())))})

    def lower_algo(o):
        _edit_json(os.path.join(o, hq), lambda d: d["quantization"].update(quant_algo="nvfp4"))

    def shape_1(name):
        def fn(o):
            def g(t):
                if name in t:
                    dt, shp, raw = t[name]
                    t[name] = (dt, (1,), raw)
            _rewrite_tensors(o, g)
        return fn

    def sidecar(o):
        open(os.path.join(o, "tokenizer.json"), "a").write(" ")

    def no_sidecar(o):
        os.remove(os.path.join(o, "chat_template.jinja"))

    def tweak_router(o):
        flip_byte(L1 + "mlp.gate.weight", 3, 0x40)(o)

    def tweak_bias(o):
        flip_byte(L1 + "mlp.gate.e_score_correction_bias", 0, 0x01)(o)

    def index_missing(o):
        _edit_json(os.path.join(o, idx), lambda d: d["weight_map"].pop("model.norm.weight"))

    def expert_input_scale_differs(o):
        scale_scalar(L1 + "mlp.experts.2.up_proj.input_scale", 1.25)(o)
        scale_scalar(L1 + "mlp.experts.2.gate_proj.input_scale", 1.25)(o)

    def extra_tensor(o):
        _rewrite_tensors(o, lambda t: t.update({"model.layers.0.mlp.down_proj.pre_quant_scale":
                                                f32_scalar(1.0)}) if "model.norm.weight" in t else None)
        _edit_json(os.path.join(o, idx), lambda d: d["weight_map"].update(
            {"model.layers.0.mlp.down_proj.pre_quant_scale": d["weight_map"]["model.norm.weight"]}))

    def unquantize_k(o):
        # k_proj written as bf16 and listed as excluded: group status mismatch + vLLM shard error.
        src = os.path.join(os.path.dirname(o), "src")
        S = SafeFile(os.path.join(src, "model.safetensors"))
        m = L0 + "self_attn.k_proj"
        raw = S.raw(m + ".weight")
        def g(t):
            for suf in (".weight", ".weight_scale", ".weight_scale_2", ".input_scale"):
                t.pop(m + suf, None)
            if "model.norm.weight" in t:
                t[m + ".weight"] = ("BF16", (16, 32), raw)
        _rewrite_tensors(o, g)
        def ix(d):
            wm = d["weight_map"]
            f = wm["model.norm.weight"]
            for suf in (".weight_scale", ".weight_scale_2", ".input_scale"):
                wm.pop(m + suf, None)
            wm[m + ".weight"] = f
        _edit_json(os.path.join(o, idx), ix)
        both_cfgs(lambda q, k: q.__setitem__(k, sorted(q[k] + [m])))(o)

    E = "model.layers.1.mlp.experts."
    return [  # (label, text a failure line must contain, mutation)
        ("drop an expert's input_scale", "some missing", drop(E + "1.gate_proj.input_scale")),
        ("q/k/v weight_scale_2 mismatch", "[group] qkv_proj", scale_scalar(L0 + "self_attn.k_proj.weight_scale_2", 1.01)),
        ("q/k/v input_scale mismatch", "input_scale differ", scale_scalar(L0 + "self_attn.v_proj.input_scale", 1.001)),
        ("gate/up weight_scale_2 mismatch in an expert", "weight_scale_2 differ", scale_scalar(E + "0.up_proj.weight_scale_2", 0.99)),
        ("MLA q_a/kv_a input_scale mismatch", "[group] fused_qkv_a_proj", scale_scalar(L1 + "self_attn.q_a_proj.input_scale", 2.0)),
        ("dense gate/up input_scale mismatch", "[group] gate_up_proj model.layers.0", scale_scalar(L0 + "mlp.up_proj.input_scale", 1.5)),
        ("flip a weight byte", "[numerics] model.layers.0.mlp.down_proj.weight", flip_byte(L0 + "mlp.down_proj.weight", 5, 0x10)),
        ("flip a block-scale byte", "block scales differ", flip_byte(L1 + "self_attn.kv_b_proj.weight_scale", 2, 0x01)),
        ("weight_scale_2 off the amax rule, bytes consistent", "fl32(1/2688)", requant_group_ws2),
        ("uncovered unquantized module (lm_head)", "unquantized lm_head not covered", both_cfgs(lambda q, k: q.__setitem__(k, [x for x in q[k] if x != "lm_head"]))),
        ("embedding not listed", "embedding model.embed_tokens not in exclude_modules", both_cfgs(lambda q, k: q.__setitem__(k, [x for x in q[k] if x != "model.embed_tokens"]))),
        ("uncovered router", "vLLM layer model.layers.1.mlp.gate is quantized", both_cfgs(lambda q, k: q.__setitem__(k, [x for x in q[k] if not x.endswith("mlp.gate")]))),
        ("exclude entry covering quantized modules (substring)", "vLLM layer model.layers.0.mlp.gate_up_proj is excluded", both_cfgs(lambda q, k: q.__setitem__(k, sorted(q[k] + ["model.layers.0.mlp"])))),
        ("bare layer prefix hits other layers", "is excluded under vLLM", both_cfgs(lambda q, k: q.__setitem__(k, sorted(q[k] + ["model.layers.1*"])))),
        ("one routed expert listed excluded (vLLM excludes the FusedMoE)", "vLLM layer model.layers.1.mlp.experts is excluded", both_cfgs(lambda q, k: q.__setitem__(k, sorted(q[k] + [E + "0.down_proj"])))),
        ("exclude_modules unsorted", "not sorted", both_cfgs(lambda q, k: q.__setitem__(k, list(reversed(q[k]))))),
        ("ignore != exclude_modules", "ignore != exclude_modules", lambda o: _edit_json(os.path.join(o, "config.json"), lambda d: d["quantization_config"]["ignore"].pop())),
        ("stale source quantization_config", "stale source quantization_config", stale_qc),
        ("stale nested quantization_config", "stale quantization_config left", nested_stale),
        ("hf_quant_config key order", "quantization keys", key_order),
        ("lower-case quant_algo", "not an upper-case", lower_algo),
        ("kv_cache_quant_algo unset but k/v scales written", "k/v scale without", lambda o: _edit_json(os.path.join(o, hq), lambda d: d["quantization"].update(kv_cache_quant_algo=None))),
        ("gap in a safetensors file", "(gap)", gap),
        ("overlapping tensor offsets", "invalid safetensors", overlap),
        ("corrupt safetensors header", "invalid header JSON", bad_header),
        ("shard misnamed", "not named model-0000k", rename_shard),
        ("index misses a tensor", "index maps model.norm.weight to None", index_missing),
        ("sidecar modified", "sidecar tokenizer.json differs", sidecar),
        ("sidecar missing", "sidecar chat_template.jinja", no_sidecar),
        ("router weight changed", "mlp.gate.weight: bytes differ", tweak_router),
        ("e_score_correction_bias changed", "e_score_correction_bias: bytes differ", tweak_bias),
        ("a SRC norm dropped", "post_attention_layernorm.weight missing", drop("model.layers.1.post_attention_layernorm.weight")),
        ("an expert missing all its down_proj tensors", "experts.3: model.layers.1.mlp.experts.3.down_proj", drop(*[E + "3.down_proj" + s for s in (".weight", ".weight_scale", ".weight_scale_2", ".input_scale")])),
        ("k_scale missing", "k_scale missing", drop(L1 + "self_attn.k_proj.k_scale")),
        ("weight_scale_2 shaped [1]", "want F32 []", shape_1(L1 + "self_attn.o_proj.weight_scale_2")),
        ("one expert's gate/up input_scale differs from the others", "not one shared value", expert_input_scale_differs),
        ("unexpected extra tensor", "pre_quant_scale is neither", extra_tensor),
        ("k_proj unquantized, q/v quantized", "some but not all shards", unquantize_k),
        ("input_scale 5% off the reference amax (--amax)", "[amax] model.layers.0.mlp.down_proj", scale_scalar(L0 + "mlp.down_proj.input_scale", 1.05)),
        ("k_scale 5% off the reference kv amax (--amax)", "[amax] model.layers.0.self_attn.k_proj.k_scale", scale_scalar(L0 + "self_attn.k_proj.k_scale", 0.95)),
        ("total_size wrong", "total_size", lambda o: _edit_json(os.path.join(o, idx), lambda d: d["metadata"].update(total_size=1))),
    ]


def check_numerics_against_vectors(path):
    """Compare this file's numpy numerics with tests/quant/fixtures/quant_vectors.bin."""
    data = open(path, "rb").read()
    if data[:8] != b"STQVEC01":
        return ["bad magic"]
    pos, rec = 8, {}
    while pos < len(data):
        (n,) = struct.unpack_from("<H", data, pos); pos += 2
        name = data[pos:pos + n].decode(); pos += n
        code, ndim = struct.unpack_from("<BB", data, pos); pos += 2
        shape = struct.unpack_from("<%dI" % ndim, data, pos); pos += 4 * ndim
        (nb,) = struct.unpack_from("<I", data, pos); pos += 4
        rec[name] = (code, shape, data[pos:pos + nb]); pos += nb

    def arr(name):
        code, shape, raw = rec[name]
        if code == 0:
            return np.frombuffer(raw, np.uint8).reshape(shape)
        if code == 1:
            return bf16_bits_to_f32(np.frombuffer(raw, np.uint16)).reshape(shape)
        if code == 3:
            return np.frombuffer(raw, np.float16).astype(F32).reshape(shape)
        return np.frombuffer(raw, F32).reshape(shape)
    kinds = {0: "u8", 1: "bf16", 2: "f32", 3: "f16"}
    bad, n = [], 0
    for case in sorted({k.split("/")[1] for k in rec if k.startswith("nvfp4/")}):
        w = arr(f"nvfp4/{case}/input")
        w2 = w.reshape(-1, w.shape[-1])
        g = arr(f"nvfp4/{case}/global_scale").reshape(-1)[0]
        amax = arr(f"nvfp4/{case}/amax").reshape(-1)[0]
        n += 1
        if f32_bits(F32(amax * INV_2688)) != f32_bits(g):
            bad.append(f"nvfp4/{case}: global scale")
        p, s = nvfp4_quantize(w2, g)
        if p.tobytes() != arr(f"nvfp4/{case}/packed").tobytes():
            bad.append(f"nvfp4/{case}: packed")
        if s.tobytes() != arr(f"nvfp4/{case}/block_scale").tobytes():
            bad.append(f"nvfp4/{case}: block scales")
        sc = arr(f"fp8/{case}/scale").reshape(-1)[0]
        q = fp8_quantize(w2, sc, kinds[rec[f"fp8/{case}/input"][0]])
        if q.tobytes() != arr(f"fp8/{case}/weight").tobytes():
            bad.append(f"fp8/{case}: weight")
        q, e = mxfp8_quantize(w2)
        if q.tobytes() != arr(f"mxfp8/{case}/weight").tobytes() or e.tobytes() != arr(f"mxfp8/{case}/scale").tobytes():
            bad.append(f"mxfp8/{case}")
    a = arr("nvfp4_input_scale/all/amax")
    if (a * INV_2688).astype(F32).tobytes() != arr("nvfp4_input_scale/all/scale").tobytes():
        bad.append("nvfp4 input scales")
    print(f"self-test: numerics vs {os.path.relpath(path)}: {n} cases x 3 formats, "
          f"{'all bytes equal' if not bad else 'MISMATCH ' + ', '.join(bad)}")
    return bad


def self_test():
    ok = True
    here = os.path.dirname(os.path.abspath(__file__))
    vec = os.path.join(here, "..", "quant", "fixtures", "quant_vectors.bin")
    if os.path.exists(vec):
        ok &= not check_numerics_against_vectors(vec)
    else:
        print("self-test: quant_vectors.bin not found, numerics cross-check skipped")
    # Also the e4m3 encoder over every finite e4m3 value and the midpoints between them.
    vals = E4M3_TABLE[np.isfinite(E4M3_TABLE)]
    enc_ok = np.array_equal(E4M3_TABLE[e4m3_encode(vals)], vals)
    print(f"self-test: e4m3 encoder round-trips all 254 finite values: {enc_ok}")
    ok &= enc_ok
    tmp = tempfile.mkdtemp(prefix="strata_export_check_")
    try:
        rng = np.random.default_rng(1234)
        src = os.path.join(tmp, "src")
        t, ref = synth_source(src, rng)
        refpath = os.path.join(src, "reference.safetensors")

        def nvfp4_scheme(m):
            return None if (m == "lm_head" or m.endswith("mlp.gate")) else "NVFP4"

        def mixed_scheme(m):
            if m == "lm_head" or m.endswith("mlp.gate"):
                return None
            return "FP8" if ".self_attn." in m else "NVFP4"

        def fp8_scheme(m):
            return None if (m == "lm_head" or m.endswith("mlp.gate") or "kv_b_proj" in m) else "FP8"

        for label, scheme in (("NVFP4", nvfp4_scheme), ("FP8", fp8_scheme), ("MIXED_PRECISION", mixed_scheme)):
            out = os.path.join(tmp, "out_" + label)
            build_export(src, out, t, ref, scheme)
            C = run_checks(src, out, refpath, verbose=False)
            good = C.failed == 0 and C.passed > 100
            print(f"self-test: correct {label} export: {C.passed} passed, {C.failed} failed -> "
                  f"{'ok' if good else 'UNEXPECTED'}")
            for line in C.messages[:10]:
                print("    " + line)
            ok &= good
        base = os.path.join(tmp, "out_NVFP4")
        muts = mutations()
        caught = 0
        for label, tag, fn in muts:
            out = os.path.join(tmp, "mut")
            shutil.rmtree(out, ignore_errors=True)
            shutil.copytree(base, out)
            fn(out)
            C = run_checks(src, out, refpath, verbose=False)
            hit = [x for x in C.messages if tag in x]
            flagged = C.failed > 0 and bool(hit)
            caught += flagged
            ok &= flagged
            shown = (hit or C.messages or [""])[0]
            print(f"self-test: {'flagged' if flagged else 'MISSED '} {label}: {C.failed} failed"
                  + (f"\n      {shown[:160]}" if shown else ""))
            if not flagged:
                for line in C.messages[:8]:
                    print("      other: " + line[:160])
        print(f"self-test: {caught} of {len(muts)} broken exports flagged for the intended rule")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("self-test: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", nargs="?", help="source Hugging Face checkpoint directory")
    ap.add_argument("out", nargs="?", help="strata's ModelOpt export directory")
    ap.add_argument("--amax", help="transformers reference (ref32.amax.*, ref32.kv_amax.*) to compare "
                    "input/k/v scales with, when strata calibrated on exactly those tokens")
    ap.add_argument("--searched-scales", action="store_true",
                    help="weight scales come from a search (a recipe with algorithm mse or "
                    "local_hessian): NVFP4 block scales and FP8 weight scales are not the max "
                    "formula's; the weight bytes must still be the encoding under them")
    ap.add_argument("--self-test", action="store_true", help="check the checker on broken exports")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if not args.src or not args.out:
        ap.error("SRC_DIR and OUT_DIR are required (or --self-test)")
    C = run_checks(args.src, args.out, args.amax, searched_scales=args.searched_scales)
    print(f"{C.passed} passed, {C.failed} failed")
    return 1 if C.failed else 0


if __name__ == "__main__":
    sys.exit(main())
