"""Training studies with axes: other models over the same axes (``also``)."""

import pytest

from accel_kit import studies


def test_other_models_run_over_the_same_axes_and_fix_the_axes_they_set():
    from accel_kit.studies.training import all_points
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
