"""A training study's notebook end to end with tiny sizes (papermill), for its test file (imported by name:
pytest puts tests/ on the path). One file per notebook (test_<study>_notebook.py): ``make test``'s
workers take a file each, and these, a few tests of many seconds each, come last, so that three files
let both workers finish together where one would leave a single worker running them in turn."""
from pathlib import Path

from accel_kit import results

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(preset="gpt2-debug", precision="bf16", micro_batch_size=2, seq_len=32, steps=2, warmup_steps=1,
            measure_peak=False, timeout_s=180)


def run_notebook(study, out_dir, **params):
    """``notebooks/<study>.ipynb`` run by papermill with ``params`` injected; the records it wrote."""
    import papermill

    papermill.execute_notebook(str(ROOT / "notebooks" / f"{study}.ipynb"), str(out_dir / f"{study}.ipynb"),
                               parameters={"system": "cpu", "profile": "quick", **params},
                               cwd=str(ROOT / "notebooks"), kernel_name="python3", progress_bar=False)
    return results.load(out_dir / study)
