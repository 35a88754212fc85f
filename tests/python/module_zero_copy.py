"""Arrays are read in place: any view gives the analysis of its contiguous float64 copy.

- strided, Fortran-order, negative-stride, f16, bf16 (int16 bits tagged "bf16"), f32 views of the
  same rows: analyze_head == analyze_head(np.ascontiguousarray(view, float64)) on every
  head_metrics column, bit for bit (widening to double is exact, so the reader must see the same
  values in the same order); int32 / strided positions likewise
- a torch CPU tensor (f32, bf16, non-contiguous) == its NumPy values (when torch is installed)
- no copy: adding ~100 MB of float32 rows to HeadMoments raises the peak RSS by far less than
  the 200 MB a float64 copy would take
- the GIL is released during an analysis: another Python thread runs meanwhile
- refusals name the argument: unaligned data, non-native byte order, int16 without the bf16 tag,
  3-D arrays
"""

import resource
import threading

from module_common import Checks, same_doubles, setup

args = setup(__doc__)
import numpy as np  # noqa: E402

import qkgeom as q  # noqa: E402

check = Checks()
rng = np.random.default_rng(11)
n, d = 1500, 8
spec = q.BucketSpec("uniform", 128, 2.0)
qp = np.arange(n) % 512
kp = (np.arange(n) * 7) % 512
ke = np.arange(n) // 512
base_q = (np.outer(qp / 512.0, rng.standard_normal(d)) + rng.standard_normal((n, d))).astype(np.float32)
base_k = (np.outer(kp / 512.0, rng.standard_normal(d)) + rng.standard_normal((n, d))).astype(np.float32)


def analyse(Q, K, qpos=qp, kpos=kp):
    return q.analyze_head(Q, qpos, K, kpos, buckets=spec, k_example_ids=ke)


def same_analysis(a, b, what):
    for c in q.head_metrics_columns():
        x, y = a.metrics[c], b.metrics[c]
        ok = same_doubles([x], [y]) if isinstance(x, float) else x == y
        if not check(ok, f"{what}: {c} {x!r} != {y!r}"):
            return
    fa, fb = q._columns("head_bucket_plasticity", [a]), q._columns("head_bucket_plasticity", [b])
    check(all(same_doubles(fa[c], fb[c]) for c in fa), f"{what}: plasticity cells differ")


def f64(v):
    return np.ascontiguousarray(v, dtype=np.float64)


def bf16_bits(x32):
    u = np.ascontiguousarray(x32, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).view(np.int16)


def bf16_values(bits):
    return (bits.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


# --- views of the same rows --------------------------------------------------------------
big = np.zeros((2 * n, 3 * d), dtype=np.float32)
big[::2, 1::3] = base_q
views = {
    "f32 C": base_q,
    "f32 Fortran": np.asfortranarray(base_q),
    "f32 strided (rows 2, cols 3)": big[::2, 1::3],
    "f32 reversed columns": base_q[:, ::-1],
    "f64 Fortran": np.asfortranarray(base_q.astype(np.float64)),
    "f16": base_q.astype(np.float16),
    "f16 transposed twice": np.ascontiguousarray(base_q.astype(np.float16).T).T,
}
for name, v in views.items():
    check(not v.flags.c_contiguous or name in ("f32 C", "f16"), f"{name}: the view is meant to be non-contiguous")
    same_analysis(analyse(v, base_k), analyse(f64(v), f64(base_k)), f"queries {name}")
    same_analysis(analyse(base_q, v[::-1][::-1]), analyse(f64(base_q), f64(v)), f"keys {name}")
bits = bf16_bits(base_q)
same_analysis(analyse((bits, "bf16"), base_k), analyse(bf16_values(bits), f64(base_k)), "queries bf16 bits")
sbits = np.zeros((n, 2 * d), dtype=np.int16)
sbits[:, ::2] = bits
same_analysis(analyse((sbits[:, ::2], "bf16"), base_k), analyse(bf16_values(bits), f64(base_k)), "strided bf16 bits")
same_analysis(analyse(base_q, base_k, qp.astype(np.int32), np.repeat(kp, 2)[::2]), analyse(base_q, base_k),
              "int32 / strided positions")
# the views really are different memory layouts of the same values: a changed value changes the result
moved = base_q.copy()
moved[5, 3] += 1.0
check(analyse(moved, base_k).metrics["q_R2_pos"] != analyse(base_q, base_k).metrics["q_R2_pos"],
      "a changed row value changes the analysis (the comparison can fail)")

# --- torch tensors (optional) ------------------------------------------------------------
try:
    import torch
except ImportError:
    torch = None
    print("torch not installed: tensor checks skipped")
if torch is not None:
    t = torch.from_numpy(base_q.copy())
    same_analysis(analyse(t, base_k), analyse(f64(base_q), f64(base_k)), "torch f32")
    tt = torch.from_numpy(np.ascontiguousarray(base_q.T)).t()  # non-contiguous view
    same_analysis(analyse(tt, base_k), analyse(f64(base_q), f64(base_k)), "torch transposed f32")
    tb = t.to(torch.bfloat16)
    same_analysis(analyse(tb, base_k), analyse(tb.float().numpy().astype(np.float64), f64(base_k)), "torch bf16")
    check(np.array_equal(tb.view(torch.int16).numpy(), bits), "torch's bf16 rounding == the bits used above")
    same_analysis(analyse(base_q, base_k, torch.from_numpy(qp)), analyse(base_q, base_k), "torch positions")
    check.raises(TypeError, lambda: analyse(t.to(torch.int32), base_k), ["queries", "int32"], "torch int tensor")

# --- no copy: peak RSS while adding 100 MB of float32 rows --------------------------------
rows = np.ones((200_000, 128), dtype=np.float32)
rows[:, 0] = np.arange(200_000) % 1000
p = (np.arange(200_000) % 1000).astype(np.int64)
b = q.bucket_of(q.BucketSpec("uniform", 100), p)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
m = q.HeadMoments(128)
m.add("k", rows, p, b)
m.add("q", rows[:, :], p, b)
grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(f"peak RSS growth while adding 2 x {rows.nbytes / 2**20:.0f} MB of f32 rows: {grown_mb:.1f} MB")
check(grown_mb < 40, f"HeadMoments.add copied the rows? peak RSS grew by {grown_mb:.0f} MB (a f64 copy: 195 MB)")

# --- the GIL is released during an analysis ----------------------------------------------
state = {"started": False, "done": False}
nq = 15_000
Qb = rng.standard_normal((nq, 32)).astype(np.float32)
pb = np.arange(nq) % 4096


def work():
    state["started"] = True
    q.analyze_head(Qb, pb, Qb, pb, buckets=q.BucketSpec("uniform", 512), k_example_ids=np.arange(nq) // 4096,
                   options=q.Options(diagnostics=False, enumeration="sampled", samples=400))
    state["done"] = True


th = threading.Thread(target=work)
ticks = 0
th.start()
while not state["done"]:
    if state["started"]:
        ticks += 1
th.join()
print(f"main-thread iterations during the analysis: {ticks}")
check(ticks > 10_000, f"the main thread ran only {ticks} iterations during analyze_head: GIL held?")

# --- refusals name the argument ------------------------------------------------------------
raw = np.zeros(n * d * 4 + 1, dtype=np.uint8)
unaligned = raw[1:].view(np.float32).reshape(n, d)
check(not unaligned.flags.aligned, "the unaligned array is unaligned")
check.raises(ValueError, lambda: analyse(unaligned, base_k), ["queries", "aligned"], "unaligned rows")
check.raises(ValueError, lambda: analyse(base_q, base_k.astype(">f4")), ["keys", "byte order"], "big-endian rows")
check.raises(TypeError, lambda: analyse(bits, base_k), ["queries", "int16", "bf16"], "bf16 bits without the tag")
check.raises(TypeError, lambda: analyse((base_q, "bf16"), base_k), ["queries", "bf16", "float32"], "tag vs dtype")
check.raises(ValueError, lambda: analyse(base_q[None], base_k), ["queries", "2-D", "(1, 1500, 8)"], "3-D rows")
check.raises(ValueError, lambda: analyse(base_q, base_k, qp[:-1]), ["positions", "1499"], "short positions")
check.raises(TypeError, lambda: analyse([[1.0]], base_k), ["queries", "list"], "a list of rows")

check.finish("python.module.zero_copy")
