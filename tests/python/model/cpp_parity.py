"""(b) The LibTorch capture of the trained model equals the Python capture, bit for bit.

tiny_llama_capture (C++, LibTorch 1.13: qkgeom's safetensors reader, the model's
forward repeated op for op, torch_capture<float> where RoPE is applied) and the
Python model with qkgeom.Recorder (patching tiny_llama.apply_rotary_pos_emb,
DatasetWriter sink) run on the same tokens and explicit positions
(tests/data/tiny_llama/tokens.npy, positions.npy) with the same bucket spec,
sampler seed and head plan. Both datasets are read back with qkgeom.read_entry
and compared with exact equality: the vectors' bits (float32 rows widened to
float64, compared as uint64 so that -0.0 != +0.0 and NaN payloads count), the
positions, buckets and example ids of every entry of every planned head. The
logits of the full forward pass are compared bit for bit too (the MLP, final norm
and head included). Both sides set one thread; Debian's python3-torch and
libtorch-dev are one build (libtorch_cpu.so.1.13), so the kernels are the same.
"""
import os
import subprocess

import _model_common as mc


def main():
    args = mc.parse_args(__doc__)
    np = mc.need("numpy")
    mc.need("torch")
    qkgeom = mc.need("qkgeom")
    if not args.cpp:
        print("SKIPPED: tiny_llama_capture not built (no LibTorch adapter)")
        raise SystemExit(mc.SKIP)
    tl, model = mc.tiny_llama(args)
    tokens, positions = mc.example_inputs(args)
    cpp_out, py_out = os.path.join(args.work, "cpp"), os.path.join(args.work, "python")
    cpp_logits = os.path.join(args.work, "cpp_logits.npy")
    import shutil

    shutil.rmtree(cpp_out, ignore_errors=True)
    cmd = [args.cpp, args.data, os.path.join(args.data, "tokens.npy"), os.path.join(args.data, "positions.npy"), cpp_out,
           "--width", str(mc.BUCKET_WIDTH), "--rate", repr(mc.BUCKET_RATE), "--seed", str(mc.SAMPLER_SEED),
           "--head-seed", str(mc.HEAD_SEED), "--logits", cpp_logits]
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    py_logits, _ = mc.python_capture(qkgeom, tl, model, tokens, positions, py_out)

    chk = mc.Checks()
    c_logits = np.load(cpp_logits)
    chk(c_logits.dtype == np.float32 and c_logits.shape == py_logits.shape
        and np.array_equal(c_logits.view(np.uint32), py_logits.view(np.uint32)),
        f"logits {py_logits.shape}: C++ == Python bit for bit")
    mc_, mp = qkgeom.read_manifest(cpp_out), qkgeom.read_manifest(py_out)
    hc, hp = list(qkgeom.planned_heads(mc_)), list(qkgeom.planned_heads(mp))
    chk([tuple(h) for h in hc] == [tuple(h) for h in hp] and len(hc) == 16, f"head plans equal ({len(hc)} heads)")
    same = {"vectors": 0, "position": 0, "bucket": 0, "example_id": 0}
    entries, rows, diffs = 0, 0, []
    for h in hp:
        for kind, head in (("query", h.q_head), ("key", h.k_head)):
            a = qkgeom.read_entry(cpp_out, mc_, h.layer, head, kind)
            b = qkgeom.read_entry(py_out, mp, h.layer, head, kind)
            entries += 1
            rows += len(b["position"])
            for f in same:
                x, y = np.asarray(a[f]), np.asarray(b[f])
                if f == "vectors":
                    ok = x.shape == y.shape and x.dtype == y.dtype == np.float64 and np.array_equal(
                        x.view(np.uint64), y.view(np.uint64))
                else:
                    ok = x.shape == y.shape and np.array_equal(x, y)
                same[f] += ok
                if not ok:
                    diffs.append(f"l{h.layer} {kind} head {head}: {f} differ")
    chk(rows > 0, f"{entries} entry reads (a GQA key entry once per query head reading it), {rows} rows")
    for f, n in same.items():
        chk(n == entries, f"{f}: {n}/{entries} entries bit-identical")
    if diffs:
        print("\n".join(diffs[:10]))
    chk.exit()


if __name__ == "__main__":
    main()
