"""The report opened from disk in a real browser (headless Chromium).

The test's own script is appended to a copy of the page; Chromium loads it from a file:// URL,
runs the page's and the test's scripts and dumps the DOM, from which the test reads what the
browser saw: every image decoded and drawn on a canvas, its pixels read back (size, mean and
spread of the red channel: each thumbnail a picture, the same the PNG in the model holds, not
a flat or one-pixel-high strip), no resource fetched and no
Content-Security-Policy violation (nothing requested from any host), the galleries' items, and
the results table's order after clicks on a column title.

Skipped, saying why, where no Chromium is installed (``.ci/run`` installs the Debian package
``chromium`` where apt-get works as root).
"""

import json
import re
import shutil
import subprocess

import numpy as np
import pytest
import torch
from _pictures import MIN_SIDE, MIN_STD, decode

from bayesurl.evaluation.table import Column, Metric, Need, register_metric, unregister_metric
from bayesurl.report import write_report
from bayesurl.sweeps.report import report_columns, write_results

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
BROWSER = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
pytestmark = pytest.mark.skipif(
    BROWSER is None,
    reason="no headless Chromium on this machine (apt-get install chromium; .ci/run does it "
    "where apt works)",
)

PROBE = r"""
<script>
window.__violations = [];
document.addEventListener("securitypolicyviolation", e => window.__violations.push(e.blockedURI));
window.addEventListener("load", () => setTimeout(() => {
  const col = (i) => Array.from(document.querySelectorAll("#results tbody tr"))
    .map(tr => tr.children[i].getAttribute("data-v"));
  const th = document.querySelectorAll("#results th")[1];
  const before = col(0);
  th.click(); const asc = [col(0), col(1)];
  th.click(); const desc = [col(0), col(1)];
  const galleries = {};
  document.querySelectorAll("section[data-estimator]").forEach(s => {
    const g = {};
    s.querySelectorAll("[data-gallery]").forEach(d => {
      g[d.dataset.gallery] = Array.from(d.children).map(c => c.dataset.query || c.dataset.ood);
    });
    galleries[s.dataset.estimator] = g;
  });
  const imgs = Array.from(document.images);
  const pixels = imgs.filter(i => i.complete && i.naturalWidth > 0).map(i => {
    const c = document.createElement("canvas");
    c.width = i.naturalWidth; c.height = i.naturalHeight;
    const x = c.getContext("2d");
    x.drawImage(i, 0, 0);
    const d = x.getImageData(0, 0, c.width, c.height).data;
    let s = 0, s2 = 0;
    for (let k = 0; k < d.length; k += 4) { s += d[k]; s2 += d[k] * d[k]; }
    const n = d.length / 4, mean = s / n, std = Math.sqrt(Math.max(s2 / n - mean * mean, 0));
    return {alt: i.alt, w: c.width, h: c.height, mean: mean, std: std};
  });
  const out = {
    pixels,
    images: imgs.length,
    broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt),
    schemes: [...new Set(imgs.map(i => i.src.split(":")[0]))],
    resources: performance.getEntriesByType("resource").map(e => e.name),
    violations: window.__violations,
    before, asc, desc, galleries,
    compare: document.querySelectorAll("#cmp-grid [data-compare]").length,
    extra: window.__extra || null,
  };
  const pre = document.createElement("pre");
  pre.id = "browser-test";
  pre.textContent = JSON.stringify(out);
  document.body.append(pre);
}, 300));
</script>
"""


def _open(html_path, tmp_path, extra=""):
    """Load ``html_path`` plus the probe in headless Chromium; the probe's findings."""
    page = tmp_path / "probed.html"
    page.write_text(html_path.read_text().replace("</body>", extra + PROBE + "</body>"))
    cmd = [
        BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--virtual-time-budget=5000",
        f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri(),
    ]  # fmt: skip
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
    m = re.search(r'<pre id="browser-test">(.*?)</pre>', dom, re.S)
    assert m, f"the probe did not run; the browser printed: {dom[-500:]}"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def _model(html):
    m = re.search(r'<script type="application/json" id="model">(.*?)</script>', html, re.S)
    return json.loads(m.group(1))


def _assert_shows_pictures(seen, model):
    """What the browser drew of each thumbnail is a picture, the PNG the model holds."""
    shown = [p for p in seen["pixels"] if re.fullmatch(r"[qo]\d+", p["alt"])]
    assert shown and {p["alt"] for p in shown} <= set(model["thumbs"])
    for p in shown:
        a = decode(model["thumbs"][p["alt"]])
        red = (a if a.ndim == 2 else a[..., 0]).astype(np.float64)
        assert (p["h"], p["w"]) == a.shape[:2] and min(a.shape[:2]) >= MIN_SIDE, p
        assert p["std"] > MIN_STD, p
        assert p["mean"] == pytest.approx(red.mean(), abs=0.5), p
        assert p["std"] == pytest.approx(red.std(), abs=0.5), p


def test_report_in_browser(bench_dir, tmp_path):
    path = write_report(bench_dir, k=6)["path"]
    seen = _open(path, tmp_path)
    model = _model(path.read_text())
    assert seen["images"] > 2 * 6 * 2 and seen["broken"] == []
    _assert_shows_pictures(seen, model)
    assert seen["schemes"] == ["data"]
    assert seen["resources"] == [] and seen["violations"] == []
    for est in model["estimators"]:
        g = seen["galleries"][est["name"]]
        assert g["most"] == [str(q) for q in est["most"]]
        assert g["least"] == [str(q) for q in est["least"]]
        assert g["ood-top"] == [str(i) for i, *_ in est["ood"]["top"]]
    assert seen["compare"] > 0
    # the R@1 column sorted up, then down, by the numbers of the table (n/a last)
    r1 = {row[0]: row[1][0] for row in model["rows"]}
    up = sorted(r1, key=lambda n: (r1[n] is None, r1[n] or 0))
    assert seen["asc"][0] == up and [float(v) for v in seen["asc"][1]] == [r1[n] for n in up]
    down = sorted(r1, key=lambda n: (r1[n] is None, -(r1[n] or 0)))
    assert seen["desc"][0] == down


def test_probe_sees_a_request_and_a_broken_image(bench_dir, tmp_path):
    """The checks can fail: an image from a host is refused and counted."""
    path = write_report(bench_dir, k=2)["path"]
    seen = _open(path, tmp_path, '<img alt="remote" src="http://127.0.0.1:9/x.png">')
    assert "remote" in seen["broken"]
    assert seen["violations"] or seen["resources"]


def test_folder_report_in_browser(tmp_path):
    """A folder of one's own images: its files become the thumbnails."""
    import warnings

    from PIL import Image

    from bayesurl.folder import score_folder

    g = torch.Generator().manual_seed(0)
    for i in range(10):
        px = (255 * torch.rand(20, 24, 3, generator=g)).to(torch.uint8).numpy()
        Image.fromarray(px).save(tmp_path / f"img{i}.png")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        score_folder(tmp_path, out=tmp_path / "out", backbone="small_convnet", epochs=1,
                     batch_size=4, progress=False)  # fmt: skip
    path = write_report(tmp_path / "out", k=4)["path"]
    seen = _open(path, tmp_path)
    model = _model(path.read_text())
    assert seen["broken"] == [] and seen["resources"] == [] and seen["violations"] == []
    _assert_shows_pictures(seen, model)
    (est,) = model["estimators"]
    assert seen["galleries"]["tau"]["most"] == [str(q) for q in est["most"]]
    assert "broken.png" in " ".join(model["settings"])  # the skipped file is named on the page


def test_pretrained_report_in_browser(pretrained_dir, tmp_path):
    """Frozen features: the browser draws the input images, not the feature vectors (on the
    page of ``bayesurl report DIR``: the benchmark's own page leaves them to it)."""
    path = write_report(pretrained_dir, out=tmp_path / "again.html")["path"]
    seen = _open(path, tmp_path)
    assert seen["broken"] == [] and seen["resources"] == [] and seen["violations"] == []
    _assert_shows_pictures(seen, _model(path.read_text()))


# the results table as the browser drew it, read before the probe's clicks reorder it
TABLE = r"""
<script>
window.addEventListener("load", () => {
  const rows = Array.from(document.querySelectorAll("#results tbody tr"));
  window.__extra = {
    head: Array.from(document.querySelectorAll("#results th")).map(th => th.textContent),
    cells: Object.fromEntries(rows.map(tr => [tr.children[0].textContent,
      Array.from(tr.children).slice(1).map(td => [td.childNodes[0].textContent,
        (td.querySelector(".spread") || {}).textContent || null, td.classList.contains("best")])])),
  };
});
</script>
"""


@pytest.fixture
def five_digits():
    """A throwaway lower-is-better metric ``odd5`` shown with 5 digits, removed afterwards."""
    col = Column("odd5", "ODD5", digits=5, higher_is_better=False, always=True)
    register_metric(
        Metric("odd5", lambda o: ("odd5",), (Need.NEIGHBOURS,), lambda c: {}, columns=(col,))
    )
    yield col
    unregister_metric("odd5")


def test_the_page_shows_each_metric_as_its_column_declares(five_digits, tmp_path):
    """Titles, digits and direction come from the metric table: the page's numbers are the
    text table's (Python's rounding, an exact tie such as 0.0625 included), the arrow says
    the direction, and the best of a column is bold where a paired test separates it."""
    recs = []
    for name, r1, odd in (("ce", 0.0625, 0.123456), ("elk", 0.5, 0.015625), ("vmf", 0.25, 2.5)):
        for seed in range(2):
            recs.append({"method": name, "estimator": name, "seed": seed, "error": None,
                         "r@1": r1, "r_auroc": r1 + 0.001 * seed, "odd5": odd,
                         "train_time": 10.25})  # fmt: skip
    write_results(recs, tmp_path / "bench", {"preset": "t", "dataset": "d", "seeds": [0, 1]})
    path = write_report(tmp_path / "bench")["path"]
    seen = _open(path, tmp_path, TABLE)["extra"]
    model = _model(path.read_text())
    cols = {c.key: c for c in report_columns(shown=True)}
    assert seen["head"][0] == "estimator"
    shown = model["columns"]
    assert "odd5" in shown
    for title, key in zip(seen["head"][1:], shown):
        c = cols[key]
        assert title == c.title + (" \u2191" if c.higher_is_better else " \u2193")
    for row in model["rows"]:
        for (mean, low, high, how), key, (text, spread_text, bold) in zip(
            row[1:], shown, seen["cells"][row[0]]
        ):
            c = cols[key]
            assert text == c.format(mean)  # the text table's digits, e.g. 0.0625 -> 0.062
            if low is not None:  # the interval beside it, in the column's digits
                assert spread_text == f"[{c.format(low)}, {c.format(high)}]"
                assert how.startswith("95 % Student-t interval over 2 runs")
            # bold: the column's best, where the paired test separates it (model["marks"])
            assert bold == (model["marks"].get(key) == row[0])
            if bold:
                assert mean == c.best(r[1 + shown.index(key)][0] for r in model["rows"])
    odd = [seen["cells"][n][shown.index("odd5")][0] for n in ("ce", "elk", "vmf")]
    assert odd == ["0.12346", "0.01562", "2.50000"]  # 5 digits, 1/64 tied to even as Python
    assert seen["cells"]["ce"][shown.index("r@1")][0] == "0.062"
    assert [seen["cells"][n][shown.index("odd5")][2] for n in ("ce", "elk", "vmf")] == [
        False,
        True,
        False,
    ]  # lower is better: elk's is the best
