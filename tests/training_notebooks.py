"""A training study's notebook with tiny sizes, for its test file (imported by name: pytest puts tests/
on the path). One file per notebook (test_<study>_notebook.py): ``make test``'s workers take a file each.

Each notebook already runs as committed, in a kernel of its own, under nbval (``make test``). So only
the gradient-accumulation notebook (and the microbenchmark's, in its own test file) is run again by
papermill here, for what only a real kernel shows: parameters injected by papermill, the page's
lines. The other studies' tests run the notebook's code path in this process (``run_cells``): the
calls its cells make, with the same parameters, minus a kernel's and a fork server's start (seconds
each, on every notebook, twice over).
"""
from pathlib import Path

from accel_kit import results, studies

ROOT = Path(__file__).resolve().parent.parent
# No time budget to speak of: the quick profile's (120 s a point, estimated from the first step, the slowest)
# skipped a sparsity loss-curve point while helpers' runs loaded the 2 cores sevenfold. The budget's own
# skip is tested in tests/test_microbenchmark.py.
TINY = dict(preset="gpt2-debug", precision="bf16", micro_batch_size=2, seq_len=32, steps=2, warmup_steps=1,
            measure_peak=False, timeout_s=180, time_budget_s=100000)


def run_notebook(study, out_dir, **params):
    """``notebooks/<study>.ipynb`` run by papermill with ``params`` injected; the records it wrote."""
    import papermill

    papermill.execute_notebook(str(ROOT / "notebooks" / f"{study}.ipynb"), str(out_dir / f"{study}.ipynb"),
                               parameters={"system": "cpu", "profile": "quick", **params},
                               cwd=str(ROOT / "notebooks"), kernel_name="python3", progress_bar=False)
    return results.load(out_dir / study)


def run_cells(study, out_dir, **params):
    """What ``notebooks/<study>.ipynb``'s cells do with ``params`` set in its parameters cell, in this
    process: the run (``studies.run_notebook`` on the cell's globals), the table, the figures saved
    (a kernel would also display them); the records it wrote."""
    namespace = {"system": "cpu", "profile": "quick", "output_dir": str(out_dir), **params}
    run = studies.run_notebook(study, namespace, progress=False)
    run.table()
    assert run.figures(save=True), run.nothing_to_draw()
    return results.load(out_dir / study)
