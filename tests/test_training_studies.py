"""Each training notebook end to end with tiny sizes (papermill), asserting on the records."""
from pathlib import Path

import pytest

from accel_kit import results, studies

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(preset="gpt2-debug", precision="bf16", micro_batch_size=2, seq_len=32, steps=2, warmup_steps=1,
            measure_peak=False, timeout_s=180)


def _notebook(study, out_dir, **params):
    import papermill

    papermill.execute_notebook(str(ROOT / "notebooks" / f"{study}.ipynb"), str(out_dir / f"{study}.ipynb"),
                               parameters={"system": "cpu", "profile": "quick", **params},
                               cwd=str(ROOT / "notebooks"), kernel_name="python3", progress_bar=False)
    return results.load(out_dir / study)


@pytest.mark.slow
def test_scaling_notebook(out_dir):
    df = _notebook("scaling", out_dir, device_counts=[1, 2], **TINY, data="text")
    assert list(df["devices"]) == [1, 2] and set(df["status"]) == {"ok"}
    assert list(df["data_parallel_size"]) == [1, 2] and (df["tokens_per_s"] > 0).all()
    assert (df["data"] == "text").all()
    table = studies.study_module("scaling").table(df)
    assert table["speedup"].iloc[0] == 1.0 and table["scaling_efficiency_pct"].iloc[0] == 100.0
    assert (out_dir / "scaling" / "figures" / "scaling_throughput.html").exists()


@pytest.mark.slow
def test_seq_length_notebook(out_dir):
    df = _notebook("seq_length", out_dir, seq_lens=[16, 32], **{k: v for k, v in TINY.items() if k != "seq_len"},
                   data="synthetic")
    assert list(df["seq_len"]) == [16, 32] and set(df["status"]) == {"ok"}
    assert (df["mem_peak_gib"] > 0).all()
    assert (out_dir / "seq_length" / "figures" / "seq_length_throughput.html").exists()


@pytest.mark.slow
def test_gas_notebook(out_dir):
    df = _notebook("gas", out_dir, gas_values=[1, 2], micro_batch_sizes=[1],
                   **{k: v for k, v in TINY.items() if k != "micro_batch_size"}, data="synthetic")
    assert list(df["gas"]) == [1, 2] and set(df["status"]) == {"ok"}
    assert list(df["global_batch_size"]) == [1, 2]
    assert (out_dir / "gas" / "figures" / "gas_tokens_per_s.html").exists()


def test_other_models_run_over_the_same_axes_and_fix_the_axes_they_set():
    from accel_kit.studies._training import all_points
    from accel_kit.systems import load_system

    system = load_system("cpu")
    other = [{"preset": "genslm-debug", "seq_len": 48, "precision": "fp32"}]
    scaling = studies.resolve("scaling", "smoke", also=other)
    points = all_points(scaling, system)
    assert [(p.preset, p.devices, p.seq_len) for p in points] == [
        ("gpt2-debug", 1, 32), ("gpt2-debug", 2, 32), ("genslm-debug", 1, 48), ("genslm-debug", 2, 48)]
    assert {p.precision for p in points if p.preset == "genslm-debug"} == {"fp32"}
    # The sequence-length study sweeps seq_len: the other model runs its one length.
    lengths = all_points(studies.resolve("seq_length", "smoke", also=other), system)
    assert [(p.preset, p.seq_len) for p in lengths] == [("gpt2-debug", 16), ("gpt2-debug", 32), ("gpt2-debug", 64),
                                                        ("genslm-debug", 48)]


def test_an_other_model_with_a_key_it_does_not_take_is_one_line():
    from accel_kit.errors import ParameterError

    with pytest.raises(ParameterError, match=r"parameter 'also\[0\]\[colour\]': Extra inputs") as info:
        studies.resolve("scaling", "smoke", also=[{"preset": "gpt2-debug", "colour": "red"}])
    assert "\n" not in str(info.value)
    with pytest.raises(ParameterError, match="unknown study parameter|unknown parameter 'also'"):
        studies.resolve("sparsity", "smoke", also=[{"preset": "gpt2-debug"}])
