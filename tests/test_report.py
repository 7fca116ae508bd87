"""The cross-system report from real tiny runs of two systems, checked in headless Chromium.

Two "machines" are made here from real runs on this CPU: ``cpu`` (folder A) and ``cpu-twin``
(folder B), a second system id for the same CPU whose YAML, written by this test into a scratch
project root, says in its description that it is a test double; every twin record carries that
description (``env.system``). The twin runs only some studies, so its other columns must say
``not run``; a sequence length that cannot fit (``unsupported``) and the one past it (``skipped``,
the memory frontier) exercise the other "why not" cells. Set ACCEL_KIT_REPORT_SCREENSHOT=FILE.png
to keep the browser's screenshot.
"""
from __future__ import annotations

import json
import os
import shutil
import tarfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from accel_kit import report, results, studies
from accel_kit.cli import main as cli_main
from accel_kit.errors import AccelKitError, DataError, ParameterError

ROOT = Path(__file__).resolve().parent.parent
TWIN = "cpu-twin"
TWIN_YAML = f"""id: {TWIN}
description: "Test double: this host's CPU under a second system id (tests/test_report.py); not another machine"
adapter: cpu
device_model: host CPU
devices_per_node: 8
precisions: [fp32]
default_precision: fp32
micro_batch_size: 2
seq_len: 32
"""
TRAIN = dict(preset="gpt2-debug", precision="fp32", micro_batch_size=2, seq_len=32, steps=2, warmup_steps=1,
             measure_peak=False, data="synthetic", timeout_s=180)
NO_SEQ = {k: v for k, v in TRAIN.items() if k != "seq_len"}
# Seconds each; one point per worker process. 2**21 tokens cannot fit (unsupported before any
# allocation), and 2**22 lies past that memory frontier (skipped without a worker).
RUNS = {
    "microbenchmark": dict(preset="gpt2-debug", seq_len=16, batch_sizes=[1], precisions=["fp32"],
                           impls=["native"], warmup=1, trials=2, timeout_s=180),
    "scaling": dict(TRAIN, device_counts=[1, 2]),
    "seq_length": dict(NO_SEQ, seq_lens=[16, 2**21, 2**22]),
    "gas": dict({k: v for k, v in TRAIN.items() if k != "micro_batch_size"}, micro_batch_sizes=[1], gas_values=[1, 2]),
    "sparsity": dict(TRAIN, presets=["gpt2-debug"], sparsities=[0, 0.9], sparsity_patterns=["unstructured"], steps=20,
                     warmup_steps=2, loss_steps=20, loss_warmup_steps=2, dense_finetune_steps=0, lr=0.001),
    "genslm": dict(presets=["genslm-debug"], seq_lens=[64], quality_preset="genslm-debug", quality_steps=20,
                   synthetic_records=8, tokenizer="codon-71", precision="fp32", micro_batch_size=1, steps=2,
                   warmup_steps=1, lr=0.001, measure_peak=False, timeout_s=180),
    # The bandwidth over 64 MiB arrays (about a second) for the decode's measured MBU; one serve point, the smoke
    # profile's (gpt2-debug behind transformers serve, concurrency 2), for the serving table and figure.
    "inference": dict(presets=["llama3-debug"], precision="fp32", batch_sizes=[1, 2], input_lens=[8], output_lens=[4],
                      trials=2, hf_reference=False, measure_peak=False, measure_bandwidth=True, bandwidth_mib=[64],
                      timeout_s=180),
}
# The twin: three studies, one device and the length that fits (its other points read "not run").
TWIN_RUNS = {"microbenchmark": RUNS["microbenchmark"], "scaling": dict(TRAIN, device_counts=[1]),
             "seq_length": dict(NO_SEQ, seq_lens=[16])}
TABLES = ["systems-table", "models-table", "table-2-scaling", "table-3-seq-length", "table-4-genslm", "figure-3-data",
          "figure-4-data", "figure-6-data", "figure-7-data", "figure-8-data", "inference-data",
          "inference-serve-data", "what-if-errors", "what-if-inference-errors", "records-table"]
FIGURES = ["figure-3-plot", "figure-4-plot", "figure-5-plot", "figure-6-plot", "figure-7-plot", "figure-8-plot",
           "figure-8-gap", "inference-plot", "inference-mbu-plot", "inference-serve-plot", "what-if-plot"]


def _twin_root(path: Path) -> Path:
    """A project root whose params/ is this one's plus the twin's system YAML."""
    params = path / "params"
    (params / "systems").mkdir(parents=True)
    for item in (ROOT / "params").iterdir():
        if item.name != "systems":
            (params / item.name).symlink_to(item)
    for yaml in (ROOT / "params" / "systems").glob("*.yaml"):
        (params / "systems" / yaml.name).symlink_to(yaml)
    (params / "systems" / f"{TWIN}.yaml").write_text(TWIN_YAML)
    return path


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    """Two machines' outputs/ folders of real tiny runs: A (cpu, every study), B (cpu-twin, three)."""
    base = tmp_path_factory.mktemp("report")
    a, b = base / "machine-a" / "outputs", base / "machine-b" / "outputs"
    # The cpu microbenchmark measures the matmul peak (MFU against it in the report); the twin's does not.
    jobs = {("cpu", a): {s: p | ({"measure_peak": True} if s == "microbenchmark" else {}) for s, p in RUNS.items()},
            (TWIN, b): TWIN_RUNS}

    def run(system: str, folder: Path, runs: dict) -> None:
        for study, params in runs.items():
            studies.run_study(study, system, "smoke", output_dir=folder, progress=False, **params)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ACCEL_KIT_ROOT", str(_twin_root(base / "twin-root")))  # the workers find cpu-twin there
        # The two machines side by side: a point's process start (imports) is mostly one core's work.
        with ThreadPoolExecutor(2) as pool:
            for done in [pool.submit(run, system, folder, runs) for (system, folder), runs in jobs.items()]:
                done.result()
    return a, b


@pytest.mark.slow  # needs the machines fixture: real tiny runs of every study, minutes on a small machine
def test_the_runs_gave_what_the_report_must_show(machines):
    a, b = machines
    seq = results.load(a / "seq_length").sort_values("seq_len")
    assert list(seq["status"]) == ["ok", "unsupported", "skipped"]
    twin = list(results.iter_records(b))
    assert {r["system"] for r in twin} == {TWIN} and {r["study"] for r in twin} == set(TWIN_RUNS)
    assert all(r["env"]["system"]["description"].startswith("Test double") for r in twin)
    assert all(r["status"] == "ok" for r in results.iter_records(a) if r["study"] != "seq_length")


def _expect(page, selector_js: str):
    return page.evaluate(selector_js)


@pytest.mark.slow
def test_report_opens_offline_in_chromium_with_every_table_and_figure(machines, tmp_path, chromium, capsys):
    from playwright.sync_api import sync_playwright

    a, b = machines
    out = tmp_path / "report.html"
    assert cli_main(["report", str(a), str(b), "--out", str(out)]) == 0
    assert "records of 2 system(s) (cpu, cpu-twin)" in capsys.readouterr().out
    from plotly.offline import get_plotlyjs

    text = out.read_text()
    assert text.count(get_plotlyjs()[:300]) == 1  # plotly.js inlined once, not once per figure
    assert "<script src=" not in text and "<link" not in text  # nothing to fetch: it opens offline

    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                       else (errors.append(f"network request: {route.request.url}"), route.abort()))
            page.goto(out.as_uri())
            page.wait_for_function("() => [...document.querySelectorAll('.js-plotly-plot')]"
                                   ".every(el => el._fullLayout)", timeout=30_000)
            shot = Path(os.environ.get("ACCEL_KIT_REPORT_SCREENSHOT") or tmp_path / "report.png")
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 50_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

            manifest = json.loads(page.locator("#report-manifest").text_content())
            assert manifest["systems"] == ["cpu", TWIN]
            assert sorted(manifest["tables"]) == sorted(TABLES) and sorted(manifest["figures"]) == sorted(FIGURES)
            for table in TABLES:
                rows = page.locator(f"table#{table} tbody tr")
                assert rows.count() > 0, f"table {table} is empty"
                blank = _expect(page, f"""() => [...document.querySelectorAll('table#{table} tbody td')]
                                .filter(td => !td.innerText.trim()).length""")
                assert blank == 0, f"table {table} has {blank} blank cells"
            for fig in FIGURES:
                traces = _expect(page, f"""() => {{ const el = document.getElementById('{fig}');
                    return el && el._fullData ? el._fullData.filter(t => t.visible !== false &&
                        ((t.y && t.y.length) || (t.x && t.x.length))).length : -1; }}""")
                assert traces > 0, f"figure {fig} is missing or has no data"
                drawn = _expect(page, f"""() => document.getElementById('{fig}')
                                .querySelectorAll('.trace path, .trace .point').length""")
                assert drawn > 0, f"figure {fig} drew nothing"
            # Every number cites a record that the Records section lists.
            unlinked = _expect(page, """() => [...document.querySelectorAll('td.v')].filter(td => {
                const a = td.querySelector('sup.ref a');
                return !a || !document.querySelector(a.getAttribute('href')); }).length""")
            assert unlinked == 0
            # The "why not" cells: each kind, with a reason, and never a zero.
            whys = _expect(page, """() => [...document.querySelectorAll('td.why')].map(td => [
                td.querySelector('.st').innerText, td.title])""")
            statuses = {s for s, _ in whys}
            assert {"not run", "unsupported", "skipped", "not measured"} <= statuses, statuses
            assert all(title.split(":", 1)[1].strip() for _, title in whys)
            genslm_twin = _expect(page, f"""() => {{ const t = document.getElementById('table-4-genslm');
                const col = [...t.querySelectorAll('thead th')].findIndex(th => th.innerText.startsWith('{TWIN}'));
                return [...t.querySelectorAll('tbody tr')].map(tr => tr.children[tr.children.length -
                    (t.querySelectorAll('thead th').length - col)].innerText); }}""")
            assert genslm_twin and all(c.startswith("not run") for c in genslm_twin)
            assert "Test double" in page.locator("table#systems-table").inner_text()
            assert page.locator("#findings li").count() >= 4
        finally:
            browser.close()
    assert not errors, "\n".join(errors)


def _copy_with_rerun(src: Path, dst: Path) -> tuple[results.Record, str]:
    """``src`` copied to ``dst``, plus a later record of one point (a re-run that failed), marked as written here;
    the re-run's record and the id of the record it replaces."""
    shutil.copytree(src, dst)
    path = dst / "gas" / "cpu.jsonl"
    first = next(iter(results.iter_records(path)))
    rerun = results.make_record(study="gas", system="cpu", status="error", run_id=results.new_run_id(),
                                reason="a re-run written by tests/test_report.py (no measurement)",
                                params=first["params"], device=first["device"], model=first["model"],
                                env=first["env"])
    results.append_record(path, rerun)
    return rerun, first.record_id


@pytest.mark.slow  # needs the machines fixture: real tiny runs of every study, minutes on a small machine
def test_merge_keeps_each_record_once_and_each_points_latest(machines, tmp_path):
    a, b = machines
    rerun, replaced = _copy_with_rerun(a, tmp_path / "a-again")
    rs = report.records.collect([a, b, tmp_path / "a-again"])
    n_a = sum(1 for _ in results.iter_records(a))
    n_b = sum(1 for _ in results.iter_records(b))
    assert rs.duplicates == n_a  # A's records read twice count once
    assert rs.superseded == 1 and len(rs.records) == n_a + n_b
    ids = set(rs.by_id)
    assert rerun.record_id in ids and replaced not in ids
    by_run = report.records.collect([a, b, tmp_path / "a-again"], by_run=True)
    runs = {(r["system"], r["run_id"]) for r in [*results.iter_records(tmp_path / "a-again"), *results.iter_records(b)]}
    assert len(by_run.records) == n_a + n_b + 1 and len(by_run.systems) == len(runs)  # a column per run
    only = report.records.collect([a, b], systems=[TWIN])
    assert only.systems == [TWIN] and only.filtered_out == n_a


@pytest.mark.slow  # needs the machines fixture: real tiny runs of every study, minutes on a small machine
def test_archives_read_like_folders(machines, tmp_path):
    a, b = machines
    tgz, zf = tmp_path / "a.tar.gz", tmp_path / "b.zip"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(a, arcname="outputs")
    with zipfile.ZipFile(zf, "w") as z:
        for f in b.rglob("*"):
            z.write(f, Path("outputs") / f.relative_to(b))
    from_archives = report.records.collect([tgz, zf])
    from_folders = report.records.collect([a, b])
    assert set(from_archives.by_id) == set(from_folders.by_id) and from_archives.records


@pytest.mark.slow  # needs the machines fixture: real tiny runs of every study, minutes on a small machine
def test_report_errors_are_one_line(machines, tmp_path, capsys):
    a, _ = machines
    for argv, expected in (([str(tmp_path / "nowhere")], "no such folder, file or archive"),
                           ([str(a), "--system", "h100"], "no records of system 'h100'"),
                           ([str(tmp_path)], "no records in"),
                           ([str(a), "--format", "gif"], "invalid choice")):
        with pytest.raises(SystemExit) as exc:
            cli_main(["report", *argv, "--out", str(tmp_path / "r.html")])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and expected in err and len(err.strip().splitlines()) == 1, err
    bad = tmp_path / "bad" / "gas"
    bad.mkdir(parents=True)
    (bad / "cpu.jsonl").write_text("{not json\n")
    with pytest.raises(DataError, match=r"cpu.jsonl:1: not a JSON record"):
        report.records.collect([tmp_path / "bad"])


@pytest.mark.slow
def test_static_images_through_kaleido(machines, tmp_path, chromium, monkeypatch):
    pytest.importorskip("kaleido", reason="needs kaleido>=1 (the export extra)")
    a, b = machines
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-browser"))
    with pytest.raises(AccelKitError, match="apt-get install chromium"):
        report.build_report([a, b], out=tmp_path / "r.html", formats=["svg"])
    assert (tmp_path / "r.html").exists()  # the page is written before the images are tried
    monkeypatch.setenv("BROWSER_PATH", chromium)
    rep = report.build_report([a, b], out=tmp_path / "r.html", formats=["png"])
    assert sorted(p.name for p in rep.images) == sorted(f"{f}.png" for f in FIGURES)
    assert all(p.parent == tmp_path / "r_figures" for p in rep.images)
    for path in rep.images:
        data = path.read_bytes()
        assert len(data) > 5000 and data[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_figure_kaleido_dropped_is_rendered_again_alone(tmp_path, monkeypatch):
    """plotly's write_images returns normally when kaleido failed one figure and deleted its file."""
    pytest.importorskip("kaleido", reason="needs kaleido>=1 (the export extra)")
    import plotly.graph_objects as go
    import plotly.io as pio

    def write_all_but_the_last(figs, paths):
        for path in paths[:-1]:
            Path(path).write_bytes(b"first pass")

    again = []
    monkeypatch.setattr(pio, "write_images", write_all_but_the_last)
    monkeypatch.setattr(pio, "to_image", lambda fig, format: again.append(format) or b"second pass")
    monkeypatch.setenv("BROWSER_PATH", shutil.which("sh"))  # any existing file: no browser is started here
    figures = {"a": go.Figure(), "b": go.Figure()}
    paths = report.export_images(figures, tmp_path / "figs", ["png", "svg"])
    assert [p.read_bytes() for p in paths] == [b"first pass"] * 3 + [b"second pass"]
    assert again == ["svg"]


@pytest.mark.slow
def test_notebook_takes_folders_systems_and_output(machines, tmp_path):
    import papermill

    a, b = machines
    out = tmp_path / "nb-report.html"
    papermill.execute_notebook(str(ROOT / "notebooks" / "report.ipynb"), str(tmp_path / "report.ipynb"),
                               parameters={"folders": [str(a), str(b)], "systems": [TWIN], "out": str(out)},
                               cwd=str(ROOT / "notebooks"), kernel_name="python3", progress_bar=False)
    manifest = json.loads(out.read_text().split('id="report-manifest">', 1)[1].split("</script>", 1)[0])
    assert manifest["systems"] == [TWIN]


def test_notebook_rejects_a_parameter_it_does_not_declare():
    # What papermill injects (a "# Parameters" cell, in IPython's input history) for `-p system cpu`.
    namespace = {"In": ["", "# Parameters\nsystem = \"cpu\"\n"], "system": "cpu"}
    with pytest.raises(ParameterError, match="unknown parameter 'system' for notebook 'report'"):
        report.run_notebook(namespace)


def test_notebook_declares_exactly_the_report_parameters():
    import ast

    nb = json.loads((ROOT / "notebooks" / "report.ipynb").read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    names = [t.id for node in ast.parse("".join(cell["source"])).body for t in node.targets]
    assert names == list(report.NOTEBOOK_NAMES)


def _rec(record_id: str, metrics: dict) -> results.Record:
    """A hand-made ok record of ``metrics``, for the cell logic."""
    return results.Record(study="gas", kind="train", system="cpu", status="ok", params={}, run_id="r",
                          record_id=record_id, metrics=metrics)


def test_energy_cells_show_the_reading_or_the_records_reason():
    # Cell logic only, on hand-made metrics (this CPU exposes no energy counter to measure with).
    from accel_kit.report import cells

    cell = cells.energy()(None, None, _rec("r1", {"tokens_per_j": 1234.5, "energy_j": 2.0}))
    assert cell.measured and cell.text == "1,234" and cell.records == ("r1",)
    cell = cells.energy("flops")(None, None, _rec("r2", {
        "flops_per_j": None, "energy_j": None, "energy_reason": "no RAPL counters (/sys/class/powercap absent)"}))
    assert cell.status == "not measured" and cell.reason.startswith("no RAPL counters")
    cell = cells.energy()(None, None, _rec("r3", {"tokens_per_s": 10.0}))
    assert cell.status == "not measured" and "no energy fields" in cell.reason


@pytest.mark.slow  # needs the machines fixture: real tiny runs of every study, minutes on a small machine
def test_page_sections_tables_and_figures_in_the_papers_order(machines, tmp_path):
    # The page's manifest without a browser: every section in its place, every table and figure present.
    a, b = machines
    rep = report.build_report([a, b], out=tmp_path / "r.html")
    text = rep.path.read_text()
    manifest = json.loads(text.split('id="report-manifest">', 1)[1].split("</script>", 1)[0])
    assert manifest["sections"] == ["systems", "findings", "models", "table-2", "table-3", "table-4", "figure-3", "figure-4",
                                    "figure-5", "figure-6", "figure-7", "figure-8", "inference", "what-if"]
    assert sorted(manifest["tables"]) == sorted(TABLES) and sorted(manifest["figures"]) == sorted(FIGURES)
    assert list(rep.rendered) == manifest["sections"]


def test_models_table_shows_active_beside_total_parameters(machines, tmp_path):
    from accel_kit.report.models_section import _cells

    moe = _rec("r1", {"family": "moe", "n_layers": 32, "hidden_size": 4096, "n_params": 46_702_792_704,
                      "n_params_active": 12_879_921_152, "n_experts": 8, "experts_per_token": 2, "n_shared_experts": 0})
    assert [c.text for c in _cells(moe)] == ["moe", "32 x 4096", "46.7B", "12.9B (28%)", "8, 2, 0"]
    dense = _rec("r2", {"family": "gpt2", "n_layers": 2, "hidden_size": 64, "n_params": 110_336})
    assert [c.text for c in _cells(dense)][2:] == ["110,336", "110,336", "dense"]
    # on the page: one row per model that trained, citing its record
    text = report.build_report(list(machines), out=tmp_path / "r.html").path.read_text()
    table = text.split('id="models-table"', 1)[1].split("</table>", 1)[0]
    assert "dense" in table and "gpt2-debug" in table


def test_the_serve_table_spreads_a_load_over_its_runs_and_names_each_load():
    # Hand-made serve records (the cell and pivot logic only; the machines fixture serves one real point): one
    # concurrency point run twice (its output tokens/s spread is the range of the two runs: a load has no
    # trials), one run once (no spread, and why), and a rate point.
    from accel_kit.report.context import Context
    from accel_kit.report.inference_section import inference_section
    from accel_kit.report.records import RecordSet

    def rec(i: int, key: str, tokens_per_s: float, concurrency=None, rate=None) -> results.Record:
        return results.Record(**{"record_id": f"serve{i}", "run_id": f"run{i}", "timestamp": f"2026-01-0{i}T00:00:00",
                "study": "inference", "kind": "serve", "system": "cpu", "status": "ok",
                "params": {"kind": "serve", "point_key": key, "preset": "gpt2-debug", "precision": "fp32",
                           "engine": "transformers", "prompt_tokens": 8, "output_tokens": 4,
                           "concurrency": concurrency, "request_rate": rate},
                "metrics": {"serve_output_tokens_per_s": tokens_per_s, "serve_requests_per_s": tokens_per_s / 4,
                            "serve_ttft_p50_s": 0.01, "serve_ttft_p99_s": 0.02, "serve_tpot_p50_s": 0.003,
                            "serve_tpot_p99_s": 0.004, "goodput_requests_per_s": tokens_per_s / 4,
                            "goodput_pct": 100.0, "slo_ttft_s": 2.0, "slo_tpot_s": 0.1}})

    runs = [rec(1, "c1", 10.0, concurrency=1), rec(2, "c1", 12.0, concurrency=1), rec(3, "c4", 30.0, concurrency=4),
            rec(4, "r2", 20.0, rate=2.0)]
    latest = runs[1:]
    section = inference_section(Context(RecordSet(latest, [], runs=runs)))
    table = next(t for t in section.tables if t.id == "inference-serve-data")
    cells = {(key[:-1], key[-1]): cells[0] for key, cells in table.rows}
    c1, c4, r2 = ("gpt2-debug", "transformers", "1", "-"), ("gpt2-debug", "transformers", "4", "-"), \
        ("gpt2-debug", "transformers", "-", "2")
    assert table.row_headers[:4] == ["preset", "engine", "concurrency", "request rate"]
    assert cells[(c1, "output tokens/s")].value == 12.0 and cells[(c1, "output tokens/s spread")].value == 2.0
    assert cells[(c4, "output tokens/s spread")].status == "not measured"
    assert "one run of this load" in cells[(c4, "output tokens/s spread")].reason
    assert cells[(r2, "TPOT p99 (ms)")].text == "4" and cells[(r2, "goodput (requests/s)")].value == 5.0
    assert {div for div, _ in section.figures} == {"inference-serve-plot"}  # no generate records: no offline figure


def test_the_page_title_names_the_work_its_records_cover():
    from accel_kit.report import title_for

    assert title_for(["scaling", "microbenchmark"]) == "accel-kit: LLM training across systems"
    assert title_for(["inference"]) == "accel-kit: LLM inference across systems"
    assert title_for(["gas", "inference"]) == "accel-kit: LLM training and inference across systems"


def test_a_readable_table_prints_as_a_table_in_plain_text():
    import pandas as pd
    from accel_kit.tables import Readable

    table = Readable(pd.DataFrame({"tokens/s": ["1,234"], "system": ["cpu"]}), {"precision": "fp32"}, "one run")
    text = repr(table)
    assert text == str(table) and "frame=" not in text
    assert text.splitlines() == ["precision fp32", "tokens/s system", "   1,234    cpu", "one run"]
