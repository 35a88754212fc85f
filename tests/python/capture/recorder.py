"""qkgeom.capture.Recorder on planted q/k (CTest python.capture.recorder; argv[1] = scratch folder).

Every expectation is built independently of the Recorder: the valid (unpadded) tokens come from
the mask, the kept ones from TokenSampler.select on those tokens' positions and example ids, the
expected rows are the planted tensors at those tokens, and the expected moments are HeadMoments.add
of those rows. Exit 77 when torch or NumPy is missing.
"""

import os
import shutil
import sys
import types

try:
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _checks import check, finish, raises as _raises  # noqa: E402  (tests/python/capture/_checks.py)
import qkgeom
from qkgeom.capture import Recorder, manifest_for


def raises(fn, text, what):
    _raises(fn, text, what, errors=(ValueError, RuntimeError, TypeError))


WORK = sys.argv[1] if len(sys.argv) > 1 else "/tmp/qkgeom-recorder"


D, NQ, NKV, L, T, B, CTX = 8, 4, 2, 3, 20, 3, 64
LAYOUT = qkgeom.ModelLayout(D, [NQ] * L, [NKV] * L, [None, None, 16])  # layer 2 slides
BUCKETS = qkgeom.BucketSpec("uniform", 4, 2.0)  # keep probability 1/2
SEED = 7
gen = torch.Generator().manual_seed(11)


def batch_tokens():
    """mask (3 lengths: 20, 13, 7), positions: cumulative mask - 1 (sequence 1 offset by 30), example ids."""
    mask = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate((20, 13, 7)):
        mask[b, :n] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    pos[1] += 30
    return mask, pos


def same_moments(a, b):
    """Two HeadMoments.buckets(kind) dicts equal bit for bit."""
    if sorted(a) != sorted(b):
        return False
    return all(sorted(a[k]) == sorted(b[k]) and all(np.array_equal(np.asarray(a[k][f]), np.asarray(b[k][f]))
                                                    for f in a[k]) for k in a)


def planted(layer_count=L):
    qs = [torch.randn(B, NQ, T, D, generator=gen) for _ in range(layer_count)]
    ks = [torch.randn(B, NKV, T, D, generator=gen) for _ in range(layer_count)]
    return qs, ks


def expected(layer, kind, x, mask, pos, ex, heads):
    """{head: (rows, positions, example ids)} at the kept valid tokens, computed from scratch."""
    valid = [(b, t) for b in range(B) for t in range(T) if mask[b, t]]
    vpos = np.array([int(pos[b, t]) for b, t in valid], dtype=np.int64)
    vex = np.array([int(ex[b]) for b, _ in valid], dtype=np.int64)
    kept = qkgeom.TokenSampler(BUCKETS, SEED).select(vpos, vex, layer, kind)
    out = {}
    for h in heads:
        rows = np.stack([x[valid[i][0], h, valid[i][1]].numpy() for i in kept]) if len(kept) else np.zeros((0, D))
        out[h] = (rows.astype(np.float32), vpos[kept], vex[kept])
    return out


def test_moments_sink():
    mask, pos = batch_tokens()
    qs, ks = planted()
    rec = Recorder(LAYOUT, buckets=BUCKETS, seed=SEED, sink="moments", context_length=CTX)
    check(sorted({h.layer for h in rec.heads}) == [0, 1], "full_attention_only: no head of sliding layer 2")
    for layer in range(L):
        rec.record(layer, qs[layer], ks[layer], pos, mask=mask)
    rec.step()
    ex = np.arange(B)
    got = rec.moments()
    for hid, mom in got.items():
        ref = qkgeom.HeadMoments(D, hid)
        for kind, x, h in (("query", qs[hid.layer], hid.q_head), ("key", ks[hid.layer], hid.k_head)):
            rows, p, _ = expected(hid.layer, kind, x, mask, pos, ex, [h])[h]
            # a padded token never kept: every expected position is a valid token's
            ref.add(kind, rows, p, qkgeom.bucket_of(BUCKETS, p))
            check(mom.rows(kind) == len(p), f"{hid} {kind}: {mom.rows(kind)} rows, expected {len(p)}")
            check(same_moments(mom.buckets(kind), ref.buckets(kind)), f"{hid} {kind}: moments differ from HeadMoments.add")
    check(len(got) == 2 * NQ, f"planned heads {len(got)} != {2 * NQ}")


def read_back(out, m):
    man = qkgeom.read_manifest(out)
    return man, {(layer, h, kind): qkgeom.read_entry(out, man, layer, h, kind)
                 for layer in range(L) for kind, n in (("q", NQ), ("k", NKV)) for h in range(n)
                 if os.path.isdir(os.path.join(out, f"l{layer:02d}h{h:02d}{kind}"))}


def test_dataset_sink_and_layouts():
    mask, pos = batch_tokens()
    out = os.path.join(WORK, "ds")
    shutil.rmtree(out, ignore_errors=True)
    heads = [(0, 1), (1, 3)]
    m = manifest_for(LAYOUT, model="toy", buckets=BUCKETS, context_length=CTX, seed=SEED, heads=heads,
                     rope_applied=[True, False, True])
    writer = qkgeom.DatasetWriter(out, m)
    rec = Recorder(LAYOUT, buckets=BUCKETS, seed=SEED, heads=heads, sink=writer, context_length=CTX,
                   rope_applied=[True, False, True])
    steps = []
    for step in range(2):  # two steps: example ids 0..2 then 3..5; the second in [B, T, H, D] layout
        qs, ks = planted()
        steps.append((qs, ks))
        for layer in range(L):
            if step == 0:
                rec.record(layer, qs[layer], ks[layer], pos, mask=mask, rope_applied=layer != 1)
            else:
                rec.record(layer, qs[layer].transpose(1, 2), ks[layer].transpose(1, 2), pos, mask=mask,
                           layout="bthd", rope_applied=layer != 1)
        rec.step()
    rec.close()
    man, entries = read_back(out, m)
    check(man.rope_applied == [True, False, True], f"manifest rope_applied {man.rope_applied}")
    check(man.token_sampler == "qkgeom", f"token_sampler {man.token_sampler}")
    want = {(0, 1, "q"), (0, 0, "k"), (1, 3, "q"), (1, 1, "k")}
    check(set(entries) == want, f"entries {sorted(entries)} != {sorted(want)}")
    for (layer, h, kind), e in entries.items():
        parts = [expected(layer, "query" if kind == "q" else "key", (st[0] if kind == "q" else st[1])[layer],
                          mask, pos, np.arange(B) + B * i, [h])[h] for i, st in enumerate(steps)]
        rows = np.concatenate([p[0] for p in parts])
        check(np.array_equal(e["vectors"], rows.astype(np.float64)), f"l{layer}h{h}{kind}: rows differ")
        check(np.array_equal(e["position"], np.concatenate([p[1] for p in parts])), f"l{layer}h{h}{kind}: positions")
        check(np.array_equal(e["example_id"], np.concatenate([p[2] for p in parts])), f"l{layer}h{h}{kind}: ids")
        valid = {(b + B * i, int(pos[b, t])) for i in range(2) for b in range(B) for t in range(T) if mask[b, t]}
        check(all((int(x), int(p)) in valid for x, p in zip(e["example_id"], e["position"])),
              f"l{layer}h{h}{kind}: a padded token was recorded")
    check_explicit_plan(out, man)


def check_explicit_plan(out, man):
    """The explicit heads are the manifest's plan (capture.heads): analyze_dataset plans exactly those
    and reports no failure; the same folder without the list plans every head and reports the absent ones."""
    check(man.head_list == [(0, 1), (1, 3)] and man.heads is None, f"head_list {man.head_list}, heads {man.heads}")
    plan = [tuple(h) for h in qkgeom.planned_heads(man)]
    check(plan == [(0, 1, 0), (1, 3, 1)], f"planned_heads {plan}")
    run = qkgeom.analyze_dataset(out, jobs=1)
    check(run.planned == 2 and not run.failures, f"planned {run.planned}, failures {run.failures}")
    check([(h.layer, h.q_head, h.k_head) for h in run.heads] == plan, f"analysed {[h.id for h in run.heads]}")
    unplanned = os.path.join(WORK, "ds-unplanned")
    shutil.rmtree(unplanned, ignore_errors=True)
    shutil.copytree(out, unplanned)
    man.head_list = None
    qkgeom.write_manifest(unplanned, man)
    run = qkgeom.analyze_dataset(unplanned, jobs=1)
    check(run.planned == L * NQ and len(run.failures) == L * NQ - 2,
          f"without capture.heads: planned {run.planned}, failures {len(run.failures)} (expected {L * NQ - 2})")


def test_head_list_attribute():
    """Manifest.head_list: keyword and attribute, (layer, q_head) pairs or HeadIds, listed order kept;
    manifest_for records a Recorder's explicit heads ascending; refusals name the field."""
    m = manifest_for(LAYOUT, model="toy", buckets=BUCKETS, context_length=CTX, heads=[(2, 3), (0, 0)])
    check(m.head_list == [(0, 0), (2, 3)] and m.heads is None, f"manifest_for head_list {m.head_list}")
    check('"heads"' in m.to_json() and '"head_count"' not in m.to_json(), "capture.heads written, no head_count")
    m.head_list = [qkgeom.HeadId(1, 2, 1), (0, 3)]
    check(m.head_list == [(1, 2), (0, 3)], f"set head_list {m.head_list}")
    check([tuple(h) for h in qkgeom.planned_heads(m)] == [(0, 3, 1), (1, 2, 1)], "planned_heads ascending")
    out = os.path.join(WORK, "head_list")
    qkgeom.write_manifest(out, m)
    check(qkgeom.read_manifest(out).head_list == [(1, 2), (0, 3)], "head_list round trip (listed order)")
    m.head_list = None
    check(m.head_list is None, "head_list None = not recorded")
    raises(lambda: manifest_for(LAYOUT, model="toy", buckets=BUCKETS, context_length=CTX, heads=[]),
           "plans no head", "an empty explicit plan")
    raises(lambda: setattr(m, "head_list", [(0, 1, 2, 3)]), "head_list[0]", "a triple that is no HeadId")
    m.head_list = [(0, 9)]
    raises(lambda: qkgeom.write_manifest(out, m), "capture.heads[0]: q_head outside [0, n_q_heads[0] = 4)",
           "out-of-range head refused at write")
    m.head_list = [(0, 1)]
    m.heads = qkgeom.HeadSampling(2)
    raises(lambda: qkgeom.write_manifest(out, m), "capture.heads", "list and sampling refused at write")


def test_patch():
    """patch(): the wrapped function's OUTPUTS are recorded, layers counted per forward, original restored."""
    def rope(q, k, cos, sin):
        return q * cos + 1.0, k * sin - 1.0

    ns = types.SimpleNamespace(apply_rotary_pos_emb=rope)
    qs, ks = planted()
    rec = Recorder(LAYOUT, buckets=BUCKETS, seed=SEED, sink="moments", context_length=CTX)
    direct = Recorder(LAYOUT, buckets=BUCKETS, seed=SEED, sink="moments", context_length=CTX)
    with rec.patch(ns, "apply_rotary_pos_emb"):
        check(ns.apply_rotary_pos_emb is not rope, "patch installed")
        for _ in range(2):  # two forwards: the counter wraps at n_layers and starts a new step
            for layer in range(L):
                ns.apply_rotary_pos_emb(qs[layer], ks[layer], 2.0, 3.0)
    check(ns.apply_rotary_pos_emb is rope, "patch restored the original")
    for _ in range(2):
        for layer in range(L):
            direct.record(layer, qs[layer] * 2.0 + 1.0, ks[layer] * 3.0 - 1.0)
        direct.step()
    a, b = rec.moments(), direct.moments()
    for hid in a:
        for kind in ("query", "key"):
            check(same_moments(a[hid].buckets(kind), b[hid].buckets(kind)), f"patch {hid} {kind}: differs from record()")
            check(a[hid].rows(kind) > 0, f"patch {hid} {kind}: no rows")
    try:
        with rec.patch(ns, "apply_rotary_pos_emb"):
            raise KeyError("boom")
    except KeyError:
        pass
    check(ns.apply_rotary_pos_emb is rope, "patch restored the original after an exception")
    raises(lambda: rec.patch(ns, "no_such_fn").__enter__(), "no_such_fn", "patch of a missing function")


def test_refusals():
    qs, ks = planted()
    rec = Recorder(LAYOUT, buckets=BUCKETS, seed=SEED, sink="moments", context_length=CTX,
                   rope_applied=[True, True, True])
    raises(lambda: rec.record(0, qs[0], ks[0], rope_applied=False), "rope_applied", "contradicting rope_applied")
    rec2 = Recorder(LAYOUT, buckets=BUCKETS, seed=SEED, sink="moments", context_length=10)
    raises(lambda: rec2.record(0, qs[0], ks[0]), "context_length = 10", "position beyond the context")
    rec3 = Recorder(LAYOUT, buckets=BUCKETS, seed=SEED, sink="moments", context_length=CTX)
    raises(lambda: rec3.record(0, ks[0], ks[0]), "n_q_heads = 4", "wrong head count")
    raises(lambda: Recorder(LAYOUT, buckets=BUCKETS, heads=[(0, 9)], context_length=CTX), "9",
           "explicit head outside the layer")
    rec4 = Recorder(LAYOUT, buckets=BUCKETS, seed=SEED, sink="moments", context_length=CTX)
    mask, pos = batch_tokens()
    rec4.set_batch(pos, mask=mask)
    rec4.record(0, qs[0], ks[0])
    raises(lambda: rec4.record(0, qs[0], ks[0]), "without set_batch", "a second forward reusing one set_batch")


def main():
    os.makedirs(WORK, exist_ok=True)
    test_moments_sink()
    test_dataset_sink_and_layouts()
    test_head_list_attribute()
    test_patch()
    test_refusals()
    return finish()


if __name__ == "__main__":
    sys.exit(main())
