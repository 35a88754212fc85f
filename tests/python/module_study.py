"""qkgeom.study(): a study file run from Python into DataFrames (docs/python.md#studies).

(1) Model-level runs only (no capture): the seven models of the thesis' Table 6.3 with their
    AP_drop and LongBench-Pro (LBP) scores. The "all" correlation of ap_drop with LBP is checked
    against hand-computed values — Spearman -9/14 (rank differences 6, 3, 1, -1, -3, 0, -6:
    1 - 6*92/336), Kendall -13/21 (4 concordant, 17 discordant pairs), Kendall's exact two-sided
    p = 2*(1+6+20+49+98)/7! = 348/5040 (Mahonian numbers for n = 7) — and against a brute-force
    enumeration of the 7! rank permutations here (Spearman's exact p). Per family: qwen is
    perfectly inverse (-1, -1, p = 2/6), ministral has Spearman -1/2 and Kendall -1/3. The model
    table carries the file's numbers (ints as int64, NaN intervals for given numbers).
(2) A capture run (`qkgeom synth --layers 1 --heads 2`): analysed on the first call, taken from
    the default cache (.qkgeom-study-cache next to the study file) on the second, with the same
    tables; n_heads = 2; other options analyse it again.
(3) A bad study file raises qkgeom.InputError whose .field names the bad key.
"""

import itertools
import json
import math
import os
from fractions import Fraction

from module_common import Checks, run, setup

args = setup(__doc__, need_pandas=True)
import numpy as np  # noqa: E402

import qkgeom as q  # noqa: E402

check = Checks()
W = args.work

# model, family, LBP, ap_drop (thesis Table 6.3)
TABLE_6_3 = [
    ("ministral3-14b", "ministral", 40.14, 0.068),
    ("ministral3-8b", "ministral", 37.80, 0.082),
    ("qwen3-14b", "qwen", 37.11, 0.161),
    ("qwen3-8b", "qwen", 33.41, 0.178),
    ("qwen3-4b", "qwen", 31.26, 0.186),
    ("ministral3-3b", "ministral", 30.18, 0.072),
    ("llama3.2-3b", "llama", 15.71, 0.230),
]


def write_study(folder, study):
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "study.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(study, f, indent=1)
    return path


def write_lbp(folder):
    with open(os.path.join(folder, "lbp.csv"), "w", encoding="utf-8") as f:
        f.write("model,score\n")
        for m, _, lbp, _ in TABLE_6_3:
            f.write(f"{m},{lbp}\n")


def close(a, b, tol=1e-12):
    return a == b or (math.isfinite(a) and abs(a - b) <= tol * max(1.0, abs(b)))


def corr_row(st, metric, bench, group):
    c = st.correlations
    rows = c[(c.metric == metric) & (c.benchmark == bench) & (c.group == group)]
    return rows.iloc[0] if len(rows) == 1 else None


def ranks(v):
    order = sorted(range(len(v)), key=lambda i: v[i])
    r = [0] * len(v)
    for k, i in enumerate(order):
        r[i] = k + 1
    return r


def spearman_of(rx, ry):
    n = len(rx)
    return 1 - Fraction(6 * sum((a - b) ** 2 for a, b in zip(rx, ry)), n * (n * n - 1))


# --- (1) model-level runs ------------------------------------------------------------------
d1 = os.path.join(W, "given")
os.makedirs(d1)
write_lbp(d1)
path1 = write_study(d1, {
    "title": "Table 6.3",
    "runs": [{"name": m, "family": fam, "metrics": {"ap_drop": ap}} for m, fam, _, ap in TABLE_6_3],
    "benchmarks": [{"name": "LBP", "overall": "lbp.csv"}],
    "correlate": ["ap_drop"],
})
st = q.study(path1)
check(isinstance(st, q.Study), f"q.study returns {type(st)}")
check(sorted(st.tables) == sorted(["models", "profiles", "trajectory", "taxonomy", "depth", "correlations",
                                   "length", "head_trajectories"]), f"tables {sorted(st.tables)}")
check(st.title == "Table 6.3", f"title {st.title!r}")
check([r["name"] for r in st.runs] == [m for m, *_ in TABLE_6_3], "runs in study file order")
check(all(r["status"] == "given" and r["message"] == "" for r in st.runs), f"runs {st.runs}")
check(not os.path.exists(os.path.join(d1, ".qkgeom-study-cache")), "no cache folder without captures")

mt = st.models
check(list(mt.run) == [m for m, *_ in TABLE_6_3], f"models.run {list(mt.run)}")
check(list(mt.family) == [f for _, f, *_ in TABLE_6_3], f"models.family {list(mt.family)}")
check(list(mt.score_LBP) == [x for _, _, x, _ in TABLE_6_3], f"models.score_LBP {list(mt.score_LBP)}")
check(list(mt.ap_drop) == [x for *_, x in TABLE_6_3], f"models.ap_drop {list(mt.ap_drop)}")
check(mt.n_heads.dtype == np.int64 and (mt.n_heads == 0).all(), f"models.n_heads {mt.n_heads.dtype} {list(mt.n_heads)}")
check(mt.ap_drop_lo.dtype == np.float64 and mt.ap_drop_lo.isna().all(), "given numbers: NaN interval")
check(mt.bias_strength.isna().all(), "a metric the file does not give is NaN")
check(len(st.taxonomy) == 0 and list(st.taxonomy.columns)[:3] == ["run", "family", "model"],
      "no taxonomy rows for given runs; the header is kept")

all_row = corr_row(st, "ap_drop", "LBP", "all")
if check(all_row is not None, "correlations: one 'all' row for ap_drop vs LBP"):
    lbp = [x for _, _, x, _ in TABLE_6_3]
    ap = [x for *_, x in TABLE_6_3]
    rl, ra = ranks(lbp), ranks(ap)
    check(spearman_of(rl, ra) == Fraction(-9, 14), "hand value of Spearman (test data)")
    check(int(all_row.n) == 7 and st.correlations.n.dtype == np.int64, f"n {all_row.n}")
    check(close(all_row.spearman, -9 / 14), f"spearman {all_row.spearman!r} != -9/14")
    check(close(all_row.kendall, -13 / 21), f"kendall {all_row.kendall!r} != -13/21")
    check(close(all_row.p_kendall, 348 / 5040), f"p_kendall {all_row.p_kendall!r} != 348/5040")
    check(all_row.p_method == "exact", f"p_method {all_row.p_method!r}")
    # Brute force: every permutation of the ap_drop ranks against the LBP ranks.
    n_rho = n_tau = 0
    for p in itertools.permutations(ra):
        n_rho += abs(spearman_of(rl, p)) >= Fraction(9, 14)
        s = sum((rl[i] - rl[j]) * (p[i] - p[j]) > 0 for i in range(7) for j in range(i))
        n_tau += abs(Fraction(2 * s - 21, 21)) >= Fraction(13, 21)
    check(n_tau == 348, f"brute force: {n_tau} permutations with |tau| >= 13/21")
    check(close(all_row.p_spearman, n_rho / 5040), f"p_spearman {all_row.p_spearman!r} != {n_rho}/5040")
    xm, ym = sum(lbp) / 7, sum(ap) / 7
    r = sum((x - xm) * (y - ym) for x, y in zip(lbp, ap)) / math.sqrt(
        sum((x - xm) ** 2 for x in lbp) * sum((y - ym) ** 2 for y in ap))
    check(close(all_row.pearson, r, 1e-9), f"pearson {all_row.pearson!r} != {r!r}")
qwen = corr_row(st, "ap_drop", "LBP", "qwen")
if check(qwen is not None, "correlations: a 'qwen' row"):
    check(int(qwen.n) == 3 and close(qwen.spearman, -1) and close(qwen.kendall, -1), f"qwen {dict(qwen)}")
    check(close(qwen.p_kendall, 1 / 3) and close(qwen.p_spearman, 1 / 3), f"qwen p {qwen.p_kendall}")
mini = corr_row(st, "ap_drop", "LBP", "ministral")
if check(mini is not None, "correlations: a 'ministral' row"):
    check(close(mini.spearman, -0.5) and close(mini.kendall, -1 / 3), f"ministral {dict(mini)}")
llama = corr_row(st, "ap_drop", "LBP", "llama")
check(llama is None or (int(llama.n) == 1 and math.isnan(llama.spearman)), "llama (one run): no correlation")
try:
    st.no_such_table
    check(False, "st.no_such_table raises AttributeError")
except AttributeError as e:
    check("models" in str(e), f"AttributeError names the tables: {e}")

# --- (2) a capture run, analysed then cached ---------------------------------------------
if not args.qkgeom:
    print("the qkgeom program is not built (target qkgeom_cli): capture part skipped")
else:
    d2 = os.path.join(W, "capture")
    os.makedirs(d2)
    run(args.qkgeom, "synth", os.path.join(d2, "cap"), "--layers", "1", "--heads", "2", "--quiet")
    path2 = write_study(d2, {
        "runs": [{"name": "steep", "capture": "cap"}, {"name": "given", "metrics": {"ap_drop": 0.25}}],
        "correlate": ["ap_drop"],
    })
    a = q.study(path2, jobs=2)
    check([r["status"] for r in a.runs] == ["analysed", "given"], f"first call: {a.runs}")
    cache = os.path.join(d2, ".qkgeom-study-cache")
    check(a.cache == cache and os.path.isdir(cache), f"default cache {a.cache}")
    entries = [e for e in os.listdir(cache) if not e.startswith(".")]
    check(len(entries) == 1 and os.path.isfile(os.path.join(cache, entries[0], "study_key.json")),
          f"one cache entry: {entries}")
    m = a.models
    check(list(m.n_heads) == [2, 0] and list(m.n_layers)[0] == 1, f"n_heads {list(m.n_heads)} n_layers {list(m.n_layers)}")
    check(int(m.ap_drop_n[0]) == 2 and math.isfinite(m.ap_drop[0]), f"ap_drop {m.ap_drop[0]} over {m.ap_drop_n[0]}")
    tax = a.taxonomy
    check(int(tax[tax.run == "steep"]["count"].sum()) == 2, "taxonomy counts the two heads")
    b = q.study(path2, jobs=2)
    check([r["status"] for r in b.runs] == ["cached", "given"], f"second call: {b.runs}")
    check(list(b.models.status) == ["cached", "given"], f"models.status {list(b.models.status)}")
    for name in a.tables:
        ta, tb = a.tables[name], b.tables[name]
        if name == "models":  # the status column says what happened; every other cell is the same
            ta, tb = ta.drop(columns="status"), tb.drop(columns="status")
        check(ta.equals(tb) or (len(ta) == len(tb) == 0 and list(ta.columns) == list(tb.columns)),
              f"cached == analysed: {name}")
    check(all(r["note"] == "" for r in b.runs), f"no note for a sound cache entry: {b.runs}")
    # A damaged cache entry (a cached CSV edited by hand) is analysed again and said: a warning
    # and the run's note, as the program says it on stderr; the numbers are a clean run's.
    csv = os.path.join(cache, entries[0], "head_metrics.csv")
    with open(csv, "a") as fh:
        fh.write("\n")
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        h = q.study(path2, jobs=2)
    check(h.runs[0]["status"] == "analysed" and "damaged" in h.runs[0]["note"], f"damaged entry: {h.runs[0]}")
    check(any("run steep" in str(w.message) and "damaged" in str(w.message) for w in caught),
          f"a warning names the run and the damage: {[str(w.message) for w in caught]}")
    check(h.models.drop(columns="status").equals(a.models.drop(columns="status")), "healed == analysed: models")
    c = q.study(path2, cache=os.path.join(W, "other_cache"), options=q.Options(seed=7), jobs=2)
    check(c.runs[0]["status"] == "analysed", f"another cache and seed: {c.runs[0]}")
    # A broken capture: failed, the other run goes on.
    path3 = write_study(os.path.join(W, "broken"), {
        "runs": [{"name": "gone", "capture": "no_such_folder"}, {"name": "given", "metrics": {"ap_drop": 0.25}}]})
    f = q.study(path3)
    check([r["status"] for r in f.runs] == ["failed", "given"] and "no_such_folder" in f.runs[0]["message"],
          f"broken capture: {f.runs}")
    check(f.failed == [f.runs[0]], "Study.failed")

# --- (3) a bad study file --------------------------------------------------------------
path4 = write_study(os.path.join(W, "bad"), {"runs": [{"name": "a", "metrics": {"ap_drop": 0.1}, "colour": "red"}]})
try:
    q.study(path4)
    check(False, "a study file with an unknown key raises")
except q.InputError as e:
    check(e.field == "runs[0].colour", f"InputError.field {e.field!r}")
    check(e.source == path4 and "unknown key" in str(e), f"InputError.source {e.source!r}: {e}")
path5 = write_study(os.path.join(W, "bad2"), {"runs": [{"name": "a", "metrics": {"ap_drop": "x"}}]})
try:
    q.study(path5)
    check(False, "a text metric raises")
except q.InputError as e:
    check(e.field.startswith("runs[0].metrics"), f"InputError.field {e.field!r}")
try:
    q._qkgeom.run_study(path1, os.path.join(W, "c"), window=-2)
    check(False, "window=-2 raises")
except ValueError as e:
    check("window" in str(e), f"window=-2: {e}")

check.finish("python.module.study")
