"""Issue test (c): the Python analysis equals `qkgeom analyze` on the written dataset, bit for bit.

(1) A dataset made by `qkgeom synth` (f32). `qkgeom analyze` writes the CSVs; then
    - qkgeom.analyze_dataset(DIR): frames(run) == every CSV file (columns == the header line,
      values bit for bit, read with float_precision="round_trip");
    - analyze_head from the entries' arrays (np.load, float32, read in place): the same tables;
    - non-default options: Options(...) == the program's flags, bit for bit (and the results differ
      from the defaults', so the options reach the analysis);
    - a deleted entry: analyze_dataset's failures == the program's failures.txt lines.
(2) A dataset written by DatasetWriter from planted arrays (GQA, two layers, a sliding window,
    tokens chosen by TokenSampler, several batches, a small buffer so rows are flushed mid-way):
    entries read back == the arrays; `qkgeom analyze` of it == analyze_head of the arrays.
(3) Errors name the argument; a writer left by an exception leaves no manifest.json.
"""

import os
import shutil

from module_common import Checks, compare_frame_csv, read_csv, run, setup

args = setup(__doc__, need_pandas=True)
import numpy as np  # noqa: E402

import qkgeom as q  # noqa: E402
from qkgeom import frames as qf  # noqa: E402

if not args.qkgeom:
    print("the qkgeom program is not built (target qkgeom_cli): skipped")
    raise SystemExit(77)
check = Checks()
W = args.work
TABLES = ["head_metrics", "head_bucket_plasticity", "head_component_weights", "qk_pca"]


def cli_analyze(data, out, *flags, expect=0):
    return run(args.qkgeom, "analyze", data, "-o", out, "-j", "2", "--quiet", "--no-pictures", *flags, expect=expect)


def compare_all(heads, out, what):
    fr = qf.frames(heads)
    check(sorted(fr) == sorted(TABLES), f"{what}: frames() keys {sorted(fr)}")
    for t in TABLES:
        compare_frame_csv(check, fr[t], os.path.join(out, f"{t}.csv"), f"{what} / {t}.csv")
    compare_frame_csv(check, qf.gqa_groups_frame(heads), os.path.join(out, "gqa_groups.csv"),
                      f"{what} / gqa_groups.csv")


def load_entry(data, name):
    d = os.path.join(data, name)
    sw = os.path.join(d, "sliding_window.npy")
    return {
        "vectors": np.load(os.path.join(d, "vectors.npy"), mmap_mode="r"),
        "position": np.load(os.path.join(d, "position.npy")),
        "bucket": np.load(os.path.join(d, "bucket.npy")),
        "example_id": np.load(os.path.join(d, "example_id.npy")),
        "sliding_window": int(np.load(sw)) if os.path.exists(sw) else 0,
    }


def heads_from_arrays(data, options=None):
    m = q.read_manifest(data)
    out = []
    for h in q.planned_heads(m):
        qe = load_entry(data, f"l{h.layer:02d}h{h.q_head:02d}q")
        ke = load_entry(data, f"l{h.layer:02d}h{h.k_head:02d}k")
        out.append(q.analyze_head(qe["vectors"], qe["position"], ke["vectors"], ke["position"],
                                  q_buckets=qe["bucket"], k_buckets=ke["bucket"], q_example_ids=qe["example_id"],
                                  k_example_ids=ke["example_id"], head=h, buckets=m.buckets,
                                  sliding_window=ke["sliding_window"], context_length=m.context_length,
                                  options=options))
    return out


# --- (1) a `qkgeom synth` dataset -------------------------------------------------------------
synth = os.path.join(W, "synth")
run(args.qkgeom, "synth", synth, "--layers", "2", "--heads", "5", "--head-seed", "3", "--dtype", "f32", "--quiet")
out1 = os.path.join(W, "out_default")
cli_analyze(synth, out1)
run1 = q.analyze_dataset(synth, jobs=2)
check(run1.planned == 5 and len(run1.heads) == 5 and run1.failures == [], f"analyze_dataset: {run1}")
check(list(q.head_metrics_columns()) == read_csv(os.path.join(out1, "head_metrics.csv")).columns.tolist(),
      "head_metrics_columns() == the CSV header")
compare_all(run1, out1, "analyze_dataset")
compare_all(heads_from_arrays(synth), out1, "analyze_head from arrays")
h0 = run1.heads[0]
row = read_csv(os.path.join(out1, "head_metrics.csv")).iloc[0]


def same_cell(a, b):
    """An attribute and its CSV cell: the same text, or the same float (a column of whole
    numbers, e.g. gaussian_gap_se 0 where every cell was counted, reads back as integers)."""
    if str(a) == str(b):
        return True
    if isinstance(a, float):
        return (np.isnan(a) and np.isnan(float(b))) or a == float(b)
    return False


check(all(same_cell(getattr(h0, c), row[c]) for c in q.head_metrics_columns()),
      "HeadAnalysis attributes == the head_metrics.csv row")

flags = ["--components", "3", "--sign", "query_anchor", "--low", "0.2", "--high", "0.8", "--separation",
         "max_separation", "--semantic", "full", "--no-diagnostics", "--ks-alpha", "0.01", "--pairs", "prefix",
         "--weighting", "cell_mean", "--enumeration", "sampled", "--samples", "64", "--seed", "5", "--no-split",
         "--rank-keys", "4", "--rank-sets", "8", "--rank-draw", "same_bucket", "--rope-bands", "3"]
opts = q.Options(components=3, sign="query_anchor", low=0.2, high=0.8, separation="max_separation",
                 semantic="full", diagnostics=False, ks_alpha=0.01, pairs="prefix", weighting="cell_mean",
                 enumeration="sampled", samples=64, seed=5, split=False, rank_keys=4, rank_sets=8,
                 rank_draw="same_bucket", rope_bands=3)
out2 = os.path.join(W, "out_options")
cli_analyze(synth, out2, *flags)
run2 = q.analyze_dataset(synth, opts, jobs=1)
compare_all(run2, out2, "analyze_dataset with options")
compare_all(heads_from_arrays(synth, opts), out2, "analyze_head from arrays with options")
d1, d2 = qf.head_metrics_frame(run1), qf.head_metrics_frame(run2)
check(not np.array_equal(d1["ap_overall"].to_numpy(), d2["ap_overall"].to_numpy()), "options change ap_overall")
check(len(qf.qk_pca_frame(run2)) == 3 * 5, "components=3: three qk_pca rows per head")
check(d2["ap_drop_bias"].isna().all() and d1["ap_drop_bias"].notna().all(), "split=False: ap_drop_bias nan")
check(q.Options(ranks=False).ranks is False and q.Options().rank_keys == 8, "Options: ranks, rank_keys")
try:
    q.Options(rank_draw="nearest")
    check(False, "Options(rank_draw='nearest') must raise")
except ValueError as e:
    check("prefix | same_bucket" in str(e), f"rank_draw error lists the choices: {e}")

broken = os.path.join(W, "synth_missing")
shutil.copytree(synth, broken)
victim = q.planned_heads(q.read_manifest(broken))[2]
shutil.rmtree(os.path.join(broken, f"l{victim.layer:02d}h{victim.q_head:02d}q"))
out3 = os.path.join(W, "out_missing")
cli_analyze(broken, out3, expect=3)
run3 = q.analyze_dataset(broken)
with open(os.path.join(out3, "failures.txt"), encoding="utf-8") as f:
    lines = f.read().splitlines()
mine = [f"l{h.layer:02d}h{h.q_head:02d}q (layer {h.layer}, query head {h.q_head}): {msg}" for h, msg in run3.failures]
check(mine == lines, f"failures {mine} != failures.txt {lines}")
check(run3.missing == [victim] and len(run3.heads) == 4, "the missing head is listed, the others analysed")
compare_all(run3, out3, "analyze_dataset with a missing entry")

# --- (2) a dataset written by DatasetWriter from arrays -------------------------------------
rng = np.random.default_rng(2024)
L, d, ctx = 512, 16, 512
spec = q.BucketSpec("uniform", 64, 8.0)
man = q.Manifest(model="planted", n_layers=2, n_q_heads=[4, 4], n_kv_heads=[2, 2], head_dim=d, buckets=spec,
                 context_length=ctx, seed=9, sliding_window=[None, 96], heads=q.HeadSampling(None, 0, "all_layers"),
                 rope_applied=[True, False], token_sampler="qkgeom")
sampler = q.TokenSampler(spec, seed=9)
rows = {}  # (layer, kind, head) -> [rows, positions, example ids]
written = os.path.join(W, "written")
with q.DatasetWriter(written, man, dtype="f32", buffer_bytes=64 << 10) as w:
    for ex in range(3):
        t = np.arange(L)
        exid = np.full(L, 100 + ex)
        for layer in range(2):
            for kind, nh in (("q", 4), ("k", 2)):
                keep = sampler.select(t, exid, layer, kind)
                for h in range(nh):
                    drift = rng.standard_normal(d) * (0.5 + h)
                    x = (np.outer(t / L, drift) + rng.standard_normal((L, d))).astype(np.float32)[keep]
                    xv = np.asfortranarray(x) if h % 2 else x  # the writer reads any layout too
                    w.append(layer, kind, h, xv, t[keep], exid[keep])
                    acc = rows.setdefault((layer, kind, h), [[], [], []])
                    acc[0].append(x)
                    acc[1].append(t[keep])
                    acc[2].append(exid[keep])
    check(w.buffered_bytes <= 64 << 10, f"buffered bytes {w.buffered_bytes} within the budget")
rows = {k: [np.concatenate(v[0]), np.concatenate(v[1]), np.concatenate(v[2])] for k, v in rows.items()}
back = q.read_manifest(written)
check(back.rope_applied == [True, False] and back.token_sampler == "qkgeom" and back.sliding_window == [None, 96],
      "manifest written: rope_applied, token_sampler, sliding_window")
for (layer, kind, h), (x, t, e) in rows.items():
    ent = q.read_entry(written, back, layer, h, kind)
    ok = (np.array_equal(ent["vectors"], x.astype(np.float64)) and np.array_equal(ent["position"], t)
          and np.array_equal(ent["example_id"], e) and np.array_equal(ent["bucket"], q.bucket_of(spec, t)))
    check(ok, f"entry l{layer}h{h}{kind} read back == the appended rows")
    check(ent["sliding_window"] == (96 if layer == 1 else None), f"entry l{layer}h{h}{kind} sliding window")
out4 = os.path.join(W, "out_written")
cli_analyze(written, out4)
mine = []
for hid in q.planned_heads(back):
    qx, qt, qe = rows[(hid.layer, "q", hid.q_head)]
    kx, kt, ke = rows[(hid.layer, "k", hid.k_head)]
    check(hid.k_head == q.key_head_of(hid.q_head, 4, 2), f"{hid}: GQA key head")
    mine.append(q.analyze_head(qx, qt, kx, kt, q_example_ids=qe, k_example_ids=ke, head=hid, buckets=spec,
                               sliding_window=96 if hid.layer == 1 else 0, context_length=ctx))
check(len(mine) == 8, "8 planned heads")
compare_all(mine, out4, "DatasetWriter dataset: analyze_head of the arrays vs qkgeom analyze")

# --- (3) errors ------------------------------------------------------------------------------
check.raises(ValueError, lambda: q.analyze_dataset(synth, context=-1), ["context"], "negative context")
check.raises(TypeError, lambda: q.Options(bogus=1), ["bogus", "components"], "unknown option")
check.raises(ValueError, lambda: q.Options(pairs="pooled"), ["Options.pairs", "pooled", "prefix | same_bucket"],
             "bad policy")
check.raises(q.InputError, lambda: q.analyze_dataset(os.path.join(W, "nowhere")), ["manifest.json"], "no dataset")
bad_dir = os.path.join(W, "aborted")
try:
    with q.DatasetWriter(bad_dir, man) as w:
        w.append(0, "q", 0, np.zeros((3, d), np.float32), [0, 1, 2], [0, 0, 0])
        w.append(0, "q", 0, np.zeros((3, d + 1), np.float32), [0, 1, 2], [0, 0, 0])
except ValueError as e:
    check("head_dim" in str(e) and "l00h00q" in str(e), f"writer width error names the entry and field: {e}")
else:
    check(False, "a row of the wrong width was accepted")
check(not os.path.exists(os.path.join(bad_dir, "manifest.json")), "an aborted writer leaves no manifest.json")
check.raises(OSError, lambda: q.DatasetWriter(written, man), ["manifest.json"], "writing over a dataset")
check.raises(ValueError, lambda: q.DatasetWriter(os.path.join(W, "w2"), man).append(0, "k", 2, np.zeros((1, d)), [0],
                                                                                    [0]),
             ["n_kv_heads", "head"], "key head out of range")

check.finish("python.module.analyze")
