"""The gradient-accumulation notebook with tiny sizes (papermill), asserting on the page and the records.

The notebook runs once here, over points the CLI recorded just before in this process: what a kernel
alone shows (papermill's parameters, the page's lines, the re-run hint) is the page of a Run All that
finds every point recorded. Its first run, measuring, is nbval's (``make test`` runs every notebook as
committed), and a second kernel here cost a third of the file's time.
"""
import re
import shlex

import nbformat
import pytest
from training_notebooks import TINY, run_notebook

from accel_kit import cli, results

PARAMS = dict({k: v for k, v in TINY.items() if k != "micro_batch_size"}, gas_values=[1, 2], micro_batch_sizes=[1],
              data="synthetic", vocab_size=97)


def _page_text(path) -> str:
    return "".join(out.get("text", "") for cell in nbformat.reads(path.read_text(), as_version=4).cells
                   for out in cell.get("outputs", []))


@pytest.mark.slow
def test_gas_notebook(out_dir):
    argv = ["run", "gas", "--system", "cpu", "--profile", "quick", "-q", "--no-figures", "--output-dir", str(out_dir)]
    for key, value in PARAMS.items():
        argv += ["-p", key, str(value).lower() if isinstance(value, bool) else str(value)]
    assert cli.main(argv) == 0
    first = list(results.iter_records(out_dir / "gas" / "cpu.jsonl"))
    assert [r["status"] for r in first] == ["ok", "ok"]
    # Run All with the same parameters: every point is reused, and the page says so in one line, with how
    # to measure again; its table, precision line and figures are the records'.
    df = run_notebook("gas", out_dir, **PARAMS)
    assert list(df["gas"]) == [1, 2] and set(df["status"]) == {"ok"}
    assert list(df["global_batch_size"]) == [1, 2]
    assert (out_dir / "gas" / "figures" / "gas_tokens_per_s.html").exists()
    page = (out_dir / "gas.ipynb").read_text()  # (the displayed table's outputs too, not only the printed lines)
    # (bf16 where the CPU runs it natively, fp32 on an AVX2-only one: auto's choice, said on the page)
    assert "Precision that ran: " in page and "tokens/s spread" in page and "Report: " in page
    text = _page_text(out_dir / "gas.ipynb")
    assert "Nothing was measured now: all 2 points were recorded before (" in text and "rerun = True" in text
    # The command it prints runs as printed: the same points, measured again.
    command = re.search(r"(accel-kit run gas .*?--rerun)\)", text).group(1)
    assert cli.main([*shlex.split(command)[1:], "-q", "--no-figures"]) == 0
    recs = list(results.iter_records(out_dir / "gas" / "cpu.jsonl"))
    assert len(recs) == 4 and len({r["params"]["point_key"] for r in recs}) == 2  # both points, again
