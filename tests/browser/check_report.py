#!/usr/bin/env python3
"""report.chromium: render the qkgeom demo report in headless Chromium.

1. `qkgeom demo -o WORK/demo --layers 1` writes the CSVs, the SVG pictures and
   index.html (or, with --report DIR, an existing report is checked).
2. Chromium loads index.html and dumps the DOM (no scripts run, none exist):
   the model table has one row per model, every expected picture is an <img>
   with width, height and alt text whose file exists and is not empty, every
   link points at an existing non-empty file, and there is no <script>.
3. Chromium renders a probe page that lays every picture of the DOM out on a
   magenta grid and takes a screenshot; the PNG is decoded here (zlib only)
   and each cell must be covered by the picture (little magenta left: a
   missing or broken SVG leaves its cell magenta) and hold ink in several
   colours (a blank picture fails).

Exit status: 0 pass, 1 fail, 77 skip (no Chromium) -- CTest SKIP_RETURN_CODE.
"""
import argparse
import html.parser
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

SKIP = 77
MODELS = ["steady", "moderate", "steep"]
PER_MODEL = ["plasticity_profile.svg", "plasticity_heatmap.svg", "component_weights.svg", "taxonomy_scatter.svg"]
CELL_W, CELL_H, COLS = 360, 220, 4


def fail(msg):
    print("report.chromium: FAIL: " + msg)
    sys.exit(1)


def find_chromium(given):
    """--chromium, else $QKGEOM_CHROMIUM (each exclusive: a bad path means skip),
    else /usr/bin/chromium, else chromium on PATH."""
    chosen = given or os.environ.get("QKGEOM_CHROMIUM")
    candidates = [chosen] if chosen else ["/usr/bin/chromium", shutil.which("chromium")]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def chromium(exe, profile, *args):
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
           "--hide-scrollbars", "--user-data-dir=" + str(profile), "--virtual-time-budget=5000", *args]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=180)
    if r.returncode != 0:
        fail("chromium exited %d: %s" % (r.returncode, r.stderr.decode(errors="replace")[-2000:]))
    return r.stdout.decode("utf-8", errors="replace")


class Dom(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.imgs, self.links, self.scripts, self.rows, self.svgs = [], [], 0, 0, 0
        self.run_rows = 0  # rows of the "This run" table (command line, input, options)
        self._tbody = False
        self._table = None  # class of the table being read

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a)
        elif tag == "a" and "href" in a:
            self.links.append(a["href"])
        elif tag == "script":
            self.scripts += 1
        elif tag == "svg":
            self.svgs += 1
        elif tag == "table":
            self._table = a.get("class")
        elif tag == "tbody":
            self._tbody = True
        elif tag == "tr" and self._tbody and self._table == "models":
            self.rows += 1
        elif tag == "tr" and self._tbody and self._table == "run":
            self.run_rows += 1

    def handle_endtag(self, tag):
        if tag == "tbody":
            self._tbody = False
        elif tag == "table":
            self._table = None


def decode_png(data):
    """(width, height, rows of (r, g, b) tuples) of an 8-bit RGB/RGBA PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail("screenshot is not a PNG")
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    w, h, depth, ctype, _, _, interlace = ihdr
    if depth != 8 or ctype not in (2, 6) or interlace != 0:
        fail("unsupported PNG format depth=%d colour type=%d interlace=%d" % (depth, ctype, interlace))
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    prev = bytearray(stride)
    rows = []
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + ((a + b) >> 1)) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, bpp, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qkgeom", help="the qkgeom program (runs the demo)")
    ap.add_argument("--report", help="check this existing demo report instead of running the demo")
    ap.add_argument("--chromium", help="the Chromium executable (default /usr/bin/chromium)")
    ap.add_argument("--work", help="work directory (default: a temporary one)")
    args = ap.parse_args()

    exe = find_chromium(args.chromium)
    if not exe:
        print("report.chromium: SKIP: Chromium not found (/usr/bin/chromium or QKGEOM_CHROMIUM)")
        return SKIP

    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="qkgeom_browser_"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if args.report:
        report = pathlib.Path(args.report).resolve()
    else:
        report = work / "demo"
        r = subprocess.run([args.qkgeom, "demo", "-o", str(report), "--layers", "1", "--jobs", "2", "--quiet"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
        if r.returncode != 0:
            fail("qkgeom demo exited %d:\n%s" % (r.returncode, r.stdout.decode(errors="replace")))
    index = report / "index.html"
    if not index.is_file():
        fail("no %s" % index)

    # --- 2. the DOM of index.html -------------------------------------------
    dom_text = chromium(exe, work / "profile-dom", "--dump-dom", index.as_uri())
    dom = Dom()
    dom.feed(dom_text)
    if dom.scripts:
        fail("index.html has <script> elements")
    if dom.rows != len(MODELS):
        fail("model table has %d rows, expected %d" % (dom.rows, len(MODELS)))
    if dom.run_rows != 4:
        fail("the 'This run' table has %d rows, expected 4 (version, command line, input, options)" % dom.run_rows)
    expected = {"model_comparison.svg"} | {m + "/" + f for m in MODELS for f in PER_MODEL}
    srcs = [i.get("src", "") for i in dom.imgs]
    if set(srcs) != expected or len(srcs) != len(expected):
        fail("pictures in the DOM: %s\nexpected: %s" % (sorted(srcs), sorted(expected)))
    for i in dom.imgs:
        for a in ("width", "height", "alt"):
            if not i.get(a):
                fail("<img src=%s> has no %s" % (i.get("src"), a))
        p = report / i["src"]
        if not p.is_file() or p.stat().st_size == 0:
            fail("picture %s is missing or empty" % p)
    csvs = [h for h in dom.links if h.endswith(".csv")]
    if len(csvs) < 6 * len(MODELS):
        fail("expected links to every CSV, got %s" % csvs)
    for h in dom.links:
        if h.startswith("#"):
            continue
        if "://" in h:
            fail("external link %s" % h)
        p = report / h
        if not p.is_file() or p.stat().st_size == 0:
            fail("link %s points at a missing or empty file" % h)
    print("report.chromium: DOM ok: %d models, %d pictures, %d links" % (dom.rows, len(srcs), len(dom.links)))

    # --- 3. every picture renders -------------------------------------------
    rows_n = (len(srcs) + COLS - 1) // COLS
    cells = []
    body = []
    for k, src in enumerate(srcs):
        x, y = (k % COLS) * CELL_W, (k // COLS) * CELL_H
        cells.append((src, x, y))
        body.append('<img src="%s" alt="%s" width="%d" height="%d" style="position:absolute;left:%dpx;top:%dpx">'
                    % ((report / src).as_uri(), src, CELL_W, CELL_H, x, y))
    probe = work / "probe.html"
    probe.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'></head>"
                     "<body style='margin:0;background:#ff00ff'>%s</body></html>" % "".join(body), encoding="utf-8")
    shot = work / "probe.png"
    chromium(exe, work / "profile-shot", "--window-size=%d,%d" % (COLS * CELL_W, rows_n * CELL_H),
             "--screenshot=" + str(shot), probe.as_uri())
    if not shot.is_file():
        fail("chromium wrote no screenshot")
    w, h, bpp, pix = decode_png(shot.read_bytes())
    if w < COLS * CELL_W or h < rows_n * CELL_H:
        fail("screenshot is %dx%d, expected at least %dx%d" % (w, h, COLS * CELL_W, rows_n * CELL_H))
    bad = []
    for src, x0, y0 in cells:
        magenta = ink = total = 0
        colours = set()
        for y in range(y0 + 4, y0 + CELL_H - 4, 2):
            row = pix[y]
            for x in range(x0 + 4, x0 + CELL_W - 4, 2):
                r, g, b = row[x * bpp], row[x * bpp + 1], row[x * bpp + 2]
                total += 1
                if r > 230 and g < 40 and b > 230:
                    magenta += 1
                elif min(r, g, b) < 200:
                    ink += 1
                    colours.add((r >> 5, g >> 5, b >> 5))
        fm, fi = magenta / total, ink / total
        status = "ok"
        if fm > 0.02 or fi < 0.01 or len(colours) < 3:
            status = "NOT RENDERED"
            bad.append(src)
        print("report.chromium: %-40s magenta %.3f ink %.3f colours %3d  %s" % (src, fm, fi, len(colours), status))
    if bad:
        fail("pictures not rendered: %s (screenshot: %s)" % (bad, shot))
    print("report.chromium: PASS")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
