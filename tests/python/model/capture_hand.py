"""(a) The generic capture of the trained model equals q/k recomputed by hand.

qkgeom.Recorder wraps examples/python/tiny_llama.apply_rotary_pos_emb by name
(Recorder.patch) and writes the kept rows of every head to a dataset (f32). A
forward hook records each layer's attention input x (the RMSNorm output the
projections read). The reference, in float64 NumPy from model.safetensors:
q_h = W_q[h] x, k_g = W_k[g] x, then rotate-half RoPE with angle
position * theta^(-2i/D) (i < D/2) -- computed independently of torch.

Tolerance (per element, and why): the model computes in float32. The projection
is a float32 dot product of n = d_model terms, so |fl(w.x) - w.x| <=
gamma_n sum_i |w_i x_i| with gamma_n = n u / (1 - n u), u = 2^-24 (any summation
order, blocked GEMMs included). RoPE adds: the float32 angle fl(fl(pos) *
inv_freq_f32), inv_freq_f32 = 1/theta^(2i/D) rounded in pow and reciprocal, so
|angle_f32 - angle| <= 8 u angle (slack over ~4 roundings), cos/sin within 2u
absolute, and the products and the sum within 2u relative. Per output element
bound = 2 * (e1 + e2 + (|a| + |b|) (8 u angle + 4 u)), where a, b are the
pair's two projected coordinates and e1, e2 their projection bounds (the factor 2
covers second-order terms). A wrong position (+1), the interleaved pairing or
the neighbouring head break this bound on most rows: checked too, so the test
can fail.

Also checked: every planned head has query and key rows, and the kept (example,
position) pairs of each (layer, kind) are TokenSampler.select's on the flat
positions (the Recorder hands the sampler the right tokens).
"""
import os

import _model_common as mc

U = 2.0 ** -24


def rope64(x, pos, theta, interleaved=False):
    """Rotate-half (or interleaved) RoPE in float64: x [n, D], pos [n]."""
    import numpy as np

    d = x.shape[1]
    inv = theta ** (-(2.0 * np.arange(d // 2)) / d)
    ang = pos[:, None].astype(np.float64) * inv[None, :]
    c, s = np.cos(ang), np.sin(ang)
    if interleaved:
        a, b = x[:, 0::2], x[:, 1::2]
        out = np.empty_like(x)
        out[:, 0::2], out[:, 1::2] = a * c - b * s, b * c + a * s
        return out
    a, b = x[:, : d // 2], x[:, d // 2:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=1)


def reference(np, w, xin, pos, theta, d_model, interleaved=False):
    """(reference rows [n, D] float64, per-element bound [n, D])."""
    gamma = d_model * U / (1 - d_model * U)
    proj = xin @ w.T
    err = gamma * (np.abs(xin) @ np.abs(w).T)
    d = w.shape[0]
    inv = theta ** (-(2.0 * np.arange(d // 2)) / d)
    ang = np.abs(pos[:, None].astype(np.float64) * inv[None, :])
    a, b = proj[:, : d // 2], proj[:, d // 2:]
    ea, eb = err[:, : d // 2], err[:, d // 2:]
    half = 2.0 * (ea + eb + (np.abs(a) + np.abs(b)) * (8 * U * ang + 4 * U))
    return rope64(proj, pos, theta, interleaved), np.concatenate([half, half], axis=1)


def main():
    args = mc.parse_args(__doc__)
    np = mc.need("numpy")
    mc.need("torch")
    qkgeom = mc.need("qkgeom")
    tl, model = mc.tiny_llama(args)
    cfg = model.cfg
    tokens, positions = mc.example_inputs(args)
    out = os.path.join(args.work, "python_capture")
    _, inputs = mc.python_capture(qkgeom, tl, model, tokens, positions, out, record_inputs=True)
    weights, _ = tl.load_safetensors(os.path.join(args.data, "model.safetensors"))
    m = qkgeom.read_manifest(out)
    heads = qkgeom.planned_heads(m)
    chk = mc.Checks()
    chk(len(heads) == cfg.n_layers * cfg.n_heads, f"{len(heads)} planned heads (every head)")
    sampler = qkgeom.TokenSampler(qkgeom.BucketSpec(mc.BUCKET_SCHEME, mc.BUCKET_WIDTH, mc.BUCKET_RATE), mc.SAMPLER_SEED)
    flat_pos = positions.reshape(-1)
    flat_ex = np.repeat(np.arange(tokens.shape[0], dtype=np.int64), tokens.shape[1])

    worst, worst_rel, rows, bad_controls, n_entries, sel_ok = 0.0, 0.0, 0, [], 0, True
    D = cfg.head_dim
    for h in heads:
        for kind, head, proj in (("query", h.q_head, "q_proj"), ("key", h.k_head, "k_proj")):
            e = qkgeom.read_entry(out, m, h.layer, head, kind)
            vec, pos, ex = e["vectors"], np.asarray(e["position"]), np.asarray(e["example_id"])
            n_entries += 1
            kept = np.asarray(sampler.select(flat_pos, flat_ex, h.layer, kind))
            want = sorted(zip(flat_ex[kept].tolist(), flat_pos[kept].tolist()))
            sel_ok &= sorted(zip(ex.tolist(), pos.tolist())) == want and len(want) > 0
            t = pos - positions[ex, 0]  # the token index of each row (positions are consecutive)
            xin = inputs[h.layer][ex, t].astype(np.float64)
            w = weights[f"layers.{h.layer}.self_attn.{proj}.weight"].astype(np.float64)
            ref, bound = reference(np, w[head * D:(head + 1) * D], xin, pos, cfg.rope_theta, cfg.d_model)
            err = np.abs(vec - ref)
            worst = max(worst, float((err / bound).max()))
            worst_rel = max(worst_rel, float((err.max(axis=1) / np.abs(ref).max(axis=1)).max()))
            rows += len(pos)
            # controls: each wrong reference must break the bound on most rows
            other = w[((head + 1) % (w.shape[0] // D)) * D:][:D]
            for name, (r2, _) in (("position + 1", reference(np, w[head * D:(head + 1) * D], xin, pos + 1, cfg.rope_theta, cfg.d_model)),
                                  ("interleaved", reference(np, w[head * D:(head + 1) * D], xin, pos, cfg.rope_theta, cfg.d_model, True)),
                                  ("other head", reference(np, other, xin, pos, cfg.rope_theta, cfg.d_model))):
                frac = float((np.abs(vec - r2) > bound).any(axis=1).mean())
                if frac < 0.5:
                    bad_controls.append(f"l{h.layer} {kind} {head} {name}: only {frac:.2f} of rows off")
    chk(sel_ok, f"kept (example, position) pairs of all {n_entries} entries == TokenSampler.select on the flat positions")
    chk(worst <= 1.0, f"{rows} rows: max |capture - float64 reference| / bound = {worst:.3g} (<= 1); "
                      f"max error relative to the row's largest entry {worst_rel:.3g}")
    chk(not bad_controls, "wrong references (position + 1, interleaved pairing, other head) break the bound on "
                          "most rows" + ("" if not bad_controls else ": " + "; ".join(bad_controls[:5])))
    chk.exit()


if __name__ == "__main__":
    main()
