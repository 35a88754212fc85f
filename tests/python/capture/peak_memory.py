"""Peak memory of a capture stream (CTest python.capture.peak_memory; argv[1] = scratch folder).

A child process streams N batches of q/k through a Recorder into a DatasetWriter (scheme "all":
every token kept, so every row is written) and prints its peak resident set (ru_maxrss). The
same child with 1 batch gives the baseline. The rows are never all in RAM when the growth from
1 to N batches stays far below the bytes the N batches wrote: here it must stay below a quarter
of them (the writer's buffer is 4 MiB; the N-batch run writes ~100 MB).
"""

import os
import shutil
import subprocess
import sys

try:
    import numpy  # noqa: F401
    import torch  # noqa: F401
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

WORK = sys.argv[1] if len(sys.argv) > 1 else "/tmp/qkgeom-peak-memory"
B, T, NQ, NKV, D = 4, 256, 8, 2, 64

CHILD = r"""
import resource, sys, torch, qkgeom
from qkgeom.capture import Recorder, manifest_for
out, n = sys.argv[1], int(sys.argv[2])
B, T, NQ, NKV, D = %d, %d, %d, %d, %d
layout = qkgeom.ModelLayout(D, [NQ], [NKV])
spec = qkgeom.BucketSpec("all", 64, 1.0)
m = manifest_for(layout, model="stream", buckets=spec, context_length=T)
w = qkgeom.DatasetWriter(out, m, buffer_bytes=4 << 20)
rec = Recorder(layout, buckets=spec, sink=w, context_length=T)
g = torch.Generator().manual_seed(1)
for _ in range(n):
    q = torch.randn(B, NQ, T, D, generator=g)
    k = torch.randn(B, NKV, T, D, generator=g)
    rec.record(0, q, k)
    rec.step()
    del q, k
rec.close()
rows = rec.rows_recorded()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, (rows["query"] + rows["key"]) * D * 4)
""" % (B, T, NQ, NKV, D)


def run(n):
    out = os.path.join(WORK, f"n{n}")
    shutil.rmtree(out, ignore_errors=True)
    r = subprocess.run([sys.executable, "-c", CHILD, out, str(n)], capture_output=True, text=True, check=False)
    if r.returncode:
        print(r.stdout, r.stderr)
        sys.exit(1)
    rss_kib, written = (int(x) for x in r.stdout.split())
    shutil.rmtree(out, ignore_errors=True)
    return rss_kib * 1024, written


def main():
    os.makedirs(WORK, exist_ok=True)
    one, w1 = run(1)
    many, wn = run(40)
    growth = many - one
    print(f"peak RSS: 1 batch {one / 2**20:.1f} MiB, 40 batches {many / 2**20:.1f} MiB, growth "
          f"{growth / 2**20:.1f} MiB; bytes written {w1 / 2**20:.1f} / {wn / 2**20:.1f} MiB")
    if wn < 40 * w1 or wn < 64 << 20:
        print("FAIL: the 40-batch run wrote less than expected")
        return 1
    if growth > wn / 4:
        print(f"FAIL: peak memory grew by {growth} bytes for {wn} bytes written: rows are held in RAM")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
