"""``wia-hw report``: the HTML page of a run report, a profiling report and a sweep store.

Pages are made from a real run and a real profile (BERT-base, 2 layers) and from a
sweep store written here with the store's schema (seeded random metrics, so the best
point and the Pareto front are checked against a brute-force derivation). Spec and op
names are user input: one kernel and the workload get names full of HTML, which must
come back as the same text, never as markup.

The browser tests open each page in headless Chromium (the system ``chromium`` and
``chromedriver``; Selenium never downloads anything here) and check from the DOM that
the key figures equal the JSON's, that a header click sorts, that a 390 px wide window
has no horizontal overflow, that the plots decode, and, from Chrome's performance
log, that the page requested nothing but itself and ``data:`` URIs. They are skipped
only when Chromium or its driver is not installed (``scripts/setup --test`` installs
them).
"""

from __future__ import annotations

import json
import random
import re
import shutil
import sqlite3
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from wia_hw.cli import cli
from wia_hw.profiling import ProfilingConfig, save_profile_report, start_profiling, stop_profiling
from wia_hw.report import (
    ReportError,
    load_source,
    render_report,
    run_report_html,
    write_report,
)
from wia_hw.runtime import open_device

EVIL = '<img src=x onerror="window.__pwned=1">&amp;"\'</td>'
WORKLOAD = dict(batch=1, seq=32, layers=2)


# -- inputs -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("report")
    r = open_device("wia-npu").run("bert-base", **WORKLOAD)
    run = r.to_dict()
    run["kernels"][3]["name"] = EVIL  # user input reaches the page as text
    run["workload"] = "bert<b>" + EVIL
    (d / "run.json").write_text(json.dumps(run))

    ctx = open_device("wia-npu")
    session = start_profiling(ctx, ProfilingConfig(mode="detailed"))
    ctx.run("bert-base", **WORKLOAD)
    live = stop_profiling(session)
    save_profile_report(live, d / "profile.json", "json")
    prof = json.loads((d / "profile.json").read_text())

    store, rows = _make_store(d / "sweep.sqlite")
    return {
        "dir": d,
        "run": run,
        "profile": prof,
        "live": live,
        "rows": rows,
        "run_path": d / "run.json",
        "profile_path": d / "profile.json",
        "store_path": store,
    }


def _make_store(path: Path) -> tuple[Path, list[dict[str, Any]]]:
    """A store with the sweep store's schema: 2 workloads x 15 points (seeded random
    latency/energy/throughput over two parameters), 3 failed points."""
    rng = random.Random(14)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT)")
    conn.execute(
        "CREATE TABLE points(point_key TEXT PRIMARY KEY, sweep_name TEXT, params TEXT, "
        "workload TEXT, metrics TEXT, status TEXT, error TEXT, wall_s REAL, finished_at TEXT)"
    )
    conn.executemany(
        "INSERT INTO meta VALUES (?, ?)",
        [
            ("format", "wia-hw-sweep/1"),
            ("wia_hw_version", "0.test"),
            ("created_at", "2026-01-01T00:00:00+00:00"),
            ("sweep:demo", json.dumps({"parameters": ["compute.array.rows"], "note": EVIL})),
        ],
    )
    rows = []
    n = 0
    for wl in ("bert-base(batch=1, seq=32)", "gpt2(batch=1, seq=64)"):
        for _ in range(15):
            rows_ = rng.choice([32, 64, 128])
            bw = rng.choice([600, 900, 1200])
            metrics = {
                "latency_ms": round(rng.uniform(0.2, 3.0), 6),
                "energy_j": round(rng.uniform(0.01, 0.2), 6),
                "throughput": round(rng.uniform(100, 5000), 3),
            }
            rows.append(
                {
                    "point_key": f"k{n:03d}",
                    "workload": wl,
                    "params": {"compute.array.rows": rows_, "memory.hbm.bandwidth_gbs": bw},
                    "metrics": metrics,
                    "status": "ok",
                    "error": None,
                }
            )
            n += 1
    for i, err in enumerate(
        [
            "compute.array.rows: must be a positive integer, got -4",
            "memory.hbm.bandwidth_gbs: " + EVIL,
            "point timed out",
        ]
    ):
        rows.append(
            {
                "point_key": f"f{i}",
                "workload": "bert-base(batch=1, seq=32)",
                "params": {"compute.array.rows": -4 - i, "memory.hbm.bandwidth_gbs": 600},
                "metrics": None,
                "status": "failed",
                "error": err,
            }
        )
    for i, r in enumerate(rows):
        conn.execute(
            "INSERT INTO points VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                r["point_key"],
                "demo",
                json.dumps(r["params"]),
                r["workload"],
                None if r["metrics"] is None else json.dumps(r["metrics"]),
                r["status"],
                r["error"],
                0.5 + i / 100,
                f"2026-01-01T00:00:{i:02d}+00:00",
            ),
        )
    conn.commit()
    conn.close()
    return path, rows


@pytest.fixture(scope="module")
def pages(files: dict[str, Any]) -> dict[str, Path]:
    """Each page written once (plots take a second or two each)."""
    d = files["dir"]
    return {
        k: write_report(files[f"{k}_path"], d / f"{k}.html") for k in ("run", "profile", "store")
    }


def _brute_front(rows: list[dict[str, Any]], wl: str) -> set[str]:
    ok = [r for r in rows if r["status"] == "ok" and r["workload"] == wl]

    def dominates(a: dict[str, Any], b: dict[str, Any]) -> bool:
        va = (a["metrics"]["latency_ms"], a["metrics"]["energy_j"])
        vb = (b["metrics"]["latency_ms"], b["metrics"]["energy_j"])
        return all(x <= y for x, y in zip(va, vb, strict=True)) and va != vb

    return {r["point_key"] for r in ok if not any(dominates(o, r) for o in ok)}


class _Cells(HTMLParser):
    """Text of every element with an id, and the attributes of every element."""

    def __init__(self) -> None:
        super().__init__()
        self.attrs: dict[str, dict[str, str | None]] = {}
        self.refs: list[str] = []
        self.scripts: list[str] = []
        self.handlers: list[tuple[str, str]] = []
        self.imgs = 0
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.handlers += [(tag, k) for k in a if k.lower().startswith("on")]
        self.imgs += tag == "img"
        if a.get("id"):
            self.attrs[str(a["id"])] = a
        for k in ("src", "href", "action", "data", "poster"):
            if a.get(k) is not None:
                self.refs.append(str(a[k]))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts.append(data)


def _parse(text: str) -> _Cells:
    p = _Cells()
    p.feed(text)
    return p


# -- without a browser ---------------------------------------------------------------------
def test_kinds_are_detected_from_content(files: dict[str, Any], tmp_path: Path) -> None:
    assert load_source(files["run_path"])[0] == "run"
    assert load_source(files["profile_path"])[0] == "profile"
    kind, data = load_source(files["store_path"])
    assert kind == "sweep" and len(data.points) == len(files["rows"])
    # the name does not matter: a store called .json is still a store
    renamed = tmp_path / "store.json"
    shutil.copy(files["store_path"], renamed)
    assert load_source(renamed)[0] == "sweep"


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"hello, world\n", r"not a run or profile report JSON .* neither JSON nor SQLite"),
        (b'{"schema": "wia-hw.bench/1"}', r"JSON with schema 'wia-hw.bench/1'"),
        (b"[1, 2, 3]", r"the JSON is a list, not an object"),
        (b"\xff\xfe\x00binary", r"neither JSON nor SQLite"),
    ],
)
def test_bad_input_is_one_clear_error(tmp_path: Path, content: bytes, match: str) -> None:
    p = tmp_path / "input.json"
    p.write_bytes(content)
    with pytest.raises(ReportError, match=match):
        load_source(p)
    res = CliRunner().invoke(cli, ["report", str(p), "-o", str(tmp_path / "out.html")])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("wia-hw: error: ") and str(p) in lines[0]
    assert not (tmp_path / "out.html").exists()


def test_sqlite_that_is_not_a_store(tmp_path: Path) -> None:
    other = tmp_path / "other.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t(x)")
    conn.commit()
    conn.close()
    res = CliRunner().invoke(cli, ["report", str(other), "-o", str(tmp_path / "o.html")])
    assert res.exit_code == 2 and "not a sweep store" in res.output
    assert len(res.output.strip().splitlines()) == 1
    wrong = tmp_path / "wrong.sqlite"
    conn = sqlite3.connect(wrong)
    conn.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT)")
    conn.execute(
        "CREATE TABLE points(point_key TEXT PRIMARY KEY, sweep_name TEXT, params TEXT, "
        "workload TEXT, metrics TEXT, status TEXT, error TEXT, wall_s REAL, finished_at TEXT)"
    )
    conn.execute("INSERT INTO meta VALUES ('format', 'other/9')")
    conn.commit()
    conn.close()
    with pytest.raises(ReportError, match=r"not a sweep store \(format 'other/9'"):
        load_source(wrong)


def test_missing_file_directory_and_unwritable_output(
    files: dict[str, Any], tmp_path: Path
) -> None:
    with pytest.raises(ReportError, match=r"nope.json: no such file"):
        load_source(tmp_path / "nope.json")
    with pytest.raises(ReportError, match=r"is a directory"):
        load_source(tmp_path)
    with pytest.raises(ReportError, match=r"cannot write .*out.html: no folder .*such"):
        write_report(files["store_path"], tmp_path / "no" / "such" / "out.html")
    with pytest.raises(ReportError, match=r"cannot write .*: Is a directory"):
        write_report(files["store_path"], tmp_path)
    with pytest.raises(ReportError, match=r"not a run or profile report \(schema 'x/1'"):
        run_report_html({"schema": "x/1"})
    with pytest.raises(ReportError, match=r"a run page needs a report or its JSON dict, got int"):
        run_report_html(3)


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        (
            {"schema": "wia-hw.run/1", "kernels": "x"},
            r"'kernels' must be a list of objects, got str",
        ),
        ({"schema": "wia-hw.run/1", "params": [1]}, r"'params' must be an object, got list"),
        (
            {"schema": "wia-hw.run/1", "kernels": [{"name": "k", "counters": 3}]},
            r"kernels\[0\]\.counters must be an object",
        ),
        ({"schema": "wia-hw.profile/1"}, r"profile report is incomplete or malformed \(KeyError"),
        ({"schema": "wia-hw.profile/1", "device": 7}, r"'device' must be an object, got int"),
    ],
)
def test_malformed_report_is_one_clear_error(
    tmp_path: Path, doc: dict[str, Any], match: str
) -> None:
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ReportError, match=match):
        run_report_html(doc)
    with pytest.raises(ReportError, match=re.escape(str(p)) + ": " + match):
        render_report(p)
    res = CliRunner().invoke(cli, ["report", str(p), "-o", str(tmp_path / "o.html")])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1


def test_unreadable_inputs(files: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(ReportError, match=r"cannot read a{300,}: File name too long"):
        load_source("a" * 5000)
    store = tmp_path / "damaged.sqlite"
    shutil.copy(files["store_path"], store)
    conn = sqlite3.connect(store)
    conn.execute("UPDATE points SET params = 'not json' WHERE point_key = 'k001'")
    conn.commit()
    conn.close()
    with pytest.raises(ReportError, match=r"damaged.sqlite: cannot read the sweep store \("):
        load_source(store)
    res = CliRunner().invoke(cli, ["report", str(files["run_path"]), "-o", str(files["run_path"])])
    assert res.exit_code == 2 and "the page would overwrite its source" in res.output


def test_run_page_roofline_uses_the_spec_as_used(files: dict[str, Any]) -> None:
    prov = files["run"]["provenance"]
    run = dict(files["run"], device="no-such-npu", provenance=dict(prov, spec="no-such-npu"))
    text = run_report_html(run)
    assert "No roofline: the device spec no-such-npu cannot be loaded here" in text
    assert 'id="roofline-plot"' not in text and 'id="kernel-table"' in text
    # the spec must be the one the run used: its recorded sha256
    run = dict(files["run"], provenance=dict(prov, spec_sha256="0123456789ab" + "0" * 52))
    text = run_report_html(run)
    assert re.search(
        r"No roofline: the spec wia-npu loaded here \(sha256 [0-9a-f]{12}\) is not the one "
        r"the run used \(sha256 0123456789ab\)",
        text,
    )
    # with --set overrides the ceilings are those of the spec as used
    ctx = open_device("wia-npu", overrides={"memory.hbm.bandwidth_gbs": 900})
    r = ctx.run("bert-base", **WORKLOAD).to_dict()
    a = _parse(run_report_html(r)).attrs
    assert float(a["fig-peak_bandwidth_gbs"]["data-value"]) == 900
    assert "roofline-plot" in a
    from wia_hw.report._run import _run_spec

    assert _run_spec(r)[0].peak_bandwidth_gbs == 900


def test_roofline_of_a_loaded_report_has_the_specs_ceilings(files: dict[str, Any]) -> None:
    """A report read from JSON has no spec: its ceilings come from the stored DeviceInfo
    and must be the ones RooflineConfig.from_spec gives for the device."""
    from wia_hw.profiling import RooflineConfig, load_profile_report
    from wia_hw.report._run import _roofline_config
    from wia_hw.spec import load_spec

    loaded = load_profile_report(files["profile_path"])
    assert _roofline_config(loaded.device) == RooflineConfig.from_spec(load_spec("wia-npu"))


def test_cli_writes_the_page(files: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    res = CliRunner().invoke(cli, ["report", str(files["run_path"]), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert res.output.startswith(f"wrote {out} (run report")
    assert out.read_text().startswith("<!DOCTYPE html>")
    # default output: the source with .html
    src = tmp_path / "store.sqlite"
    shutil.copy(files["store_path"], src)
    res = CliRunner().invoke(cli, ["report", str(src)])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "store.html").is_file()


@pytest.mark.parametrize("which", ["run", "profile", "store"])
def test_page_is_self_contained_and_escaped(pages: dict[str, Path], which: str) -> None:
    text = pages[which].read_text()
    p = _parse(text)
    # nothing to fetch: every reference is a data: URI, and the CSP forbids the rest
    assert p.refs and all(r.startswith("data:") for r in p.refs), [
        r[:40] for r in p.refs if not r.startswith("data:")
    ]
    assert "default-src 'none'" in text and "img-src data:" in text
    assert not re.search(r"(?i)<link\b|@import|url\(\s*['\"]?(?!data:)", text)
    assert not any(re.search(r"https?://", s) for s in p.scripts)
    # the hostile names are text, never markup: no event handler attribute anywhere,
    # and the only images are the plots
    assert p.handlers == [] and "<img src=x" not in text
    assert p.imgs == len(p.refs)
    if which != "profile":
        assert "&lt;img src=x onerror=&quot;window.__pwned=1&quot;&gt;&amp;amp;" in text


def test_same_input_same_bytes(files: dict[str, Any], pages: dict[str, Path]) -> None:
    """No dates, fixed SVG ids: a page can be diffed and cached."""
    assert render_report(files["store_path"])[1] == pages["store"].read_text()


def test_run_page_figures_without_a_browser(files: dict[str, Any], pages: dict[str, Path]) -> None:
    a = _parse(pages["run"].read_text()).attrs
    run = files["run"]
    for key in ("latency_ms", "throughput", "energy_j", "cycles", "roofline_floor_ms"):
        assert float(a[f"fig-{key}"]["data-value"]) == run[key], key
    assert int(a["fig-kernels"]["data-value"]) == len(run["kernels"])
    assert "roofline-plot" in a
    # provenance: the spec as used, by its hash
    text = pages["run"].read_text()
    assert "provenance" in a and f"sha256 {run['provenance']['spec_sha256'][:12]}" in text


def test_recommendations_live_are_measured_loaded_are_modelled(
    files: dict[str, Any], pages: dict[str, Path], tmp_path: Path
) -> None:
    live = write_report(files["live"], tmp_path / "live.html").read_text()
    loaded = pages["profile"].read_text()
    assert live.count('class="rec"') >= 1 and loaded.count('class="rec"') >= 1
    assert "(measured: re-ran the session" in live
    assert "(measured" not in loaded and "(modelled:" in loaded
    # recommendations stored in the JSON are shown as stored
    d = dict(files["profile"])
    d["recommendations"] = {
        "recommendations": [
            {
                "priority": "HIGH",
                "title": "Fuse " + EVIL,
                "description": "d",
                "impact": "i",
                "suggestion": "s",
                "estimated_improvement": 0.25,
                "confidence": 0.9,
                "confidence_basis": "measured: 1.000 ms -> 0.750 ms",
                "baseline_ms": 1.0,
                "modified_ms": 0.75,
            }
        ]
    }
    text = run_report_html(d)
    assert text.count('class="rec"') == 1 and 'data-improvement="0.25"' in text
    assert "25.0 % of the profiled time (measured): 1.000 ms -&gt; 0.7500 ms" in text
    assert "Recommendations stored in the report." in text
    with pytest.raises(ReportError, match=r"recommendations must be .* got int"):
        run_report_html(files["run"], recommendations=5)


# -- in a browser ----------------------------------------------------------------------------
def _chromium() -> tuple[str, str] | None:
    browser = next(
        (b for b in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if b),
        None,
    )
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.fixture(scope="module")
def browser() -> Any:
    found = _chromium()
    if found is None:
        pytest.skip("Chromium and chromedriver are not installed (scripts/setup --test)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = found[0]
    for a in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        "--window-size=1200,900",
    ):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    drv = webdriver.Chrome(service=Service(executable_path=found[1]), options=opts)
    yield drv
    drv.quit()


def _open(drv: Any, page: Path, width: int = 1200) -> list[str]:
    """Load ``page``; returns the URLs it requested (from the performance log)."""
    drv.get_log("performance")  # drop what came before
    drv.set_window_size(width, 900)
    drv.get(page.resolve().as_uri())
    urls = []
    for entry in drv.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg["method"] == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    return urls


def _check_common(drv: Any, page: Path, tmp_path: Path) -> None:
    urls = _open(drv, page)
    assert page.resolve().as_uri() in urls  # the log saw the page itself
    assert all(u == page.resolve().as_uri() or u.startswith("data:") for u in urls), urls
    shot = tmp_path / (page.stem + ".png")
    assert drv.save_screenshot(str(shot))
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    # every plot decoded
    imgs = drv.execute_script(
        "return Array.from(document.images).map(i => [i.id, i.complete, i.naturalWidth])"
    )
    assert imgs and all(ok and w > 0 for _, ok, w in imgs), imgs
    assert drv.execute_script("return window.__pwned === undefined")
    # phone width: nothing wider than the window
    drv.set_window_size(390, 844)
    over = drv.execute_script(
        "const d = document.documentElement;"
        "return [d.scrollWidth, d.clientWidth, document.body.scrollWidth]"
    )
    assert over[0] <= over[1] and over[2] <= over[1], over
    # a click enlarges a plot inside its own scrolling box: still no page overflow
    img = drv.find_elements("css selector", "img.plot")[0]
    drv.execute_script("arguments[0].scrollIntoView()", img)
    img.click()
    assert "zoom" in img.get_attribute("class").split()
    assert img.size["width"] > 390
    over = drv.execute_script(
        "const d = document.documentElement; return [d.scrollWidth, d.clientWidth]"
    )
    assert over[0] <= over[1], over
    img.click()
    assert "zoom" not in img.get_attribute("class").split()
    drv.set_window_size(1200, 900)


def _rows(drv: Any, table_id: str) -> list[Any]:
    return drv.find_elements("css selector", f"#{table_id} tbody tr")


def _column(drv: Any, table_id: str, key: str) -> list[str]:
    return drv.execute_script(
        "const t = document.getElementById(arguments[0]);"
        "const i = Array.from(t.tHead.rows[0].cells).findIndex(c => c.dataset.key === arguments[1]);"
        "return Array.from(t.tBodies[0].rows).map(r => r.cells[i].dataset.v ?? r.cells[i].textContent)",
        table_id,
        key,
    )


def _click_header(drv: Any, table_id: str, key: str) -> str:
    th = drv.find_element("css selector", f'#{table_id} thead th[data-key="{key}"]')
    th.click()
    return th.get_attribute("aria-sort")


def _fig(drv: Any, key: str) -> str:
    return drv.find_element("id", f"fig-{key}").get_attribute("data-value")


def test_the_request_check_sees_requests(browser: Any, tmp_path: Path) -> None:
    """Control: a page without the CSP that loads a sibling file shows up in the log."""
    (tmp_path / "pixel.svg").write_text(
        '<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"/>'
    )
    (tmp_path / "control.html").write_text('<!DOCTYPE html><img src="pixel.svg">')
    urls = _open(browser, tmp_path / "control.html")
    assert (tmp_path / "pixel.svg").resolve().as_uri() in urls


def test_run_page_in_chromium(
    browser: Any, files: dict[str, Any], pages: dict[str, Path], tmp_path: Path
) -> None:
    drv, run = browser, files["run"]
    page = pages["run"]
    _check_common(drv, page, tmp_path)
    assert float(_fig(drv, "latency_ms")) == run["latency_ms"]
    assert float(_fig(drv, "throughput")) == run["throughput"]
    assert int(_fig(drv, "kernels")) == len(run["kernels"])
    shown = drv.find_element("id", "fig-latency_ms").text  # 4 significant digits
    assert shown.endswith(" ms") and float(shown[:-3]) == pytest.approx(run["latency_ms"], rel=5e-4)
    assert drv.find_element("tag name", "h1").text == f"{run['workload']} on {run['device']}"
    rows = _rows(drv, "kernel-table")
    assert len(rows) == len(run["kernels"])
    by_index = {int(r.find_element("css selector", "td").get_attribute("data-v")): r for r in rows}
    for i in [0, 3, len(run["kernels"]) - 1, *random.Random(7).sample(range(len(rows)), 4)]:
        k, cells = run["kernels"][i], by_index[i].find_elements("css selector", "td")
        assert cells[1].text == k["name"]  # EVIL comes back as the same text
        assert float(cells[7].get_attribute("data-v")) == k["time_ms"]
        assert int(cells[8].get_attribute("data-v")) == k["cycles"]
    # default order: longest first
    times = [float(v) for v in _column(drv, "kernel-table", "time_ms")]
    assert times == sorted(times, reverse=True)
    # a click sorts ascending, a second click descending, and by text for names
    assert _click_header(drv, "kernel-table", "cycles") == "ascending"
    cyc = [int(v) for v in _column(drv, "kernel-table", "cycles")]
    assert cyc == sorted(cyc) and cyc != [int(v) for v in _column(drv, "kernel-table", "index")]
    assert _click_header(drv, "kernel-table", "cycles") == "descending"
    assert [int(v) for v in _column(drv, "kernel-table", "cycles")] == sorted(cyc, reverse=True)
    assert _click_header(drv, "kernel-table", "name") == "ascending"
    names = _column(drv, "kernel-table", "name")
    assert names == sorted(names, key=str.lower)
    ops = _rows(drv, "ops-table")
    assert len(ops) == len(run["ops"])
    assert ops[0].find_elements("css selector", "td")[0].text == run["ops"][0]["name"]


def test_profile_page_in_chromium(
    browser: Any, files: dict[str, Any], pages: dict[str, Path], tmp_path: Path
) -> None:
    drv, prof = browser, files["profile"]
    page = pages["profile"]
    _check_common(drv, page, tmp_path)
    assert float(_fig(drv, "latency_ms")) == prof["duration_ms"]
    seqs = sum(r["params"]["batch"] for r in prof["runs"])
    assert float(_fig(drv, "throughput")) == seqs / (prof["duration_ms"] * 1e-3)
    assert float(_fig(drv, "energy_j")) == prof["summary"]["energy_j"]
    assert int(_fig(drv, "kernels")) == len(prof["kernels"]) == len(_rows(drv, "kernel-table"))
    for sec in ("roofline-plot", "memory-plot"):
        assert drv.find_element("id", sec).get_attribute("src").startswith("data:image/svg+xml")
    assert drv.find_element("id", "communication").text.count("not emulated yet") == 1
    recs = drv.find_elements("css selector", "#recommendations .rec")
    assert recs and all("% of the profiled time (modelled)" in r.text for r in recs)
    ops_ms = sum(float(v) for v in _column(drv, "ops-table", "time_ms"))
    spans = sum(o["end_cycle"] - o["start_cycle"] for o in prof["ops"])
    assert ops_ms == pytest.approx(spans / (prof["device"]["clock_ghz"] * 1e6), rel=1e-12)


def test_sweep_page_in_chromium(
    browser: Any, files: dict[str, Any], pages: dict[str, Path], tmp_path: Path
) -> None:
    drv, rows = browser, files["rows"]
    page = pages["store"]
    _check_common(drv, page, tmp_path)
    ok = [r for r in rows if r["status"] == "ok"]
    failed = [r for r in rows if r["status"] == "failed"]
    assert int(_fig(drv, "points")) == len(rows)
    assert int(_fig(drv, "ok")) == len(ok) == len(_rows(drv, "points-table"))
    assert int(_fig(drv, "failed")) == len(failed) == len(_rows(drv, "failed-table"))
    assert float(_fig(drv, "best_latency_ms")) == min(r["metrics"]["latency_ms"] for r in ok)
    errors = [tr.find_elements("css selector", "td")[3].text for tr in _rows(drv, "failed-table")]
    assert errors == [r["error"] for r in failed]
    # the front per workload is exactly the brute-force one
    keys = _column(drv, "pareto-table", "point_key")
    wls = _column(drv, "pareto-table", "workload")
    for wl in {r["workload"] for r in ok}:
        assert {k for k, w in zip(keys, wls, strict=True) if w == wl} == _brute_front(rows, wl)
    # best throughput is the largest, best energy the smallest, per workload
    best = {
        (
            tr.find_elements("css selector", "td")[0].text,
            tr.find_elements("css selector", "td")[1].text,
        ): float(tr.find_elements("css selector", "td")[3].get_attribute("data-v"))
        for tr in _rows(drv, "best-table")
    }
    for wl in {r["workload"] for r in ok}:
        mine = [r["metrics"] for r in ok if r["workload"] == wl]
        assert best[(wl, "throughput")] == max(m["throughput"] for m in mine)
        assert best[(wl, "energy_j")] == min(m["energy_j"] for m in mine)
    # sortable by each metric
    for key in ("metric:latency_ms", "metric:energy_j", "metric:throughput"):
        assert _click_header(drv, "points-table", key) == "ascending"
        vals = [float(v) for v in _column(drv, "points-table", key)]
        assert vals == sorted(vals) and len(vals) == len(ok)


def test_profile_recommend_saves_the_measured_gains_the_page_shows(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    res = CliRunner().invoke(
        cli,
        ["profile", "bert-base", "-b", "8", "-s", "128", "-a", "layers=1", "--recommend"]
        + ["-o", str(out)],
    )
    assert res.exit_code == 0, res.output
    saved = json.loads(out.read_text())["recommendations"]["recommendations"]
    assert saved and all("estimated_improvement" in r for r in saved)
    page = tmp_path / "p.html"
    res = CliRunner().invoke(cli, ["report", str(out), "-o", str(page)])
    assert res.exit_code == 0, res.output
    html = page.read_text()
    # the stored, replay-measured gains, not re-modelled from the loaded report
    assert "measured" in html and "modelled" not in html.split('id="recommendations"')[-1]
