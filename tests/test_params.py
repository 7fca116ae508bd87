import re

import pytest
from pydantic import model_validator

from accel_kit import studies
from accel_kit.errors import ParameterError
from accel_kit.params import StudyParams, parse_value, profiles, validate
from accel_kit.studies.microbenchmark import Params


def test_profiles_exist_and_validate():
    assert {"quick", "full"} <= set(profiles("microbenchmark"))
    full = studies.resolve("microbenchmark", "full")
    assert full.batch_sizes == [8, 16, 32, 64] and full.seq_len == 1024 and full.preset == "gpt2-xl"
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
    ({"preset": "gpt5"}, "parameter 'preset': unknown model preset 'gpt5'"),
])
def test_bad_values_one_line(overrides, message):
    with pytest.raises(ParameterError, match=re.escape(message)) as info:
        studies.resolve("microbenchmark", "quick", **overrides)
    assert "\n" not in str(info.value)


class _TwoFields(StudyParams):
    hidden_size: int = 64
    n_heads: int = 4

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> "_TwoFields":
        if self.hidden_size % self.n_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of n_heads {self.n_heads}")
        return self


def test_a_check_over_two_fields_names_both_with_the_values_given():
    with pytest.raises(ParameterError, match=re.escape(
            "parameters 'hidden_size' and 'n_heads': hidden_size 100 is not a multiple of n_heads 3 "
            "(given hidden_size=100, n_heads=3)")) as info:
        validate(_TwoFields, {"hidden_size": 100, "n_heads": 3}, study="toy")
    assert "\n" not in str(info.value)


def test_unknown_profile_and_study():
    with pytest.raises(ParameterError, match="unknown profile 'huge'.*full, quick"):
        studies.resolve("microbenchmark", "huge")
    with pytest.raises(ParameterError, match="unknown study"):
        studies.resolve("nope", "quick")


def test_params_reject_unknown_keys_directly():
    with pytest.raises(Exception):
        Params(batch_sizes=[1], colour="red")


def test_base60_looking_values_are_strings():
    # YAML 1.1 would read these as 124 and 45000; a CLI or papermill value means what it says.
    assert parse_value("2:4") == "2:4" and parse_value("[unstructured, 2:4]") == ["unstructured", "2:4"]
    assert parse_value("12:30:00") == "12:30:00"
    assert parse_value("-3") == -3 and parse_value("1.5e+3") == 1500.0 and parse_value("0x10") == 16
    assert parse_value("{a: 1}") == {"a": 1}
    with pytest.raises(ParameterError, match=r"^parameter 'batch_sizes': cannot parse value '\[4': ParserError$"):
        studies.resolve("microbenchmark", "quick", batch_sizes="[4")  # a papermill string, YAML-parsed
    p = studies.resolve("sparsity", "smoke", sparsity_patterns="[2:4]")
    assert p.sparsity_patterns == ["2:4"]


@pytest.mark.parametrize("study, overrides, message", [
    ("gas", {"sparsity_pattern": "2:4", "sparsity": 0.3},
     re.escape("parameters 'sparsity' and 'sparsity_pattern': sparsity_pattern '2:4' keeps 2 of every 4 weights, so "
               "sparsity must be 0.5 (got 0.3) (given sparsity=0.3, sparsity_pattern='2:4')")),
    # one of the two left at its default: named, but only the given one has a value to show
    ("gas", {"sparsity_pattern": "2:4"}, "parameters 'sparsity' and 'sparsity_pattern': .* \\(got 0.0\\) "
                                         "\\(given sparsity_pattern='2:4'\\)$"),
    # a field validator's ValueError: its own words after the name, without pydantic's "Value error, "
    ("genslm", {"presets": ["nope"]}, "^parameter 'presets': unknown model preset 'nope'; known: "),
    ("seq_length", {"seq_lens": [0]}, "^parameter 'seq_lens\\[0\\]': Input should be greater than 0"),
    ("scaling", {"launcher": "ssh"}, "^parameter 'launcher': Input should be "),
])
def test_every_validation_error_names_its_parameter(study, overrides, message):
    with pytest.raises(ParameterError, match=message) as info:
        studies.resolve(study, "smoke", **overrides)
    assert "\n" not in str(info.value) and "Value error" not in str(info.value)


class _Pair(StudyParams):
    low: int = 0
    high: int = 1

    @model_validator(mode="after")
    def _ordered(self):
        if self.low > self.high:
            raise ValueError("the bounds are in the wrong order")  # names neither field
        return self


def test_a_model_error_naming_no_field_says_question_mark():
    with pytest.raises(ParameterError) as info:
        validate(_Pair, {"low": 3}, study="pair")
    assert str(info.value) == "parameter '?': the bounds are in the wrong order"
