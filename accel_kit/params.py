"""Typed, flat study parameters: profiles from ``params/<study>/<profile>.yaml``, overrides on top.

Resolution order (later wins): the study's field defaults, the profile file, the caller's
overrides (CLI ``-p NAME VALUE``, papermill ``-p``, keyword arguments). Overrides whose
value is None mean "not given" (a notebook's parameters cell uses None for "profile
default"). Unknown names, wrong types and out-of-range values are rejected with a
one-line ParameterError naming the field.
"""
from __future__ import annotations

from typing import Any, ClassVar, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from accel_kit.errors import ParameterError
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


def parse_value(text: str) -> Any:
    """Parse a command-line value as YAML, as papermill does (``'[4]'`` -> [4], ``true`` -> True)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ParameterError(f"cannot parse value {text!r}: {exc.__class__.__name__}") from None


def profiles(study: str) -> list[str]:
    folder = params_dir() / study
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def load_profile(study: str, profile: str) -> dict[str, Any]:
    """The flat mapping in ``params/<study>/<profile>.yaml``."""
    path = params_dir() / study / f"{profile}.yaml"
    if not path.is_file():
        known = ", ".join(profiles(study)) or "none"
        raise ParameterError(f"unknown profile {profile!r} for study {study!r}; known: {known}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict) or any(isinstance(v, dict) for v in data.values()):
        raise ParameterError(f"{path}: a profile must be a flat mapping of parameter names to values")
    return data


def resolve(cls: type[P], study: str, profile: str | None, overrides: dict[str, Any] | None = None) -> P:
    """Validate the profile merged with ``overrides`` into ``cls``."""
    values = load_profile(study, profile) if profile else {}
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return validate(cls, values, study=study)


def validate(cls: type[P], values: dict[str, Any], *, study: str) -> P:
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
    values = {k: parse_value(v) if isinstance(v, str) and cls.model_fields[k].annotation is not str else v
              for k, v in values.items()}
    try:
        return cls.model_validate(values)
    except ValidationError as exc:
        raise ParameterError(_one_line(exc, values)) from None


def _one_line(exc: ValidationError, values: dict[str, Any]) -> str:
    err = exc.errors()[0]
    # A union's branch appears in the location as its type ("list[literal[...]]"): not a place the user wrote.
    loc = [part for part in err["loc"] if not (isinstance(part, str) and "[" in part)]
    name = str(loc[0]) if loc else "?"
    where = name + "".join(f"[{i}]" for i in loc[1:])
    given = values.get(name, err.get("input"))
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return f"parameter {where!r}: {err['msg']} (given {given!r}){more}"
