"""python3 -m qkgeom.hf --shards: hf.capture_loaded split into S shards across processes
(CTest python.capture.hf_sharded; argv[1] = scratch folder).

transformers is not installed here: the model and tokenizer are hf_glue.py's stand-ins (a modeling
module with apply_rotary_pos_emb, a NoPE layer, right padding). Two gloo processes (RANK / WORLD_SIZE /
MASTER_ADDR / MASTER_PORT as torchrun sets them; hf.init_distributed initialises the group) capture
S = 3 shards of 5 prompts with --merge-to; the same in one process; and the plain unsharded capture.
With batch size 1 the joined dataset must equal the unsharded one byte for byte (every file): the
shards are contiguous blocks joined in order, and the example ids are the global ones. Exit 77 without
torch or NumPy.
"""

import os
import shutil
import socket
import subprocess
import sys
import types

try:
    import numpy as np  # noqa: F401
    import torch
except ImportError as e:  # pragma: no cover
    print(f"skipped: {e}")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _checks import check, files_of, finish, raises  # noqa: E402  (tests/python/capture/_checks.py)
import hf_glue  # noqa: E402  (the stand-in model and tokenizer)
from qkgeom import distributed as qd  # noqa: E402
from qkgeom import hf  # noqa: E402

PROMPTS = ["the first example", "second", "a third, longer example that is cut at the context",
           "four", "the fifth and last example of the file"]


def args(out, prompts, *extra):
    return hf._args(["fake", "-o", out, "--prompts", prompts, "--context", "16", "--batch-size", "1",
                     "--heads", "3", "--scheme", "all", "--width", "4", *extra])


def model():
    torch.manual_seed(1)
    torch.set_num_threads(1)
    return hf_glue.modeling().FakeForCausalLM(hf_glue.CFG)


def worker(work):
    device = hf.init_distributed(None)
    m = model()
    a = args(os.path.join(work, "w2"), os.path.join(work, "prompts.txt"), "--shards", "3", "--merge-to",
             os.path.join(work, "w2_merged"), "--timeout", "120")
    try:
        hf.capture_loaded(m, hf_glue.FakeTokenizer(), m.config, a, "fake@rev", device)
    except qd.ShardedCaptureError as e:
        print(f"ShardedCaptureError: {e}")
        sys.exit(3)
    sys.exit(0)


def main():
    work = sys.argv[1] if len(sys.argv) > 1 else "/tmp/qkgeom-hf-sharded"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    prompts = os.path.join(work, "prompts.txt")
    with open(prompts, "w") as f:
        f.write("\n".join(PROMPTS) + "\n")

    a = args("x", prompts, "--shards", "3")
    check(a.shards == 3 and a.merge_to is None and a.timeout == 1800.0, f"--shards parsed: {a}")
    try:
        hf._args(["m", "-o", "x", "--prompts", prompts, "--legacy", "--shards", "2"],
                 prog="python3 -m qkgeom.transformerlens")
        check(False, "qkgeom.transformerlens must not accept --shards (it does not shard)")
    except SystemExit:
        pass

    # python3 -m qkgeom.hf under torchrun without --shards is refused (a stand-in transformers: the check
    # comes after the config is read, before the tokenizer and weights)
    sys.modules["transformers"] = types.SimpleNamespace(
        AutoConfig=types.SimpleNamespace(from_pretrained=lambda name, revision=None: hf_glue.CFG))
    os.environ["WORLD_SIZE"] = "2"
    try:
        raises(lambda: hf.main(["fake", "-o", os.path.join(work, "never"), "--prompts", prompts]),
               "no --shards", "torchrun without --shards refused", errors=(hf.CaptureConfigError,))
    finally:
        del os.environ["WORLD_SIZE"]
        del sys.modules["transformers"]
    check(not os.path.exists(os.path.join(work, "never")), "nothing written at -o")

    # unsharded, one process
    m = model()
    plain = os.path.join(work, "plain")
    hf.capture_loaded(m, hf_glue.FakeTokenizer(), m.config, args(plain, prompts), "fake@rev", "cpu")
    # sharded, one process
    m = model()
    w1 = os.path.join(work, "w1")
    hf.capture_loaded(m, hf_glue.FakeTokenizer(), m.config,
                      args(w1, prompts, "--shards", "3", "--merge-to", os.path.join(work, "w1_merged")),
                      "fake@rev", "cpu")
    # sharded, two processes
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", work], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    codes = []
    for r, p in enumerate(procs):
        try:
            o, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            o, _ = p.communicate()
        codes.append(p.returncode)
        print(f"--- rank {r}: exit {p.returncode}\n{o.strip()[-1500:]}")
    check(codes == [0, 0], f"2-process capture_loaded --shards 3: exit statuses {codes}")
    if codes != [0, 0]:
        return finish()

    run = qd.read_sharded(os.path.join(work, "w2"))
    check([s["rank"] for s in run["shards"]] == [0, 1, 0] and run["n_examples"] == len(PROMPTS),
          f"shards by ranks {[s['rank'] for s in run['shards']]}, {run['n_examples']} examples")
    fp, f1, f2 = (files_of(os.path.join(work, d)) for d in ("plain", "w1_merged", "w2_merged"))
    check(len(fp) > 8 and f1 == fp, f"one process, 3 shards, joined == unsharded capture ({len(fp)} files)")
    check(f2 == fp, "two processes, 3 shards, joined == unsharded capture (every file byte for byte)")
    diff = sorted(set(fp) ^ set(f2)) + sorted(k for k in fp if k in f2 and fp[k] != f2[k])
    if diff:
        print("differing files:", diff[:10])
    return finish()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    sys.exit(main())
