#!/usr/bin/env python3
"""interop_safetensors.py: mpengine's safetensors files against the reference
implementation, the `safetensors` package from PyPI (with numpy, and ml_dtypes
for bfloat16 and the FP8 types float8_e4m3fn / float8_e5m2). tests/lua/io_spec.lua drives it in both directions:

  write FILE VALUES.lua    save_file() the reference tensors to FILE, and write
                           their values as a Lua chunk for the spec to compare
  check FILE exact         load_file() FILE, written by mpengine, and compare
                           every tensor with the reference bit for bit
  check FILE values        the same for tensors mpengine made from the Lua
                           values: bit for bit except that a NaN only has to be
                           a NaN (its payload comes from the C library), and
                           the NaN-payload tensors Lua cannot make are absent

The reference tensors are defined here by their bit patterns, once, so that
both directions check the same bits. Exit status 0 and a line "ok: ..." when
everything matches; 1 and one line per mismatch otherwise.
"""
import json
import math
import sys

import ml_dtypes  # registers bfloat16 with numpy; safetensors.numpy needs it for BF16
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

# safetensors.numpy (0.8) reads F8_E4M3 / F8_E5M2 as numpy.float8_e4m3fn /
# numpy.float8_e5m2, names numpy does not have: they are ml_dtypes' types
np.float8_e4m3fn, np.float8_e5m2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2

BITS = {np.float64: np.uint64, np.float32: np.uint32, np.float16: np.uint16, ml_dtypes.bfloat16: np.uint16,
        np.int32: np.int32, np.uint8: np.uint8, E4M3: np.uint8, E5M2: np.uint8}

# name -> (dtype, shape, bit patterns); names with dots as in a state_dict
REFERENCE = {
    "layer.0.weight": (np.float32, (2, 5), [
        0x00000000, 0x80000000, 0x3f800000, 0xbfc00000, 0x7f7fffff,   # 0, -0, 1, -1.5, max
        0x00000001, 0x7f800000, 0xff800000, 0x7fc00000, 0x3dcccccd]),  # min subnormal, inf, -inf, nan, 0.1
    "layer.0.bias": (np.float16, (10,), [
        0x0000, 0x8000, 0x3c00, 0x7bff, 0x0001,                        # 0, -0, 1, 65504, 2^-24
        0x03ff, 0x7c00, 0xfc00, 0x7e00, 0x2e66]),                      # max subnormal, inf, -inf, nan, 0.1
    "bf16": (ml_dtypes.bfloat16, (2, 5), [
        0x0000, 0x8000, 0x3f80, 0x7f7f, 0x0001,
        0x007f, 0x7f80, 0xff80, 0x7fc0, 0x3dcd]),
    "i32": (np.int32, (6,), [0, 1, -1, 2147483647, -2147483648, -42]),
    "u8": (np.uint8, (2, 2, 2), [0, 1, 127, 128, 200, 254, 255, 7]),
    "scalar": (np.float32, (), [0x40490fdb]),                          # pi, shape []
    "f64": (np.float64, (2, 5), [
        0x0000000000000000, 0x8000000000000000, 0x3ff0000000000000,   # 0, -0, 1
        0x3fb999999999999a, 0x3fd5555555555555, 0x7fefffffffffffff,   # 0.1, 1/3, max
        0x0000000000000001, 0x7ff0000000000000, 0xfff0000000000000,   # min subnormal, inf, -inf
        0x7ff8000000000000]),                                          # nan
    # NaN payloads and signalling NaNs: only a file round trip keeps these
    "nan.f32": (np.float32, (3,), [0x7f800001, 0xffc00001, 0x7fc12345]),
    "nan.f16": (np.float16, (3,), [0x7c01, 0x7e01, 0xfe00]),
    "nan.bf16": (ml_dtypes.bfloat16, (3,), [0x7f81, 0xffc1, 0x7fc0]),
    # OCP FP8: 0, -0, 1, -1.5, the largest finite, least subnormal, largest subnormal, ...
    "f8.e4m3": (E4M3, (2, 8), [
        0x00, 0x80, 0x38, 0xbc, 0x7e, 0xfe, 0x01, 0x81,               # 0, -0, 1, -1.5, 448, -448, 2^-9, -2^-9
        0x07, 0x08, 0x40, 0x3f, 0x77, 0x10, 0x7f, 0x30]),             # 7*2^-9, 2^-6, 2, 1.875, 240, 2^-5, nan, 0.5
    "f8.e5m2": (E5M2, (12,), [
        0x00, 0x80, 0x3c, 0xbe, 0x7b, 0xfb, 0x01, 0x03,               # 0, -0, 1, -1.5, 57344, -57344, 2^-16, 3*2^-16
        0x04, 0x7c, 0xfc, 0x7e]),                                     # 2^-14, inf, -inf, nan
    # FP8 NaNs of every code: only a file round trip keeps these
    "nan.f8.e4m3": (E4M3, (2,), [0xff, 0x7f]),
    "nan.f8.e5m2": (E5M2, (6,), [0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff]),
}
PAYLOAD_ONLY = {"nan.f32", "nan.f16", "nan.bf16", "nan.f8.e4m3", "nan.f8.e5m2"}
LUA_DTYPE = {np.float64: "f64", np.float32: "f32", np.float16: "f16", ml_dtypes.bfloat16: "bf16", np.int32: "i32",
             np.uint8: "u8", E4M3: "e4m3", E5M2: "e5m2"}


def reference_array(name):
    dtype, shape, bits = REFERENCE[name]
    raw = np.array(bits, dtype=np.uint64 if BITS[dtype] == np.uint64 else np.int64).astype(BITS[dtype])
    return raw.view(dtype).reshape(shape)


def lua_number(x):
    if isinstance(x, int):
        return str(x)
    if math.isnan(x):
        return "0/0"
    if math.isinf(x):
        return "1/0" if x > 0 else "-1/0"
    return float(x).hex()    # exact, and Lua reads hex floats (-0.0 as "-0x0.0p+0")


def write(path, lua_path):
    tensors = {name: reference_array(name) for name in REFERENCE}
    save_file(tensors, path, metadata={"origin": "safetensors.numpy", "note": "written by interop_safetensors.py"})
    with open(lua_path, "w") as f:
        f.write("-- generated by tests/reference/interop_safetensors.py\nreturn {\n")
        for name, (dtype, shape, _) in REFERENCE.items():
            flat = reference_array(name).reshape(-1)
            vals = [int(v) if dtype in (np.int32, np.uint8) else float(v) for v in flat]
            f.write("  [%s] = {dtype = %s, shape = {%s}, payload_only = %s, values = {%s}},\n" % (
                json.dumps(name), json.dumps(LUA_DTYPE[dtype]), ", ".join(map(str, shape)),
                "true" if name in PAYLOAD_ONLY else "false", ", ".join(lua_number(v) for v in vals)))
        f.write("}\n")
    print("ok: wrote %d tensors to %s" % (len(tensors), path))
    return 0


def compare(name, got, mode):
    """mismatch descriptions for one tensor"""
    want = reference_array(name)
    dtype = REFERENCE[name][0]
    if got.dtype != want.dtype:
        return ["%s: dtype %s, expected %s" % (name, got.dtype, want.dtype)]
    if got.shape != want.shape:
        return ["%s: shape %s, expected %s" % (name, got.shape, want.shape)]
    gb, wb = got.reshape(-1).view(BITS[dtype]), want.reshape(-1).view(BITS[dtype])
    out = []
    for i, (g, w) in enumerate(zip(gb.tolist(), wb.tolist())):
        if g == w:
            continue
        if mode == "values" and dtype not in (np.int32, np.uint8) and np.isnan(got.reshape(-1)[i].astype(np.float32)) \
                and np.isnan(want.reshape(-1)[i].astype(np.float32)):
            continue
        out.append("%s[%d]: bits 0x%x, expected 0x%x" % (name, i, g & 0xffffffffffffffff, w & 0xffffffffffffffff))
    return out


def check(path, mode):
    got = load_file(path)
    with safe_open(path, framework="np") as f:
        meta = f.metadata() or {}
    expected = [n for n in REFERENCE if mode == "exact" or n not in PAYLOAD_ONLY]
    problems = []
    for name in expected:
        if name not in got:
            problems.append("%s: missing from %s" % (name, path))
        else:
            problems += compare(name, got[name], mode)
    problems += ["%s: unexpected tensor" % n for n in got if n not in expected]
    if "mpengine.structure" in meta:
        try:
            json.loads(meta["mpengine.structure"])
        except ValueError as e:
            problems.append("mpengine.structure is not JSON: %s" % e)
    for p in problems:
        print("MISMATCH " + p)
    if problems:
        return 1
    print("ok: %d tensors in %s match the reference bit for bit (%s)" % (len(expected), path, mode))
    return 0


def main(argv):
    if len(argv) == 4 and argv[1] == "write":
        return write(argv[2], argv[3])
    if len(argv) == 4 and argv[1] == "check" and argv[3] in ("exact", "values"):
        return check(argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
