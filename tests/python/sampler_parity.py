"""scripts/qkgeom_capture.py samplers == the C++ (buckets.hpp, capture.hpp).

For several seeds, bucket schemes, example ids (negative too), layers and both
kinds: the kept positions of the pure-Python keep_token, of the vectorised
NumPy keep_mask and of qkgeom::kept_positions (via qkgeom_py_check) are the
same lists. Head sampling: qkgeom_capture.sample_heads == qkgeom::sample_heads
for several layouts, counts, seeds and both eligibility rules. Also the
splitmix64 reference value and that buckets_of == bucket_of.
"""

from _common import Checks, run, setup

args = setup(__doc__)
import numpy as np  # noqa: E402
import qkgeom_capture as qc  # noqa: E402

check = Checks()
check(qc.splitmix64(0) == 0xE220A8397B1DCDAF, "splitmix64(0) is the reference generator's first output")

specs = [qc.BucketSpec("uniform", 16, 1.0), qc.BucketSpec("uniform", 128, 3.5), qc.BucketSpec("log", 16, 1.0),
         qc.BucketSpec("log", 5, 2.0), qc.BucketSpec("all", 64, 1.0), qc.BucketSpec("uniform", 4, 8.0)]
cases = [(0, 0, 0, "q"), (1234, 7, 3, "k"), (2 ** 63 - 1, -5, 0, "q"), (42, 123456789, 31, "k"), (99, 1, 1, "q")]
length = 3000
total = 0
for spec in specs:
    for seed, example, layer, kind in cases:
        cpp = run(args.checker, "kept", spec.scheme, spec.width, spec.rate, seed, example, layer, kind, length).stdout.split()
        cpp = [int(x) for x in cpp]
        py = qc.kept_positions(spec, seed, example, layer, qc.KINDS[kind], length)
        pos = np.arange(length)
        vec = np.nonzero(qc.keep_mask(spec, seed, np.full(length, example), layer, qc.KINDS[kind], pos))[0].tolist()
        what = f"{spec} seed {seed} example {example} layer {layer} kind {kind}"
        check(py == cpp, f"kept positions (python) == C++: {what}: {len(py)} vs {len(cpp)}")
        check(vec == cpp, f"kept positions (numpy) == C++: {what}")
        check(qc.buckets_of(spec, pos).tolist() == [qc.bucket_of(spec, int(t)) for t in pos], f"buckets_of: {spec}")
        total += len(cpp)
check(total > 1000, f"enough kept positions compared ({total})")

layouts = [
    [qc.LayerLayout(8, 2), qc.LayerLayout(8, 2, 4096), qc.LayerLayout(8, 8), qc.LayerLayout(16, 4, 128)],
    [qc.LayerLayout(32, 8)] * 16,
    [qc.LayerLayout(4, 1, 512), qc.LayerLayout(6, 3)],
]
for li, layers in enumerate(layouts):
    spec_args = [f"{L.n_q_heads}:{L.n_kv_heads}" + (f":{L.sliding_window}" if L.sliding_window else "") for L in layers]
    for eligibility in qc.ELIGIBILITIES:
        for count in (0, 1, 3, 10, 64, None):
            for seed in (0, 1, 2 ** 40 + 3):
                out = run(args.checker, "heads", seed, "all" if count is None else count, eligibility, *spec_args).stdout
                cpp = [tuple(int(x) for x in line.split()) for line in out.splitlines()]
                py = qc.sample_heads(layers, count, seed, eligibility)
                check(py == cpp, f"sample_heads layout {li} {eligibility} count {count} seed {seed}: {py[:4]} vs {cpp[:4]}")
check.finish("python.sampler_parity")
