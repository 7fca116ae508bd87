"""The gradient-accumulation notebook end to end with tiny sizes (papermill), asserting on the records."""
import pytest
from training_notebooks import TINY, run_notebook


@pytest.mark.slow
def test_gas_notebook(out_dir):
    df = run_notebook("gas", out_dir, gas_values=[1, 2], micro_batch_sizes=[1],
                      **{k: v for k, v in TINY.items() if k != "micro_batch_size"}, data="synthetic", vocab_size=97)
    assert list(df["gas"]) == [1, 2] and set(df["status"]) == {"ok"}
    assert list(df["global_batch_size"]) == [1, 2]
    assert (out_dir / "gas" / "figures" / "gas_tokens_per_s.html").exists()
    first = (out_dir / "gas.ipynb").read_text()
    # (bf16 where the CPU runs it natively, fp32 on an AVX2-only one: auto's choice, said on the page)
    assert "Precision that ran: " in first and "Nothing was measured now" not in first
    assert "tokens/s spread" in first and "Report: " in first
    # Run All again: every point is reused, and the page says so in one line, with how to measure again.
    run_notebook("gas", out_dir, gas_values=[1, 2], micro_batch_sizes=[1],
                 **{k: v for k, v in TINY.items() if k != "micro_batch_size"}, data="synthetic", vocab_size=97)
    again = (out_dir / "gas.ipynb").read_text()
    assert "Nothing was measured now: all 2 points were recorded before (" in again and "rerun = True" in again
    # The command it prints runs as printed: the same points, measured again.
    import re
    import shlex

    import nbformat

    from accel_kit import cli, results

    text = "".join(out.get("text", "") for cell in nbformat.reads(again, as_version=4).cells
                   for out in cell.get("outputs", []))
    command = re.search(r"(accel-kit run gas .*?--rerun)\)", text).group(1)
    words = shlex.split(command)
    assert cli.main([*words[1:], "-q", "--no-figures"]) == 0
    recs = list(results.iter_records(out_dir / "gas" / "cpu.jsonl"))
    assert len(recs) == 4 and len({r["params"]["point_key"] for r in recs}) == 2  # both points, again
