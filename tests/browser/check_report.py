#!/usr/bin/env python3
"""report.chromium / report.chromium.model: render a qkgeom page in headless Chromium.

--kind study (default, test report.chromium):
1. `qkgeom demo -o WORK/demo --layers 1 --jobs 2 --quiet` writes the demo
   study (docs/study.md#the-demo): index.html, the study pictures
   study_*.svg, the study CSVs, summary.txt and runs/<family>@<step>/.
2. Chromium loads index.html and dumps the DOM (no scripts run, none exist):
   the record table ("This run") has its 4 rows, the runs table
   (<table class="runs">) has one row per run of the demo, 3 families x 4
   checkpoints, none failed; the <img> sources are exactly the study_*.svg
   files in the folder (each shown once, with width, height and alt, non-empty)
   and include every expected kind of picture; every study_*.csv and
   summary.txt is linked; every link resolves to a non-empty file; no
   <script>, no external URL.
--kind model (test report.chromium.model):
1. `qkgeom synth WORK/cap --layers 1 --family steep --quiet`, then
   `qkgeom analyze WORK/cap -o WORK/report --quiet` writes the single-model
   page (report/html.hpp).
2. The DOM: one model row, the record table's 4 rows, the pictures are exactly
   model_comparison.svg and the four per-model pictures, every CSV in the
   folder (head_profile.csv among them) is linked, the same link rules.
Both kinds, 3. Chromium renders a probe page that lays every picture of the DOM
out on a magenta grid (each scaled to fit its cell, aspect kept) and takes a
screenshot; the PNG is decoded here (zlib only) and each picture's box must
be covered (little magenta left: a missing or broken SVG leaves it magenta)
and hold ink in several colours (a blank picture fails).

With --report DIR an existing page is checked instead of running qkgeom.
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
NAME = "report.chromium"
CELL_W, CELL_H, COLS = 360, 220, 4

# The demo study (docs/study.md#the-demo).
FAMILIES = ["steady", "moderate", "steep"]
STEPS = [1000, 2000, 3000, 4000]
BENCHMARK = "demo_score"
RECORD_ROWS = 4  # version, command line, input, options
# The single-model page (report/html.hpp).
PER_MODEL = ["plasticity_profile.svg", "plasticity_heatmap.svg", "component_weights.svg", "taxonomy_scatter.svg",
             "plasticity_split.svg", "rope_bands.svg", "gqa_groups.svg"]


def fail(msg):
    print("%s: FAIL: %s" % (NAME, msg))
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


def run_qkgeom(*args):
    r = subprocess.run([str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    if r.returncode != 0:
        fail("%s exited %d:\n%s" % (" ".join(str(a) for a in args[:2]), r.returncode,
                                    r.stdout.decode(errors="replace")))


class Dom(html.parser.HTMLParser):
    """The DOM as dumped by Chromium: pictures, links, every URL attribute,
    scripts, and the body rows (cell texts) of each table by class."""

    def __init__(self):
        super().__init__()
        self.imgs, self.links, self.urls, self.scripts, self.ids = [], [], [], 0, set()
        self.tables = {}  # class -> list of rows, each a list of cell texts
        self._table = None
        self._tbody = False
        self._cell = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        for k in ("src", "href", "action", "poster", "data"):
            if a.get(k):
                self.urls.append(a[k])
        if tag == "img":
            self.imgs.append(a)
        elif tag == "a" and "href" in a:
            self.links.append(a["href"])
        elif tag == "script":
            self.scripts += 1
        elif tag == "table":
            self._table = a.get("class") or ""
            self.tables.setdefault(self._table, [])
        elif tag == "tbody":
            self._tbody = True
        elif tag == "tr" and self._tbody and self._table is not None:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._tbody and self._table is not None and self.tables[self._table]:
            self._cell = []

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[self._table][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tbody":
            self._tbody = False
        elif tag == "table":
            self._table = None


def decode_png(data):
    """(width, height, bytes per pixel, rows) of an 8-bit RGB/RGBA PNG."""
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


def check_pictures_dom(report, dom, expected):
    """The <img> sources are exactly `expected` (each once), each with width,
    height and alt, each an existing non-empty file. Returns the sources."""
    srcs = [i.get("src", "") for i in dom.imgs]
    twice = sorted({s for s in srcs if srcs.count(s) > 1})
    if set(srcs) != set(expected) or twice:
        fail("pictures on the page but not expected: %s; expected but not on the page: %s; shown twice: %s"
             % (sorted(set(srcs) - set(expected)), sorted(set(expected) - set(srcs)), twice))
    for i in dom.imgs:
        for a in ("width", "height", "alt"):
            if not i.get(a):
                fail("<img src=%s> has no %s" % (i.get("src"), a))
        for a in ("width", "height"):
            if not i[a].isdigit() or int(i[a]) <= 0:
                fail("<img src=%s> has %s=%r" % (i["src"], a, i[a]))
        p = report / i["src"]
        if not p.is_file() or p.stat().st_size == 0:
            fail("picture %s is missing or empty" % p)
    return srcs


def check_links(report, dom, must_link):
    """Every name in must_link is linked; every link resolves to a non-empty
    file of the report (or an element id of the page); no URL is external."""
    if dom.scripts:
        fail("index.html has <script> elements")
    for u in dom.urls:
        if "://" in u or u.startswith("//") or u.lower().startswith(("javascript:", "mailto:")):
            fail("external or active URL %s" % u)
    missing = sorted(set(must_link) - set(dom.links))
    if missing:
        fail("not linked: %s (links: %s)" % (missing, sorted(dom.links)))
    for h in dom.links:
        if h.startswith("#"):
            if h[1:] not in dom.ids:
                fail("link %s points at no element of the page" % h)
            continue
        p = report / h
        if not p.is_file() or p.stat().st_size == 0:
            fail("link %s points at a missing or empty file" % h)


def record_rows(dom, cls):
    rows = dom.tables.get(cls, [])
    if len(rows) != RECORD_ROWS:
        fail("the 'This run' table (class %s) has %d rows, expected %d (version, command line, input, options)"
             % (cls, len(rows), RECORD_ROWS))
    return rows


def check_study(report, dom):
    """The demo study page. Returns the picture sources."""
    record_rows(dom, "record")
    runs = dom.tables.get("runs")
    if runs is None:
        fail("no <table class=\"runs\"> (tables: %s)" % sorted(dom.tables))
    want = {"%s@%d" % (f, s): f for f in FAMILIES for s in STEPS}
    names = [r[0] if r else "" for r in runs]
    if len(runs) != len(want) or set(names) != set(want):
        fail("runs table has %d rows %s, expected %d: %s" % (len(runs), names, len(want), sorted(want)))
    for r in runs:
        # run, family, model, phase, checkpoint, status, n_heads, ...
        if len(r) < 7 or r[1] != want[r[0]] or r[4] != "step " + r[0].split("@")[1]:
            fail("runs table row %s: family/checkpoint do not match the run" % r[:7])
        if r[5].startswith("failed") or not r[6].isdigit() or int(r[6]) <= 0:
            fail("run %s: status %r, n_heads %r" % (r[0], r[5], r[6]))
    written = sorted(p.name for p in report.glob("study_*.svg"))
    srcs = check_pictures_dom(report, dom, written)
    required = ["study_profile_quintile.svg", "study_profile_decile.svg", "study_profile_tokens.svg",
                "study_taxonomy.svg", "study_depth_ap_drop.svg", "study_scatter_ap_drop_%s.svg" % BENCHMARK]
    for f in FAMILIES:
        required += ["study_trajectory_%s.svg" % f, "study_bias_%s.svg" % f, "study_length_%s_%s.svg" % (BENCHMARK, f)]
        if not any(s.startswith("study_heads_%s_" % f) for s in srcs):
            fail("no per-head trajectory picture study_heads_%s_<metric>.svg among %s" % (f, srcs))
    absent = [f for f in required if f not in srcs]
    if absent:
        fail("expected pictures absent: %s" % absent)
    csvs = sorted(p.name for p in report.glob("study_*.csv"))
    if len(csvs) < 6:
        fail("only %d study CSVs in %s: %s" % (len(csvs), report, csvs))
    check_links(report, dom, csvs + ["summary.txt"])
    print("%s: DOM ok: %d runs, %d pictures, %d CSVs, %d links" % (NAME, len(runs), len(srcs), len(csvs),
                                                                  len(dom.links)))
    return srcs


def check_model(report, dom):
    """The single-model page of `qkgeom analyze`. Returns the picture sources."""
    record_rows(dom, "run")
    models = dom.tables.get("models", [])
    if len(models) != 1:
        fail("model table has %d rows, expected 1" % len(models))
    srcs = check_pictures_dom(report, dom, ["model_comparison.svg"] + PER_MODEL)
    csvs = sorted(p.name for p in report.glob("*.csv"))
    if "head_profile.csv" not in csvs or len(csvs) < 7:
        fail("CSVs in %s: %s (expected the seven tables, head_profile.csv among them)" % (report, csvs))
    check_links(report, dom, csvs + ["summary.txt"])
    print("%s: DOM ok: %d model, %d pictures, %d CSVs, %d links" % (NAME, len(models), len(srcs), len(csvs),
                                                                   len(dom.links)))
    return srcs


def check_rendering(exe, work, report, imgs):
    """Lay every picture out on a magenta grid, each scaled to fit its cell
    with its aspect ratio kept, screenshot it and check each picture's box is
    covered and inked. Returns the list of pictures not rendered."""
    rows_n = (len(imgs) + COLS - 1) // COLS
    boxes, body = [], []
    for k, img in enumerate(imgs):
        w, h = int(img["width"]), int(img["height"])
        s = min(CELL_W / w, CELL_H / h)
        bw, bh = int(w * s), int(h * s)
        x, y = (k % COLS) * CELL_W, (k // COLS) * CELL_H
        boxes.append((img["src"], x, y, bw, bh))
        body.append('<img src="%s" alt="%s" width="%d" height="%d" style="position:absolute;left:%dpx;top:%dpx">'
                    % ((report / img["src"]).as_uri(), img["src"], bw, bh, x, y))
    probe = work / "probe.html"
    probe.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'></head>"
                     "<body style='margin:0;background:#ff00ff'>%s</body></html>" % "".join(body), encoding="utf-8")
    shot = work / "probe.png"
    chromium(exe, work / "profile-shot", "--window-size=%d,%d" % (COLS * CELL_W, rows_n * CELL_H),
             "--screenshot=" + str(shot), probe.as_uri())
    if not shot.is_file():
        fail("chromium wrote no screenshot")
    W, H, bpp, pix = decode_png(shot.read_bytes())
    if W < COLS * CELL_W or H < rows_n * CELL_H:
        fail("screenshot is %dx%d, expected at least %dx%d" % (W, H, COLS * CELL_W, rows_n * CELL_H))
    bad = []
    for src, x0, y0, bw, bh in boxes:
        magenta = ink = total = 0
        colours = set()
        for y in range(y0 + 4, y0 + bh - 4, 2):
            row = pix[y]
            for x in range(x0 + 4, x0 + bw - 4, 2):
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
        print("%s: %-44s magenta %.3f ink %.3f colours %3d  %s" % (NAME, src, fm, fi, len(colours), status))
    if bad:
        fail("pictures not rendered: %s (screenshot: %s)" % (bad, shot))


def main():
    global NAME
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=["study", "model"], default="study",
                    help="study: the demo's study page (default); model: the page of qkgeom analyze")
    ap.add_argument("--qkgeom", help="the qkgeom program (writes the page)")
    ap.add_argument("--report", help="check this existing page's folder instead of running qkgeom")
    ap.add_argument("--chromium", help="the Chromium executable (default /usr/bin/chromium)")
    ap.add_argument("--work", help="work directory (default: a temporary one)")
    args = ap.parse_args()
    if args.kind == "model":
        NAME = "report.chromium.model"
    if not args.report and not args.qkgeom:
        ap.error("--qkgeom or --report is required")

    exe = find_chromium(args.chromium)
    if not exe:
        print("%s: SKIP: Chromium not found (/usr/bin/chromium or QKGEOM_CHROMIUM)" % NAME)
        return SKIP

    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="qkgeom_browser_")).resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if args.report:
        report = pathlib.Path(args.report).resolve()
    elif args.kind == "study":
        report = work / "demo"
        run_qkgeom(args.qkgeom, "demo", "-o", report, "--layers", "1", "--jobs", "2", "--quiet")
    else:
        report = work / "report"
        run_qkgeom(args.qkgeom, "synth", work / "cap", "--layers", "1", "--family", "steep", "--quiet")
        run_qkgeom(args.qkgeom, "analyze", work / "cap", "-o", report, "--quiet")
    index = report / "index.html"
    if not index.is_file():
        fail("no %s" % index)

    dom = Dom()
    dom.feed(chromium(exe, work / "profile-dom", "--dump-dom", index.as_uri()))
    (check_study if args.kind == "study" else check_model)(report, dom)
    check_rendering(exe, work, report, dom.imgs)
    print("%s: PASS" % NAME)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
