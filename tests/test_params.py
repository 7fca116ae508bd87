import pytest

from accel_kit import studies
from accel_kit.errors import ParameterError
from accel_kit.params import parse_value, profiles
from accel_kit.studies.microbenchmark import Params


def test_profiles_exist_and_validate():
    assert {"quick", "full"} <= set(profiles("microbenchmark"))
    full = studies.resolve("microbenchmark", "full")
    assert full.batch_sizes == [8, 16, 32, 64] and full.seq_len == 1024 and full.hidden_size == 1600
    assert full.precisions == ["fp32", "fp16", "bf16"]


def test_override_wins_and_none_keeps_profile():
    p = studies.resolve("microbenchmark", "quick", batch_sizes=[4], seq_len=None)
    assert p.batch_sizes == [4] and p.seq_len == 256


def test_strings_are_yaml_parsed_like_the_cli():
    p = studies.resolve("microbenchmark", "quick", batch_sizes="[4, 8]", tf32="true", impls='["native","hf"]')
    assert p.batch_sizes == [4, 8] and p.tf32 is True and p.impls == ["native", "hf"]
    assert parse_value("[4]") == [4]


@pytest.mark.parametrize("overrides, message", [
    ({"batch_size": [4]}, "unknown parameter 'batch_size'"),
    ({"batch_sizes": 4}, "parameter 'batch_sizes': Input should be a valid list"),
    ({"batch_sizes": [0]}, "parameter 'batch_sizes[0]'"),
    ({"precisions": ["fp8"]}, "parameter 'precisions[0]'"),
    ({"impls": ["flash"]}, "parameter 'impls[0]'"),
    ({"trials": 0}, "parameter 'trials'"),
    ({"hidden_size": 100, "n_heads": 3}, "not a multiple of n_heads"),
])
def test_bad_values_one_line(overrides, message):
    with pytest.raises(ParameterError, match=message.replace("[", r"\[").replace("]", r"\]")) as info:
        studies.resolve("microbenchmark", "quick", **overrides)
    assert "\n" not in str(info.value)


def test_unknown_profile_and_study():
    with pytest.raises(ParameterError, match="unknown profile 'huge'.*full, quick"):
        studies.resolve("microbenchmark", "huge")
    with pytest.raises(ParameterError, match="unknown study"):
        studies.resolve("nope", "quick")


def test_params_reject_unknown_keys_directly():
    with pytest.raises(Exception):
        Params(batch_sizes=[1], colour="red")
