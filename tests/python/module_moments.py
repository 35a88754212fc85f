"""qkgeom.HeadMoments through Python: round trips of the streaming moments.

- add in batches (any split, f32 and f64, strided) == add at once == the centred statistics NumPy
  computes from the rows (planted truth), bucket by bucket; n, t_min, t_max exact
- four threads adding batches into one HeadMoments == at once (adds are serialised per object)
- save / load_moments: every statistic bit for bit; merge_moment_files([a, b]) == a.merge(b) bit
  for bit; a.merge(b) == the rows added at once (to rounding); a shard of another head is refused
  naming the field
- analyze_moments(moments of one add per kind, keys) == analyze_head(same rows) on every closed-form
  column, bit for bit; diagnostics and the empirical check NaN
- errors name the argument (rows, positions, buckets, kind) and keep the library's message
"""

from module_common import Checks, same_doubles, setup

args = setup(__doc__)
import numpy as np  # noqa: E402

import qkgeom as q  # noqa: E402

check = Checks()
rng = np.random.default_rng(7)
d, n = 12, 3000
spec = q.BucketSpec("uniform", 256, 1.0)
pos = rng.integers(0, 2048, size=n)
bkt = q.bucket_of(spec, pos)
# offset + position drift + noise: a planted position direction
X = (5.0 + np.outer(pos / 2048.0, rng.standard_normal(d)) + rng.standard_normal((n, d))).astype(np.float32)


def stats_equal(a, b, exact, what):
    ba, bb = a.buckets("q"), b.buckets("q")
    if not check(sorted(ba) == sorted(bb), f"{what}: buckets {sorted(ba)} vs {sorted(bb)}"):
        return
    for k in ba:
        for f in ("n", "t_min", "t_max"):
            check(ba[k][f] == bb[k][f], f"{what}: bucket {k} {f}")
        for f in ("mean_t", "m2_t", "mean_x", "c_xt", "c_xx"):
            x, y = np.asarray(ba[k][f]), np.asarray(bb[k][f])
            ok = same_doubles(x, y) if exact else np.allclose(x, y, rtol=1e-11, atol=1e-9 * max(1.0, np.abs(y).max()))
            check(ok, f"{what}: bucket {k} {f} differs")


# --- planted truth: NumPy's centred statistics per bucket ---------------------------
once = q.HeadMoments(d, q.HeadId(3, 5, 1))
once.add("query", X, pos, bkt)
check(once.rows("q") == n and once.rows("key") == 0, "rows() counts")
for b, s in once.buckets("q").items():
    sel = bkt == b
    x = X[sel].astype(np.float64)
    t = pos[sel].astype(np.float64)
    xc, tc = x - x.mean(0), t - t.mean()
    check(s["n"] == sel.sum(), f"bucket {b}: n")
    check(s["t_min"] == t.min() and s["t_max"] == t.max(), f"bucket {b}: t_min/t_max")
    check(np.allclose(s["mean_x"], x.mean(0), rtol=1e-13, atol=1e-12), f"bucket {b}: mean_x vs NumPy")
    check(np.isclose(s["m2_t"], (tc * tc).sum(), rtol=1e-12), f"bucket {b}: m2_t vs NumPy")
    check(np.allclose(s["c_xt"], xc.T @ tc, rtol=1e-10, atol=1e-8), f"bucket {b}: c_xt vs NumPy")
    check(np.allclose(s["c_xx"], xc.T @ xc, rtol=1e-10, atol=1e-8), f"bucket {b}: c_xx vs NumPy")

# --- batches (uneven splits, other dtype / layout) == at once ------------------------
cuts = [0, 1, 257, 1000, 1999, n]
batched = q.HeadMoments(d, q.HeadId(3, 5, 1))
for a, b in zip(cuts[:-1], cuts[1:]):
    rows = X[a:b] if a % 2 else np.asfortranarray(X[a:b].astype(np.float64))  # f32 C / f64 Fortran
    batched.add("q", rows, pos[a:b], bkt[a:b].astype(np.int32))
stats_equal(batched, once, False, "batches vs once")

# --- threads adding into one HeadMoments (the GIL is released while reducing; one lock per object) ---
import threading  # noqa: E402

shared = q.HeadMoments(d, q.HeadId(3, 5, 1))
chunks = np.array_split(np.arange(n), 24)


def feed(part):
    for idx in part:
        shared.add("q", X[idx], pos[idx], bkt[idx])


threads = [threading.Thread(target=feed, args=(chunks[i::4],)) for i in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
check(shared.rows("q") == n, f"4 threads: {shared.rows('q')} rows, expected {n}")
stats_equal(shared, once, False, "4 threads vs once")

# --- save / load / merge -------------------------------------------------------------------
first, second = q.HeadMoments(d, q.HeadId(3, 5, 1)), q.HeadMoments(d, q.HeadId(3, 5, 1))
first.add("q", X[:1200], pos[:1200], bkt[:1200])
second.add("q", X[1200:], pos[1200:], bkt[1200:])
K = rng.standard_normal((500, d))
kpos = rng.integers(0, 2048, size=500)
second.add("k", K, kpos, q.bucket_of(spec, kpos))
pa, pb = f"{args.work}/a.qkm", f"{args.work}/b.qkm"
first.save(pa)
second.save(pb)
back = q.load_moments(pa)
check(back.id == q.HeadId(3, 5, 1) and back.dim == d, "load_moments: id and dim")
stats_equal(back, first, True, "save/load")
merged = q.load_moments(pa)
merged.merge(q.load_moments(pb))
files = q.merge_moment_files([pa, pb])
stats_equal(files, merged, True, "merge_moment_files vs merge")
check(files.rows("k") == 500, "merged key rows")
stats_equal(merged, once, False, "merge vs once")
plus = q.load_moments(pa)
plus += q.load_moments(pb)
stats_equal(plus, merged, True, "+= vs merge")
other = q.HeadMoments(d, q.HeadId(3, 6, 1))
other.add("q", X[:10], pos[:10], bkt[:10])
po = f"{args.work}/other.qkm"
other.save(po)
check.raises(ValueError, lambda: q.merge_moment_files([pa, po]), ["q_head", po], "merge of another head's shard")
check.raises(ValueError, lambda: first.merge(other), ["q_head mismatch"], "merge of another head")

# --- save(path, buckets=BucketSpec): format version 2, the scheme recorded and checked at merge ---
pv2a, pv2b = f"{args.work}/a2.qkm", f"{args.work}/b2.qkm"
first.save(pv2a, buckets=spec)
second.save(pv2b, buckets=spec)
with open(pv2a, "rb") as f:
    check(int.from_bytes(f.read(12)[8:12], "little") == 2, "save(buckets=...): format version 2")
with open(pa, "rb") as f:
    check(int.from_bytes(f.read(12)[8:12], "little") == 1, "save(): format version 1")
stats_equal(q.merge_moment_files([pv2a, pv2b]), merged, True, "version 2 shards merge as version 1")
wide = q.BucketSpec(spec.scheme, spec.width * 2, spec.rate)
pv2w = f"{args.work}/wide.qkm"
check.raises(ValueError, lambda: second.save(pv2w, buckets=wide), ["bucket"], "save: buckets outside the scheme")
other2 = q.HeadMoments(d, q.HeadId(3, 5, 1))
other2.add("q", X[:10], pos[:10] * 0, bkt[:10] * 0)
other2.save(pv2w, buckets=wide)
check.raises(ValueError, lambda: q.merge_moment_files([pv2a, pv2w]), ["bucket", "wide.qkm"],
             "merge of shards of two bucket schemes")

# --- HeadId is a sequence of three integers ---------------------------------------------------
hid = q.HeadId(1, 2, 1)
check(list(hid) == [1, 2, 1] and hid[0] == 1 and hid[1] == 2 and hid[-1] == 1 and len(hid) == 3,
      f"HeadId indexing: {[hid[i] for i in range(3)]}")
check.raises(IndexError, lambda: hid[3], ["out of range"], "HeadId index 3")

# --- analyze_moments == analyze_head on the closed forms ------------------------------------
n_k = 2500
Kr = (rng.standard_normal((n_k, d)) + np.outer(np.arange(n_k) % 1024 / 1024.0, rng.standard_normal(d))).astype(
    np.float32
)
kp = np.arange(n_k) % 1024
ke = np.arange(n_k) // 1024
Qr, qp = X[:2000], pos[:2000] % 1024
hm = q.HeadMoments(d, q.HeadId(0, 1, 0))
hm.add("q", Qr, qp, q.bucket_of(spec, qp))
hm.add("k", Kr, kp, q.bucket_of(spec, kp))
from_rows = q.analyze_head(Qr, qp, Kr, kp, buckets=spec, k_example_ids=ke, head=q.HeadId(0, 1, 0))
from_moments = q.analyze_moments(hm, Kr, kp, k_example_ids=ke, buckets=spec)
rows_only = {"pos_skew", "pos_excess_kurtosis", "pos_ks_p", "sem_median_abs_skew", "sem_median_abs_kurtosis",
             "sem_median_ks_p", "sem_frac_ks_reject", "gaussian_gap", "gaussian_gap_se"}
for c in q.head_metrics_columns():
    a, b = from_rows.metrics[c], from_moments.metrics[c]
    if c in rows_only:
        check(np.isnan(b), f"analyze_moments: {c} is {b}, expected NaN (needs query rows)")
    elif c == "flags":
        continue  # diagnostics flags differ by design
    elif isinstance(a, float):
        check(same_doubles([a], [b]), f"analyze_moments vs analyze_head: {c} {b!r} != {a!r}")
    else:
        check(a == b, f"analyze_moments vs analyze_head: {c} {b!r} != {a!r}")
check(all(np.isnan(c["empirical"]) for c in from_moments.cells), "analyze_moments: empirical NaN")
check(not np.isnan(from_rows.ap_overall), "analyze_head: ap_overall is a number")

# --- errors name the argument ---------------------------------------------------------------
m = q.HeadMoments(d)
check.raises(TypeError, lambda: m.add("q", X.astype(np.int32), pos, bkt), ["rows", "int32"], "integer rows")
check.raises(ValueError, lambda: m.add("q", X[0], pos, bkt), ["rows", "2-D"], "1-D rows")
check.raises(TypeError, lambda: m.add("q", X, pos.astype(float), bkt), ["positions", "float64"], "float positions")
check.raises(ValueError, lambda: m.add("q", X, pos[:10], bkt), ["length", "10"], "short positions")
check.raises(ValueError, lambda: m.add("queries", X, pos, bkt), ["kind", "queries"], "bad kind")
check.raises(ValueError, lambda: m.add("q", X[:, :3], pos, bkt), ["3"], "wrong width")
bad = X.copy()
bad[17, 2] = np.nan
check.raises(ValueError, lambda: m.add("k", bad, pos, bkt), ["17"], "NaN row named")
check(m.rows("q") == 0 and m.rows("k") == 0, "rejected input adds nothing")
check.raises(q.InputError, lambda: q.load_moments(f"{args.work}/missing.qkm"), ["missing.qkm"], "missing shard")
check.raises(ValueError, lambda: q.HeadMoments(0), ["HeadMoments(dim)", "d = 0", "1..4096"], "dim 0")

check.finish("python.module.moments")
