"""Typed, flat study parameters: profiles from ``params/<study>/<profile>.yaml``, overrides on top.

Resolution order (later wins): the study's field defaults, the profile file, the caller's
overrides (CLI ``-p NAME VALUE``, papermill ``-p``, keyword arguments). Overrides whose
value is None mean "not given" (a notebook's parameters cell uses None for "profile
default"). Unknown names, wrong types and out-of-range values are rejected with a
one-line ParameterError naming the field.
"""
from __future__ import annotations

import re
from typing import ClassVar, Iterable, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from accel_kit.errors import ParameterError
from accel_kit.json_types import JSONObject, JSONValue
from accel_kit.paths import params_dir

from accel_kit.precision import Precision, PrecisionRequest  # noqa: F401  (declared once, re-exported)


class StudyParams(BaseModel):
    """Base for every study's parameters: unknown keys are an error, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)

    # Inherited single values that a study sweeps as a list instead (e.g. seq_len -> seq_lens): name -> what
    # to use. Given anyway, they are an error (``validate``), not silently ignored.
    REPLACED_BY: ClassVar[dict[str, str]] = {}

    @classmethod
    def parameter_names(cls) -> list[str]:
        """The names a user may set (a notebook's parameters cell lists exactly these)."""
        return [name for name in cls.model_fields if name not in cls.REPLACED_BY]


P = TypeVar("P", bound=StudyParams)


class _Loader(yaml.SafeLoader):
    """YAML without YAML 1.1's base-60 numbers: ``2:4`` is the string '2:4' (as in YAML 1.2), not 124."""


_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
# A scalar with a colon is never a number here: `-p sparsity_pattern 2:4` must reach the 2:4 pattern.
_Loader.yaml_implicit_resolvers = {
    first: [(tag, re.compile(r"(?!.*:)" + rx.pattern, rx.flags) if tag in _NUMBER_TAGS else rx)
            for tag, rx in resolvers]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def parse_value(text: str, name: str | None = None) -> JSONValue:
    """Parse a command-line value as YAML, as papermill does (``'[4]'`` -> [4], ``true`` -> True;
    ``2:4`` stays '2:4', not YAML 1.1's base-60 124). ``name``: the parameter, for the error."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as exc:
        where = f"parameter {name!r}: " if name else ""
        raise ParameterError(f"{where}cannot parse value {text!r}: {exc.__class__.__name__}") from None


def profiles(study: str) -> list[str]:
    folder = params_dir() / study
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def load_profile(study: str, profile: str) -> JSONObject:
    """The flat mapping in ``params/<study>/<profile>.yaml``."""
    path = params_dir() / study / f"{profile}.yaml"
    if not path.is_file():
        known = ", ".join(profiles(study)) or "none"
        raise ParameterError(f"unknown profile {profile!r} for study {study!r}; known: {known}")
    data = yaml.load(path.read_text(), Loader=_Loader) or {}  # noqa: S506 (a SafeLoader)
    if not isinstance(data, dict) or any(isinstance(v, dict) for v in data.values()):
        raise ParameterError(f"{path}: a profile must be a flat mapping of parameter names to values")
    return data


def resolve(cls: type[P], study: str, profile: str | None, overrides: JSONObject | None = None) -> P:
    """Validate the profile merged with ``overrides`` into ``cls``."""
    values = load_profile(study, profile) if profile else {}
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return validate(cls, values, study=study)


def validate(cls: type[P], values: JSONObject, *, study: str) -> P:
    # A single value that the study sweeps as a list (seq_len in the seq_length study) is an error, not ignored.
    for name, instead in cls.REPLACED_BY.items():
        if values.get(name) is not None:
            raise ParameterError(f"parameter {name!r}: study {study!r} does not take it; use {instead}")
    unknown = sorted(set(values) - set(cls.model_fields))
    if unknown:
        raise ParameterError(f"unknown parameter {', '.join(map(repr, unknown))} for study {study!r}; "
                             f"known: {', '.join(cls.model_fields)}")
    # papermill passes `-p batch_sizes '[4]'` as the string "[4]": YAML-parse strings given to
    # fields that are not plain strings, so papermill and the CLI accept the same spellings.
    values = {k: parse_value(v, k) if isinstance(v, str) and cls.model_fields[k].annotation is not str else v
              for k, v in values.items()}
    try:
        return cls.model_validate(values)
    except ValidationError as exc:
        raise ParameterError(one_line(exc, values, fields=cls.model_fields)) from None


def one_line(exc: ValidationError, values: JSONObject, *, fields: Iterable[str] = ()) -> str:
    """A pydantic error as one line naming the parameter: ``parameter 'seq_len': ... (given 0)``.

    An error of the whole model (a validator over two fields, e.g. hidden_size and n_heads) has
    no field in its location: it names the ``fields`` its message mentions, or ``'?'``.
    """
    err = exc.errors()[0]
    # A union's branch appears in the location as its type ("list[literal[...]]"): not a place the user wrote.
    loc = [part for part in err["loc"] if not (isinstance(part, str) and "[" in part)]
    # A ValueError raised in a validator: its own words, without pydantic's "Value error, " in front.
    msg = str(err["ctx"]["error"]) if err["type"] == "value_error" and "error" in err.get("ctx", {}) else err["msg"]
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    if not loc:
        named = [f for f in fields if re.search(rf"(?<![\w.-]){re.escape(f)}(?![\w-])", msg)]
        if not named:
            return f"parameter '?': {msg}{more}"
        given = ", ".join(f"{f}={values[f]!r}" for f in named if f in values)
        return (f"parameters {' and '.join(map(repr, named))}: {msg}" + (f" (given {given})" if given else "")
                + more)
    name = str(loc[0])
    where = name + "".join(f"[{i}]" for i in loc[1:])
    given = values.get(name, err.get("input"))
    return f"parameter {where!r}: {msg} (given {given!r}){more}"
