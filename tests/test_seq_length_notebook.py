"""The sequence-length notebook with tiny sizes (its cells' calls, in this process; nbval runs it as committed), asserting on the records."""
import pytest
from training_notebooks import TINY, run_cells


@pytest.mark.slow
def test_seq_length_notebook(out_dir):
    df = run_cells("seq_length", out_dir, seq_lens=[16, 32], **{k: v for k, v in TINY.items() if k != "seq_len"},
                    data="synthetic", vocab_size=97)
    assert list(df["seq_len"]) == [16, 32] and set(df["status"]) == {"ok"}
    assert (df["mem_peak_gib"] > 0).all()
    assert (out_dir / "seq_length" / "figures" / "seq_length_throughput.html").exists()
