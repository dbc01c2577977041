#!/usr/bin/env python3
"""fp8_ml_dtypes.py: mpengine's casts into FP8 (not saturating, the default of
t:to("e4m3") and t:to("e5m2"), as PyTorch's .to()) against ml_dtypes'
float8_e4m3fn and float8_e5m2 casts. tests/lua/fp8_spec.lua drives it:

  write FILE    save_file() the inputs to FILE: "x", a dense sample of f32 bit
                patterns (every 4096th of the 2^32, and 512 around each
                boundary: the largest finite values, the overflow midpoints 464
                and 61440, the least subnormals and their halves, the least
                normals, 1, zero, inf, NaN, both signs); "h" and "b", every f16
                and every bf16 bit pattern
  check FILE    load_file() FILE, where mpengine wrote its casts of each input
                K as "K.e4m3" and "K.e5m2", and compare each with ml_dtypes'
                cast of the same input: bit for bit, except that a NaN input
                only has to give a NaN (mpengine gives 0x7f for every NaN, as
                CUDA's host code; ml_dtypes keeps the sign)

Exit status 0 and a line "ok: ..." when everything matches; 1 and the first
mismatches otherwise. (cuda_fp8.h is the reference of the saturating mode:
tests/c/test_fp8.c and scripts/bench/fp8_exhaustive.c.)
"""
import sys
import warnings

import ml_dtypes
import numpy as np
from safetensors.numpy import load_file, save_file

# safetensors.numpy (0.8) reads F8_E4M3 / F8_E5M2 as numpy.float8_e4m3fn /
# numpy.float8_e5m2, names numpy does not have: they are ml_dtypes' types
np.float8_e4m3fn, np.float8_e5m2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
FORMATS = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def f32_sample():
    strided = np.arange(0, 1 << 32, 4096, dtype=np.uint64).astype(np.uint32)
    centres = np.array([448, 464, 480, 57344, 61440, 65536, 2.0 ** -9, 2.0 ** -10, 2.0 ** -16, 2.0 ** -17,
                        2.0 ** -6, 2.0 ** -14, 1.0, 1.0625], dtype=np.float32).view(np.uint32)
    around = (centres[:, None].astype(np.int64) + np.arange(-256, 256)[None, :]).reshape(-1)
    around = np.concatenate([around, np.arange(0, 256)]).astype(np.uint32)   # zero and up
    around = np.concatenate([around, around | np.uint32(0x80000000)])
    specials = np.array([0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001, 0x7f7fffff, 0xff7fffff],
                        dtype=np.uint32)
    return np.concatenate([strided, around, specials]).view(np.float32)


def write(path):
    every16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    inputs = {"x": f32_sample(), "h": every16.view(np.float16), "b": every16.view(ml_dtypes.bfloat16)}
    save_file(inputs, path)
    print("ok: wrote %s" % ", ".join("%s (%d)" % (k, v.size) for k, v in inputs.items()))
    return 0


def check(path):
    got = load_file(path)
    problems, count = [], 0
    for key in ("x", "h", "b"):
        x = got[key]
        nan_in = np.isnan(x.astype(np.float32))
        for name, dt in FORMATS.items():
            mine = got.get("%s.%s" % (key, name))
            if mine is None:
                problems.append("%s.%s: missing" % (key, name))
                continue
            # NaN and the infinities have no e4m3fn code but NaN: a newer numpy
            # warns at such a cast, which is what this check asks for
            with np.errstate(invalid="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                want = x.astype(dt)
            if mine.dtype != want.dtype or mine.shape != want.shape:
                problems.append("%s.%s: %s %s, expected %s %s" % (key, name, mine.dtype, mine.shape, want.dtype,
                                                                  want.shape))
                continue
            mb, wb = mine.view(np.uint8), want.view(np.uint8)
            bad = (mb != wb) & ~nan_in
            bad |= nan_in & ~np.isnan(mine.astype(np.float32))
            count += x.size
            for i in np.flatnonzero(bad)[:5]:
                problems.append("%s -> %s: input bits 0x%x: mpengine 0x%02x, ml_dtypes 0x%02x" % (
                    key, name, int(x.view(np.uint32 if x.itemsize == 4 else np.uint16)[i]), mb[i], wb[i]))
            if bad.sum() > 5:
                problems.append("%s -> %s: %d mismatches in all" % (key, name, int(bad.sum())))
    for p in problems:
        print("MISMATCH " + p)
    if problems:
        return 1
    print("ok: %d casts match ml_dtypes (NaN inputs: NaN)" % count)
    return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "write":
        return write(argv[2])
    if len(argv) == 3 and argv[1] == "check":
        return check(argv[2])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
