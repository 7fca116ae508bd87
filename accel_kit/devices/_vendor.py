"""What the adapters of vendor stacks (habana, poptorch, sambaflow, cerebras) and the energy readers share.

Their SDKs come from the vendors, not from PyPI, so on most machines they are missing:
``missing`` finds out without importing them (``importlib.util.find_spec``; a dotted name
imports only its parent packages, as transformers' own check for Habana's bridge does), and
``missing_reason`` says in one line which package is needed and where it comes from;
``package_version`` reads an installed distribution's version without importing it.
System options are validated by ``parse_options`` into a pydantic model that rejects unknown keys.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from accel_kit.errors import ParameterError
from accel_kit.json_types import JSONObject

T = TypeVar("T", bound=BaseModel)


def missing(module: str) -> bool:
    """Whether ``module`` (dotted) cannot be imported here; never raises. A package already imported
    (or put in ``sys.modules``, as tests do with stand-ins) is there; one set to None there is not."""
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        if name in sys.modules:
            if sys.modules[name] is None:
                return True
            continue
        try:
            if importlib.util.find_spec(name) is None:
                return True
        except (ImportError, ValueError):  # a parent that fails to import, or one without a spec
            return True
    return False


def missing_reason(module: str, source: str) -> str:
    """The one-line reason an adapter gives when its SDK is absent."""
    return f"needs the Python package {module} from {source}, not from PyPI; it is not installed here"


def package_version(*distributions: str) -> str | None:
    """The version of the first of ``distributions`` that is installed, or None."""
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def parse_options(adapter: str, model: type[T], options: JSONObject, *, given_in: str | None = None) -> T:
    """The system YAML's ``options`` as ``model``, or a one-line ParameterError naming the option
    (``given_in``: where options come from, when not from the YAML alone)."""
    try:
        return model.model_validate(options)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(map(str, err["loc"])) or "options"
        raise ParameterError(f"adapter {adapter!r} option {where!r}: {err['msg']} "
                             f"(known: {', '.join(model.model_fields)}"
                             + (f"; options: {given_in}" if given_in else "") + ")") from None
