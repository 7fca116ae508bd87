"""The cross-system report: the paper's tables and figures from any set of machines' records.

``build_report`` is the one entry point behind ``accel-kit report`` and ``notebooks/report.ipynb``:
it reads records from one or several results folders (several machines' ``outputs/``, or
archives of them), merges them without duplicates, keeps each system's latest record per
point, and writes one self-contained HTML page (it opens offline): a systems table, findings
computed from the records, Tables II-IV and Figures 3-8, and every record cited. With
``formats``, each figure is also written as a static image (png, svg, pdf) through kaleido.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

from accel_kit.errors import AccelKitError, DataError, ParameterError
from accel_kit.report import findings, page
from accel_kit.report.context import Context, Section
from accel_kit.report.records import RecordSet, collect
from accel_kit.report.sections import SECTIONS

if TYPE_CHECKING:
    from plotly.graph_objects import Figure

IMAGE_FORMATS = ("png", "svg", "pdf")
def title_for(studies: Iterable[str]) -> str:
    """The page's title names the work its records cover (each study's ``Study.work``; a study no longer
    registered counts as training), so an inference-only report does not say training."""
    from accel_kit import studies as registry

    covered = {registry.get_study(s).work if s in registry.STUDIES else "training" for s in studies}
    work = [w for w in ("training", "inference") if w in covered]
    return f"accel-kit: LLM {' and '.join(work) or 'benchmarks'} across systems"


@dataclass
class Report:
    """What ``build_report`` wrote."""

    path: Path
    records: RecordSet
    sections: list[Section]
    rendered: dict[str, str] = field(default_factory=dict)  # section id -> its HTML on the page
    images: list[Path] = field(default_factory=list)

    @property
    def figures(self) -> dict[str, Figure]:
        """The page's plotly figures by their element id."""
        return {div: fig for s in self.sections for div, fig in s.figures}

    def summary(self) -> str:
        recs = self.records
        line = (f"{len(recs.records)} records of {len(recs.systems)} system(s) ({', '.join(recs.systems)}) from "
                f"{len(recs.sources)} source(s) -> {self.path}")
        if self.images:
            line += f"; {len(self.images)} images -> {self.images[0].parent}"
        return line

    def show(self, sections: Sequence[str] = ("systems", "findings")) -> None:
        """In a notebook: these sections inline (the whole page, with every figure, is ``path``)."""
        from IPython.display import HTML, display

        display(HTML(f"<style>{page.CSS}</style>" + "".join(self.rendered[s] for s in sections if s in self.rendered)))


def build_report(sources: Sequence[str | os.PathLike] | None = None, *, out: str | os.PathLike | None = None,
                 systems: Iterable[str] | None = None, by_run: bool = False, formats: Iterable[str] = (),
                 title: str | None = None) -> Report:
    """Read ``sources``, write the report to ``out``; returns what was written.

    Args:
        sources: results folders, ``.jsonl`` files or archives (.tar.gz, .tgz, .tar, .zip);
            None: this project's results folder (``accel_kit.paths.output_dir``).
        out: the HTML file; default ``<results folder>/report.html`` when ``sources`` is None,
            else ``report.html`` in the current folder.
        systems: only these system ids (None: every system found).
        by_run: one column per run of each system instead of each system's latest record per point.
        formats: also write every figure as these static image formats (png, svg, pdf), into
            ``<out stem>_figures/`` beside the page.
        title: the page's title; None: ``title_for`` the studies its records hold.

    Raises:
        DataError: a source missing or unreadable, a system asked for that no source holds, or
            no record at all.
        AccelKitError: static images asked for without kaleido or without Chrome/Chromium.
    """
    from accel_kit.atomic import output_errors, write_text_atomic
    from accel_kit.paths import output_dir

    formats = list(dict.fromkeys(formats or ()))
    bad = [f for f in formats if f not in IMAGE_FORMATS]
    if bad:
        raise ParameterError(f"image format {bad[0]!r} is not one of {', '.join(IMAGE_FORMATS)}")
    if not sources:
        sources = [output_dir()]
        out = out or Path(sources[0]) / "report.html"
    out = Path(out or "report.html")
    from accel_kit.paths import writable_file

    writable_file(out, "report page")  # now, in one line, not after every record was read
    if isinstance(systems, str):
        systems = [systems]
    records = collect(sources, systems=systems, by_run=by_run)
    if not records.records:
        raise DataError(f"no records in {', '.join(s.path for s in records.sources)}: run a study first "
                        "(records are <study>/<system>.jsonl under a results folder)")
    ctx = Context(records)
    sections = [s for s in (fn(ctx) for fn in SECTIONS) if s is not None]
    sections.insert(1, findings.findings_section(ctx))
    rendered = [page.section_html(s, ctx.cite) for s in sections]
    html = page.page(ctx, sections, rendered, title=title or title_for(records.studies()))
    with output_errors(out, "report page"):
        out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, html, what="report page")
    report = Report(out, records, sections, dict(zip((s.id for s in sections), rendered)))
    if formats:
        report.images = export_images(report.figures, out.parent / f"{out.stem}_figures", formats)
    return report


def _browser() -> str | None:
    """The Chrome/Chromium kaleido will use: $BROWSER_PATH, else one on PATH."""
    if os.environ.get("BROWSER_PATH"):
        return os.environ["BROWSER_PATH"] if Path(os.environ["BROWSER_PATH"]).exists() else None
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


NO_KALEIDO = ("static images need kaleido 1.x: pip install 'accel-kit[export]' (or pip install 'kaleido>=1'); "
              "the HTML report was written")
NO_BROWSER = ("static images need Chrome or Chromium, which kaleido drives: apt-get install chromium (Debian/Ubuntu), "
              "or set BROWSER_PATH to a Chrome/Chromium binary; the HTML report was written")


def export_images(figures: dict[str, Figure], folder: Path, formats: Sequence[str]) -> list[Path]:
    """Each figure as ``folder/<id>.<format>``, all in one kaleido session (one browser start)."""
    import plotly.io as pio

    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("kaleido")
    except PackageNotFoundError:
        raise AccelKitError(NO_KALEIDO) from None
    if not found.split(".")[0].isdigit() or int(found.split(".")[0]) < 1:
        raise AccelKitError(f"{NO_KALEIDO} (found kaleido {found}, whose bundled Chromium this plotly does not drive)")
    if _browser() is None:
        raise AccelKitError(NO_BROWSER)
    from accel_kit.atomic import output_errors

    items = [(fig, folder / f"{name}.{fmt}") for fmt in formats for name, fig in figures.items()]
    if not items:
        return []
    try:
        with output_errors(folder, "report's figures folder", folder=folder.parent):
            folder.mkdir(parents=True, exist_ok=True)
            pio.write_images([fig for fig, _ in items], [str(p) for _, p in items])
            # plotly drops the errors kaleido returns for single figures (a render past kaleido's timeout on a
            # busy machine, a crashed tab): kaleido deletes that file and the call still succeeds. Each such
            # figure is rendered again alone, through the call that raises.
            for fig, path in items:
                if not path.exists() or path.stat().st_size == 0:
                    path.write_bytes(pio.to_image(fig, format=path.suffix[1:]))
    except RuntimeError as exc:
        if "chrome" in str(exc).lower():
            raise AccelKitError(NO_BROWSER) from None
        raise
    return [p for _, p in items]


# ---------------------------------------------------------------------------------------------- notebook

NOTEBOOK_NAMES = ("folders", "systems", "out", "by_run", "image_formats")


def run_notebook(namespace: dict[str, object]) -> Report:
    """Build the report from ``notebooks/report.ipynb``, whose parameters cell set ``namespace``.

    An injected parameter the notebook does not declare is an error (papermill would only warn).
    """
    from accel_kit.studies import injected_parameters

    injected_parameters("report", namespace, NOTEBOOK_NAMES)
    folders = namespace.get("folders")
    if isinstance(folders, (str, os.PathLike)):
        folders = [folders]
    formats = namespace.get("image_formats") or []
    if isinstance(formats, str):
        formats = [formats]
    from accel_kit.paths import output_dir

    out = namespace.get("out") or output_dir() / "report.html"  # not beside the notebook, in notebooks/
    return build_report(folders, out=out, systems=namespace.get("systems"),
                        by_run=bool(namespace.get("by_run")), formats=formats)
