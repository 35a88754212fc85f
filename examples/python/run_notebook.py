"""Runs a notebook top to bottom with Debian's nbclient (the test of the Python example).

    run_notebook.py NOTEBOOK --repo REPO --out OUT

The kernel is the running interpreter (sys.executable: the one the qkgeom module was built
for), with the environment of this process (PYTHONPATH to the built package) plus
QKGEOM_REPO and QKGEOM_EXAMPLE_OUT. A cell that raises fails the run (exit 1, the
cell's traceback printed); the executed notebook is written to OUT/<name>.executed.ipynb.
Exit 77 (skipped) when nbclient, ipykernel, torch, pandas or matplotlib is missing.
"""
import argparse
import importlib.util
import os
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("notebook")
    ap.add_argument("--repo", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    missing = [m for m in ("nbclient", "nbformat", "ipykernel", "torch", "pandas", "matplotlib")
               if importlib.util.find_spec(m) is None]
    if missing:
        print("skipped: missing " + ", ".join(missing))
        return 77
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    import json

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ["QKGEOM_REPO"] = str(Path(a.repo).resolve())
    os.environ["QKGEOM_EXAMPLE_OUT"] = str(out.resolve())
    os.environ.setdefault("MPLBACKEND", "Agg")

    # The kernel: this interpreter (the one the module was built for), found through a kernel
    # spec of our own on JUPYTER_PATH, whatever python3 is first on PATH.
    spec = out / "jupyter" / "kernels" / "qkgeom-test"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "qkgeom test kernel", "language": "python"}))
    os.environ["JUPYTER_PATH"] = str((out / "jupyter").resolve())

    nb = nbformat.read(a.notebook, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="qkgeom-test",
                            resources={"metadata": {"path": str(out)}})
    try:
        client.execute()
    except CellExecutionError as e:
        print(e)
        return 1
    finally:
        nbformat.write(nb, out / (Path(a.notebook).stem + ".executed.ipynb"))
    for cell in nb.cells:
        if cell.cell_type == "code":
            for o in cell.get("outputs", []):
                if o.get("output_type") == "stream":
                    sys.stdout.write(o.get("text", ""))
    print("notebook ran: " + a.notebook)
    return 0


if __name__ == "__main__":
    sys.exit(main())
