"""The form in which the study notebooks are committed, and a tool that puts them in it.

A tracked notebook is kept exactly as JupyterLab 4 saves it after opening it with this project's
kernel, minus outputs: otherwise opening one in JupyterLab rewrites its metadata, autosave leaves
a diff in a tracked file, and executed outputs end up in ``notebooks/``. Lab's save goes through
jupyter_server, which writes with ``nbformat.write``; so does this module, byte for byte.

``python -m accel_kit.notebooks_meta [--check] [NOTEBOOK ...]`` (``make strip-notebooks``)
rewrites the tracked notebooks in that form; with ``--check`` it only reports, one line each.

``pre_save_hook`` keeps them in it when JupyterLab saves (the project's jupyter_server_config.py, which
``make lab`` loads): a tracked notebook is saved in this form, without the outputs of the cells run, so
``git status`` stays clean and the records it reads say no "uncommitted changes"; the page keeps showing
the outputs until it is closed, and a run's executed notebooks belong under outputs/ (``make run``).
Why not a git clean filter (nbstripout's way): git status compares a file's size before any filter
runs, so a notebook saved with outputs still shows as modified there (only ``git diff`` and ``git add``
run the filter), and records would still say "uncommitted changes".
"""
from __future__ import annotations

import argparse
import copy
import subprocess
import sys
from pathlib import Path

import nbformat
from nbformat.v4.nbbase import random_cell_id

ROOT = Path(__file__).resolve().parent.parent

# What JupyterLab 4 writes when the kernel (ipykernel's "python3") starts: kernelspec from the
# kernel's kernel.json, language_info from its kernel_info reply.
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
# JupyterLab rewrites language_info.version with the kernel's Python version on every open and
# marks the notebook changed when it differs, so no fixed value is clean on every machine. This is
# the project's reference interpreter (the CI machine's); on another Python version, opening a
# notebook in JupyterLab changes this one line, and `make strip-notebooks` puts it back.
PYTHON_VERSION = "3.11.7"
LANGUAGE_INFO = {
    "codemirror_mode": {"name": "ipython", "version": 3},
    "file_extension": ".py",
    "mimetype": "text/x-python",
    "name": "python",
    "nbconvert_exporter": "python",
    "pygments_lexer": "ipython3",
    "version": PYTHON_VERSION,
}
NBFORMAT, NBFORMAT_MINOR = 4, 5
# papermill finds its parameters cell by the "parameters" tag; every other cell-metadata key is
# view state or run-time bookkeeping (collapsed, scrolled, execution timings, papermill's record).
CELL_METADATA_KEPT = ("tags",)


def normalise(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of ``nb`` without outputs and execution counts, with the canonical metadata."""
    nb = copy.deepcopy(nb)
    nb.nbformat, nb.nbformat_minor = NBFORMAT, NBFORMAT_MINOR
    nb.metadata = nbformat.from_dict({"kernelspec": dict(KERNELSPEC), "language_info": copy.deepcopy(LANGUAGE_INFO)})
    for cell in nb.cells:
        if "id" not in cell:  # notebooks older than nbformat 4.5; JupyterLab adds ids on upgrade
            cell.id = random_cell_id()
        cell.metadata = nbformat.from_dict({k: v for k, v in cell.metadata.items() if k in CELL_METADATA_KEPT})
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return nb


def serialise(nb: nbformat.NotebookNode) -> str:
    """The notebook's text as jupyter_server saves it (``nbformat.write`` ends it with a newline)."""
    text = nbformat.writes(nb, version=nbformat.NO_CONVERT)
    return text if text.endswith("\n") else text + "\n"


def problems(path: Path) -> list[str]:
    """What keeps the notebook at ``path`` from the canonical form; empty when it is in it."""
    text = path.read_text(encoding="utf-8")
    nb = nbformat.reads(text, as_version=nbformat.NO_CONVERT)
    found = []
    code = [c for c in nb.cells if c.cell_type == "code"]
    if any(c.get("outputs") for c in code):
        found.append("has outputs")
    if any(c.get("execution_count") is not None for c in code):
        found.append("has execution counts")
    clean = normalise(nb)
    if (nb.nbformat, nb.nbformat_minor) != (NBFORMAT, NBFORMAT_MINOR):
        found.append(f"nbformat {nb.nbformat}.{nb.nbformat_minor}, not {NBFORMAT}.{NBFORMAT_MINOR}")
    if nb.metadata != clean.metadata:
        keys = sorted(k for k in set(nb.metadata) | set(clean.metadata) if nb.metadata.get(k) != clean.metadata.get(k))
        found.append("notebook metadata differs from JupyterLab's (" + ", ".join(keys) + ")")
    if any(c.metadata != d.metadata for c, d in zip(nb.cells, clean.cells)):
        found.append("cell metadata other than tags")
    if any("id" not in c for c in nb.cells):
        found.append("cells without ids")
    if not found and text != serialise(clean):
        found.append("JSON layout differs from what JupyterLab saves")
    return found


def tracked_notebooks(root: Path = ROOT) -> list[Path]:
    """The notebooks under ``notebooks/`` that git tracks (all of them outside a git checkout)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", "notebooks/*.ipynb"], cwd=root, check=True,
                             capture_output=True, text=True).stdout
        return sorted(root / p for p in out.split("\0") if p)
    except (OSError, subprocess.CalledProcessError):
        return sorted((root / "notebooks").glob("*.ipynb"))


def is_tracked(path: Path) -> bool:
    """Whether git tracks the file at ``path`` (False outside a git checkout)."""
    try:
        return subprocess.run(["git", "ls-files", "--error-unmatch", "--", path.name], cwd=path.parent,
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def pre_save_hook(model: dict, path: str, contents_manager, **kwargs) -> None:
    """jupyter_server's pre-save hook: a notebook git tracks is saved in the committed form (``normalise``:
    no outputs, no execution counts, the canonical metadata); any other file is saved as it is."""
    if model.get("type") != "notebook" or not model.get("content"):
        return
    if not is_tracked(Path(contents_manager.root_dir, path.lstrip("/"))):
        return  # the user's own notebook: its outputs are theirs to keep
    model["content"] = normalise(nbformat.from_dict(model["content"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accel_kit.notebooks_meta", description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: the tracked notebooks/*.ipynb")
    parser.add_argument("--check", action="store_true", help="only report; exit status 1 when any is not clean")
    args = parser.parse_args(argv)
    status = 0
    for path in args.notebooks or tracked_notebooks():
        found = problems(path)
        if not found:
            continue
        if args.check:
            print(f"{path}: {'; '.join(found)}")
            status = 1
        else:
            nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
            path.write_text(serialise(normalise(nb)), encoding="utf-8")
            print(f"{path}: cleaned ({'; '.join(found)})")
    return status


if __name__ == "__main__":
    sys.exit(main())
