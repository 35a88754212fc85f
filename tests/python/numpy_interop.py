"""NumPy <-> qkgeom cross-check of .npy and .npz.

(a) NumPy writes .npy (np.save) and .npz (np.savez, np.savez_compressed):
    float16, float32, float64, bf16 bits (a 2-byte void type, qkgeom's bf16
    convention), int64, int32, uint8, Fortran order, 0-d and empty arrays.
    qkgeom_py_check dumps every value; each must equal NumPy's exactly.
    numpy's members carry ZIP64 local headers (force_zip64): `list` must say so.
(b) qkgeom rewrites those files (npy; npz stored / deflate x plain / ZIP64 /
    data descriptors); NumPy (np.load) and Python's zipfile (testzip: CRCs)
    must read them back identical: dtype, shape, order and bytes.
"""

import os
import sys
import zipfile

from _common import Checks, parse_dump, run, setup

args = setup(__doc__)
import numpy as np  # noqa: E402

check = Checks()
rng = np.random.default_rng(20240611)
bf16_bits = np.array([0x3F80, 0x0001, 0xFF80, 0x7F7F, 0xC0A0, 0x0000], dtype=np.uint16)
arrays = {
    "f16": rng.standard_normal((3, 5)).astype(np.float16),
    "f32": rng.standard_normal((4, 3)).astype(np.float32),
    "f64": np.array([[0.0, -1.5, 1e-300], [np.finfo(np.float64).max, 5e-324, np.pi]]),
    "bf16": bf16_bits.reshape(2, 3).view("V2"),
    "i64": np.array([np.iinfo(np.int64).min, -1, 0, 7, np.iinfo(np.int64).max], dtype=np.int64),
    "i32": np.arange(-6, 6, dtype=np.int32).reshape(3, 4),
    "u8": np.array([0, 1, 254, 255], dtype=np.uint8),
    "fortran_f32": np.asfortranarray(rng.standard_normal((3, 4)).astype(np.float32)),
    "fortran_i64": np.asfortranarray(np.arange(24, dtype=np.int64).reshape(2, 3, 4)),
    "scalar": np.array(4096, dtype=np.int64),
    "empty": np.zeros((0, 4), dtype=np.float32),
    "big": rng.standard_normal((300, 64)).astype(np.float32),
}


def bf16_to_float(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def expected_values(a):
    """C-order values as qkgeom prints them (floats widened to double, exactly)."""
    if a.dtype.kind == "V":
        return [float(x) for x in bf16_to_float(np.ascontiguousarray(a).view(np.uint16).ravel())]
    flat = np.ascontiguousarray(a).ravel(order="C")
    if a.dtype.kind == "f":
        return [float(x) for x in flat.astype(np.float64)]
    return [int(x) for x in flat]


def same_value(s, e):
    return float(s) == e if isinstance(e, float) else int(s) == e


def check_dump(path, expect):
    got = parse_dump(run(args.checker, "dump", path).stdout)
    check(set(got) == set(expect), f"{path}: keys {sorted(got)} vs {sorted(expect)}")
    for key, a in expect.items():
        if key not in got:
            continue
        dt, descr, fortran, shape, vals = got[key]
        check(shape == a.shape, f"{path}[{key}]: shape {shape} vs {a.shape}")
        check(fortran == (a.ndim > 1 and a.flags.f_contiguous and not a.flags.c_contiguous),
              f"{path}[{key}]: fortran_order {fortran}")
        want_dt = {"f2": "f16", "f4": "f32", "f8": "f64", "V2": "bf16", "i8": "i64", "i4": "i32", "u1": "u8"}
        check(dt == want_dt[a.dtype.str[1:]], f"{path}[{key}]: dtype {dt} vs {a.dtype.str}")
        ev = expected_values(a)
        check(len(vals) == len(ev) and all(same_value(s, e) for s, e in zip(vals, ev)),
              f"{path}[{key}]: values differ")


def same_array(a, b):
    return (a.dtype == b.dtype and a.shape == b.shape and a.flags.f_contiguous == b.flags.f_contiguous
            and a.tobytes(order="A") == b.tobytes(order="A"))


w = args.work
# (a) NumPy writes, qkgeom reads
for key, a in arrays.items():
    np.save(os.path.join(w, key + ".npy"), a)
    check_dump(os.path.join(w, key + ".npy"), {key: a})
np.savez(os.path.join(w, "savez.npz"), **arrays)
np.savez_compressed(os.path.join(w, "savez_compressed.npz"), **arrays)
np.savez(os.path.join(w, "positional.npz"), arrays["f32"], arrays["i64"])  # arr_0, arr_1
check_dump(os.path.join(w, "savez.npz"), arrays)
check_dump(os.path.join(w, "positional.npz"), {"arr_0": arrays["f32"], "arr_1": arrays["i64"]})
zlib = run(args.checker, "zlib").stdout.strip() == "1"
if zlib:
    check_dump(os.path.join(w, "savez_compressed.npz"), arrays)
else:
    r = run(args.checker, "dump", os.path.join(w, "savez_compressed.npz"), expect_ok=False)
    check(r.returncode == 1 and "built without zlib" in r.stderr, "deflated member without zlib: clear message")
for name, method in (("savez.npz", 0), ("savez_compressed.npz", 8)):
    listing = run(args.checker, "list", os.path.join(w, name)).stdout.splitlines()
    check(len(listing) == len(arrays), f"{name}: {len(listing)} members listed")
    for line in listing:
        f = line.split()
        check(f[3] == str(method), f"{name}: {f[1]} method {f[3]}")
        check(f[5] == "1", f"{name}: {f[1]}: numpy's ZIP64 local header was read (zip64 {f[5]})")

# (b) qkgeom writes, NumPy reads
for key, a in arrays.items():
    out = os.path.join(w, "qk_" + key + ".npy")
    run(args.checker, "rewrite", os.path.join(w, key + ".npy"), out)
    b = np.load(out)
    check(same_array(a, b), f"{out}: np.load differs ({b.dtype} {b.shape})")
variants = [[], ["zip64"], ["descriptor"], ["zip64", "descriptor"]]
methods = ["stored"] + (["deflate"] if zlib else [])
for src in ("savez.npz", "savez_compressed.npz") if zlib else ("savez.npz",):
    for method in methods:
        for v in variants:
            out = os.path.join(w, f"qk_{method}_{'_'.join(v) or 'plain'}_{src}")
            run(args.checker, "rewrite", os.path.join(w, src), out, method, *v)
            with zipfile.ZipFile(out) as z:
                check(z.testzip() is None, f"{out}: zipfile CRC check")
                infos = z.infolist()
                check([i.filename for i in infos] == [k + ".npy" for k in arrays], f"{out}: member names")
                check(all(i.compress_type == (8 if method == "deflate" else 0) for i in infos), f"{out}: method")
                check(all(bool(i.flag_bits & 8) == ("descriptor" in v) for i in infos), f"{out}: descriptor flag")
            with np.load(out) as d:
                check(sorted(d.files) == sorted(arrays), f"{out}: np.load keys {d.files}")
                for key, a in arrays.items():
                    check(same_array(a, d[key]), f"{out}[{key}]: np.load differs")
check.finish("python.numpy_interop")
