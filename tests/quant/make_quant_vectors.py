#!/usr/bin/env python3
"""Independent reference for strata's NVFP4, FP8 and MXFP8 numerics (format.md §1-3, §7).

Regenerate the committed fixture (from the repository root):

    python3 -m pip install numpy ml_dtypes
    python3 tests/quant/make_quant_vectors.py --out tests/quant/fixtures/quant_vectors.bin

Check the fixture against PyTorch, on CUDA when available (the GPU machine has torch):

    python3 tests/quant/make_quant_vectors.py --torch --out tests/quant/fixtures/quant_vectors.bin

--torch writes nothing: it recomputes every case with PyTorch tensor operations laid out the way
ModelOpt's export evaluates them (amax as a 0-d device tensor divided by a Python number, the
weight divided by a 0-d scale tensor in the weight's dtype, ...), compares with the numpy results
and with the fixture file, prints one line per case and exits non-zero on any difference.

This file is written independently of quant/*.cpp: whole-array numpy, element casts through
ml_dtypes (bfloat16, float16, float8_e4m3fn, float4_e2m1fn), exponents through np.frexp.

Fixture format (little-endian), one file:
    8 bytes   magic b"STQVEC01"
    records until end of file:
        u16   name length, then the name (ASCII), "<format>/<case>/<field>"
        u8    element type: 0 = u8, 1 = bf16 (raw bits), 2 = f32, 3 = f16 (raw bits)
        u8    ndim, then ndim x u32 dimensions
        u32   byte count, then the bytes (row-major)
Formats and fields:
    nvfp4/<case>/{input, amax, packed, block_scale, global_scale}
    fp8/<case>/{input, amax, weight, scale}
    mxfp8/<case>/{input, weight, scale}
    nvfp4_input_scale/all/{amax, scale}, fp8_input_scale/all/{amax, scale},
    fp8_kv_scale/all/{amax, scale}
"""

import argparse
import struct
import sys

import numpy as np

try:  # not needed for --torch, which reads everything it checks from the fixture
    import ml_dtypes
    BF16 = ml_dtypes.bfloat16
    E4M3 = ml_dtypes.float8_e4m3fn
    E2M1 = ml_dtypes.float4_e2m1fn
except ImportError:
    ml_dtypes = None

F32 = np.float32

# fp32 reciprocals the GPU multiplies with when ModelOpt divides a CUDA tensor by a Python number.
INV_2688 = F32(1.0) / F32(2688.0)
INV_448 = F32(1.0) / F32(448.0)

TYPE_CODE = {"u8": 0, "bf16": 1, "f32": 2, "f16": 3}


# ---------------------------------------------------------------- numpy reference

def round_to(x32, kind):
    """Round fp32 values to the source dtype and back (RNE)."""
    if kind == "bf16":
        return x32.astype(BF16).astype(F32)
    if kind == "f16":
        return x32.astype(np.float16).astype(F32)
    return x32


def e4m3_bytes(x32):
    return np.asarray(x32, dtype=F32).astype(E4M3).view(np.uint8)


def nvfp4_np(w32, amax):
    """w32: fp32 values of the weight [..., in]; amax: per-tensor weight amax."""
    g = F32(amax) * INV_2688                       # weight_scale_2
    blocks = w32.reshape(*w32.shape[:-1], -1, 16)
    a_b = np.abs(blocks).max(axis=-1)
    s = a_b / (F32(6.0) * g)                       # fp32 array / fp32 scalar
    s = np.where(s == 0, F32(1.0), s)
    s = np.clip(s, F32(2.0 ** -9), F32(448.0)).astype(F32)
    scale_bytes = e4m3_bytes(s)
    descale = scale_bytes.view(E4M3).astype(F32) * g
    x = blocks / descale[..., None]
    magnitude = np.minimum(np.abs(x), F32(6.0)).astype(E2M1).view(np.uint8) & 0x7
    codes = (magnitude | ((x < 0).astype(np.uint8) << 3)).reshape(w32.shape)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return packed, scale_bytes.reshape(*w32.shape[:-1], -1), np.array(g, dtype=F32)


def fp8_np(w32, amax, kind):
    scale = F32(amax) * INV_448
    divisor = round_to(np.array([scale], dtype=F32), kind)[0]
    q = round_to((w32 / divisor).astype(F32), kind)
    q = np.clip(q, F32(-448.0), F32(448.0))
    return e4m3_bytes(q), np.array(scale, dtype=F32)


def mxfp8_np(w32):
    blocks = w32.reshape(*w32.shape[:-1], -1, 32)
    a_b = np.abs(blocks).max(axis=-1)
    d = (a_b * INV_448).astype(F32)
    mant, exp = np.frexp(d)                        # d = mant * 2^exp, mant in [0.5, 1)
    ceil_log2 = np.where(mant == 0.5, exp - 1, exp)
    e = np.where(d > 0, ceil_log2, -127)
    e = np.clip(e, -127, 127).astype(np.int32)
    q = np.ldexp(blocks, -e[..., None]).astype(F32)
    q = np.clip(q, F32(-448.0), F32(448.0))
    return e4m3_bytes(q).reshape(w32.shape), (e + 127).astype(np.uint8)


def fp8_input_scale_np(amax):
    a = np.asarray(amax, dtype=F32).copy()
    a[(a == 0) | np.isnan(a)] = F32(448.0)
    a = np.clip(a, np.finfo(F32).tiny, np.finfo(F32).max)
    return (a * INV_448).astype(F32)


# ---------------------------------------------------------------- torch, ModelOpt's layout

def torch_results(w, amax, device):
    """w: the weight as a torch tensor of its own dtype on `device`."""
    import torch
    out = {}
    # NVFP4 (get_weights_scaling_factor_2 / get_weights_scaling_factor / quantize).
    amax_t = torch.tensor(float(amax), dtype=torch.float32, device=device)
    g = amax_t.float() / (6.0 * 448.0)
    wb = w.view(*w.shape[:-1], -1, 16)
    a_b = wb.abs().amax(dim=-1).float()
    s = a_b / (6.0 * g)
    s[s == 0] = 1.0
    s = s.clamp(min=2 ** -9).to(torch.float8_e4m3fn)
    x = wb / (s.to(torch.float32) * g).unsqueeze(-1)
    ax = x.abs()
    code = ((ax > 0.25).int() + (ax >= 0.75).int() + (ax > 1.25).int() + (ax >= 1.75).int()
            + (ax > 2.5).int() + (ax >= 3.5).int() + (ax > 5.0).int())
    code = (code + (x < 0).int() * 8).to(torch.uint8).view(w.shape)
    packed = code[..., 0::2] | (code[..., 1::2] << 4)
    out["nvfp4"] = (packed.cpu().numpy(), s.view(torch.uint8).cpu().numpy(),
                    np.array(g.cpu().item(), dtype=F32))
    # FP8 (per-tensor amax is 0-d: scale = amax / 448.0 on the device; weight / scale).
    scale = amax_t / 448.0
    q = (w / scale).to(torch.float8_e4m3fn)
    out["fp8"] = (q.view(torch.uint8).cpu().numpy(), np.array(scale.cpu().item(), dtype=F32))
    # MXFP8 (_compute_e8m0_exponent / quantize_with_scale).
    wm = w.view(*w.shape[:-1], -1, 32)
    descale = wm.abs().amax(dim=-1).float() / 448.0
    lg = torch.where(descale > 0, torch.log2(descale),
                     torch.tensor(-127.0, device=device))
    e = torch.clamp(torch.ceil(lg), min=-127, max=127)
    biased = (e + 127).to(torch.uint8)
    factor = torch.exp2(127 - biased.float())
    qm = torch.clamp(wm * factor.unsqueeze(-1), min=-448.0, max=448.0).to(torch.float8_e4m3fn)
    out["mxfp8"] = (qm.view(torch.uint8).view(w.shape).cpu().numpy(), biased.cpu().numpy())
    return out


def torch_scalar_scales(amaxes, device):
    import torch
    a = torch.tensor(amaxes, dtype=torch.float32, device=device)
    nv = (a.float() / (6.0 * 448.0)).cpu().numpy()
    fp8_in = a.clone()
    fp8_in[fp8_in == 0] = 448.0
    fp8_in = torch.nan_to_num(fp8_in, nan=448.0)
    fp8_in = fp8_in.clamp(min=torch.finfo(torch.float32).tiny, max=torch.finfo(torch.float32).max)
    fp8_in = (fp8_in.float() / 448.0).cpu().numpy()
    kv = (a.float() / 448).cpu().numpy()
    return nv, fp8_in, kv


# ---------------------------------------------------------------- cases

def bf16_of(x):
    return np.asarray(x, dtype=F32).astype(BF16)


def make_cases():
    """Returns [(name, kind, stored input array, amax for nvfp4/fp8)]."""
    cases = []

    def add(name, kind, x, amax_factor=1.0):
        x = np.asarray(x, dtype=F32)
        if kind == "bf16":
            stored = x.astype(BF16)
        elif kind == "f16":
            stored = x.astype(np.float16)
        else:
            stored = x
        own = float(np.abs(stored.astype(F32)).max())
        cases.append((name, kind, stored, F32(own * amax_factor) if own > 0 else F32(1.0)))

    rng = np.random.default_rng(20240611)
    add("bf16_normal_0.02", "bf16", rng.normal(0, 0.02, (32, 256)))
    add("bf16_normal_1_groupmax", "bf16", rng.normal(0, 1.0, (16, 128)), amax_factor=4.0)
    add("bf16_student_t", "bf16", rng.standard_t(2.0, (32, 256)) * 0.05)
    add("f32_uniform_3", "f32", rng.uniform(-3, 3, (16, 128)))
    wide = np.exp(rng.uniform(-20, 5, (16, 256))) * rng.choice([-1.0, 1.0], (16, 256))
    add("f32_wide_range", "f32", wide)
    add("f16_normal_0.1", "f16", rng.normal(0, 0.1, (8, 64)))
    add("bf16_3d", "bf16", rng.normal(0, 0.5, (2, 8, 64)))
    # Tiny blocks next to a large one: block scales clamp at 2^-9, elements underflow.
    tiny = rng.normal(0, 1e-6, (8, 128))
    tiny[:, :16] = rng.normal(0, 1.0, (8, 16))
    add("bf16_tiny_blocks", "bf16", tiny)
    # Hand-made edge rows: zero blocks, exact e2m1 ties at block scale 1 (amax 2688 makes
    # weight_scale_2 exactly 1), negative values that round to zero, a row of one outlier.
    edge = np.zeros((4, 64), dtype=F32)
    ties = [6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5,
            -0.1]
    edge[0, 16:32] = ties
    edge[1, :] = rng.normal(0, 1, 64)
    edge[1, 37] = 300.0
    edge[2, 32:48] = [6, 5.5, -5.5, 4.5, 0.2, -0.2, 0.3, -0.3, 0.7, 0.8, 2.9, 3.1, -3.9, 4.1,
                      -0.0, 1e-3]
    edge[3, :] = 2.0 ** -12 * rng.choice([-6, -3, 0, 1.5, 3, 6], 64)
    cases.append(("bf16_edges_amax2688", "bf16", edge.astype(BF16), F32(2688.0)))
    return cases


def scalar_amaxes():
    vals = [448.0, 2688.0, 1.0, 1.03125, 1.015625, 3.0, 0.1, 1e-3, 17.25, 1e4, 6.5e4, 0.0,
            float("nan"), float("inf"), 1e-40, 3e38]
    rng = np.random.default_rng(7)
    vals += list(np.exp(rng.uniform(-10, 10, 48)).astype(F32))
    return np.array(vals, dtype=F32)


# ---------------------------------------------------------------- file

def record(name, kind, arr):
    arr = np.ascontiguousarray(arr)
    if kind in ("bf16", "f16"):
        raw = arr.view(np.uint16).tobytes()
    elif kind == "f32":
        raw = arr.astype(F32).tobytes()
    else:
        raw = arr.astype(np.uint8).tobytes()
    nb = name.encode()
    head = struct.pack("<H", len(nb)) + nb + struct.pack("<BB", TYPE_CODE[kind], arr.ndim)
    head += b"".join(struct.pack("<I", d) for d in arr.shape)
    return head + struct.pack("<I", len(raw)) + raw


def read_fixture(path):
    data = open(path, "rb").read()
    assert data[:8] == b"STQVEC01", "bad magic"
    pos, out = 8, {}
    while pos < len(data):
        (n,) = struct.unpack_from("<H", data, pos); pos += 2
        name = data[pos:pos + n].decode(); pos += n
        code, ndim = struct.unpack_from("<BB", data, pos); pos += 2
        shape = struct.unpack_from("<%dI" % ndim, data, pos); pos += 4 * ndim
        (nbytes,) = struct.unpack_from("<I", data, pos); pos += 4
        out[name] = (code, shape, data[pos:pos + nbytes]); pos += nbytes
    return out


def numpy_results(stored, kind, amax):
    w32 = stored.astype(F32)
    return {"nvfp4": nvfp4_np(w32, amax), "fp8": fp8_np(w32, amax, kind), "mxfp8": mxfp8_np(w32)}


def build_records():
    recs = []
    for name, kind, stored, amax in make_cases():
        res = numpy_results(stored, kind, amax)
        packed, scales, g = res["nvfp4"]
        p = "nvfp4/" + name + "/"
        recs += [record(p + "input", kind, stored), record(p + "amax", "f32", np.array([amax])),
                 record(p + "packed", "u8", packed), record(p + "block_scale", "u8", scales),
                 record(p + "global_scale", "f32", np.array([g]))]
        weight, scale = res["fp8"]
        p = "fp8/" + name + "/"
        recs += [record(p + "input", kind, stored), record(p + "amax", "f32", np.array([amax])),
                 record(p + "weight", "u8", weight), record(p + "scale", "f32", np.array([scale]))]
        weight, scale = res["mxfp8"]
        p = "mxfp8/" + name + "/"
        recs += [record(p + "input", kind, stored), record(p + "weight", "u8", weight),
                 record(p + "scale", "u8", scale)]
    a = scalar_amaxes()
    ok = np.isfinite(a) & (a > 0)
    recs += [record("nvfp4_input_scale/all/amax", "f32", a[ok]),
             record("nvfp4_input_scale/all/scale", "f32", (a[ok] * INV_2688).astype(F32)),
             record("fp8_input_scale/all/amax", "f32", a),
             record("fp8_input_scale/all/scale", "f32", fp8_input_scale_np(a)),
             record("fp8_kv_scale/all/amax", "f32", a[ok]),
             record("fp8_kv_scale/all/scale", "f32", (a[ok] * INV_448).astype(F32))]
    return recs


def check_with_torch(path):
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print("torch", torch.__version__, "on", device)
    fixture = read_fixture(path)
    tdt = {1: torch.bfloat16, 2: torch.float32, 3: torch.float16}
    fields = {"nvfp4": ["packed", "block_scale", "global_scale"], "fp8": ["weight", "scale"],
              "mxfp8": ["weight", "scale"]}
    bad = 0
    names = sorted({n.rsplit("/", 1)[0] for n in fixture if n.startswith("nvfp4/")})
    for prefix in names:
        case = prefix.split("/", 1)[1]
        code, shape, raw = fixture[prefix + "/input"]
        w = torch.frombuffer(bytearray(raw), dtype=tdt[code]).view(shape).to(device)
        amax = np.frombuffer(fixture[prefix + "/amax"][2], dtype=F32)[0]
        got = torch_results(w, amax, device)
        for fmt in ("nvfp4", "fp8", "mxfp8"):
            for field, t in zip(fields[fmt], got[fmt]):
                want = fixture[f"{fmt}/{case}/{field}"][2]
                t = np.ascontiguousarray(np.asarray(t))
                have = t.astype(F32).tobytes() if t.dtype == F32 else t.astype(np.uint8).tobytes()
                diff = sum(a != b for a, b in zip(have, want)) + abs(len(have) - len(want))
                print(f"{fmt:6s} {case:24s} {field:13s} bytes differing from fixture: {diff}")
                bad += diff
    amax_all = np.frombuffer(fixture["fp8_input_scale/all/amax"][2], dtype=F32)
    amax_ok = np.frombuffer(fixture["nvfp4_input_scale/all/amax"][2], dtype=F32)
    nv, _, kv = torch_scalar_scales(amax_ok.tolist(), device)
    _, fp8_in, _ = torch_scalar_scales(amax_all.tolist(), device)
    for label, t in (("nvfp4_input_scale", nv), ("fp8_input_scale", fp8_in), ("fp8_kv_scale", kv)):
        want = np.frombuffer(fixture[label + "/all/scale"][2], dtype=np.uint32)
        diff = int(np.count_nonzero(np.asarray(t, dtype=F32).view(np.uint32) != want))
        print(f"{label:20s} values differing from fixture: {diff}")
        bad += diff
    print("OK" if bad == 0 else f"MISMATCH ({bad})")
    return 0 if bad == 0 else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/quant/fixtures/quant_vectors.bin")
    ap.add_argument("--torch", action="store_true",
                    help="compare with PyTorch (CUDA when available) instead of writing")
    args = ap.parse_args()
    if args.torch:
        return check_with_torch(args.out)
    data = b"STQVEC01" + b"".join(build_records())
    with open(args.out, "wb") as f:
        f.write(data)
    print(f"wrote {args.out}: {len(data)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
