"""The scaling notebook with tiny sizes (its cells' calls, in this process; nbval runs it as committed), asserting on the records."""
import pytest
from training_notebooks import TINY, run_cells

from accel_kit import studies


@pytest.mark.slow
def test_scaling_notebook(out_dir):
    df = run_cells("scaling", out_dir, device_counts=[1, 2], **TINY, data="text")
    assert list(df["devices"]) == [1, 2] and set(df["status"]) == {"ok"}
    assert list(df["dp"]) == [1, 2] and (df["tokens_per_s"] > 0).all()
    assert (df["data"] == "text").all()
    table = studies.study_module("scaling").table(df)
    assert table["speedup"].iloc[0] == 1.0 and table["scaling_efficiency_pct"].iloc[0] == 100.0
    assert (out_dir / "scaling" / "figures" / "scaling_throughput.html").exists()
