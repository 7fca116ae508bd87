"""What the adapters of vendor stacks (habana, poptorch, sambaflow) share.

Their SDKs come from the vendors, not from PyPI, so on most machines they are missing:
``missing`` finds out without importing them (``importlib.util.find_spec``; a dotted name
imports only its parent packages, as transformers' own check for Habana's bridge does), and
``missing_reason`` says in one line which package is needed and where it comes from.
System options are validated by ``parse_options`` into a pydantic model that rejects unknown keys.
"""
from __future__ import annotations

import importlib.util
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from accel_kit.errors import ParameterError

T = TypeVar("T", bound=BaseModel)


def missing(module: str) -> bool:
    """Whether ``module`` (dotted) cannot be imported here; never raises."""
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        try:
            if importlib.util.find_spec(".".join(parts[:i])) is None:
                return True
        except (ImportError, ValueError):  # a parent that fails to import, or one without a spec
            return True
    return False


def missing_reason(module: str, source: str) -> str:
    """The one-line reason an adapter gives when its SDK is absent."""
    return f"needs the Python package {module} from {source}, not from PyPI; it is not installed here"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def parse_options(adapter: str, model: type[T], options: dict[str, Any]) -> T:
    """The system YAML's ``options`` as ``model``, or a one-line ParameterError naming the option."""
    try:
        return model.model_validate(options)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(map(str, err["loc"])) or "options"
        raise ParameterError(f"adapter {adapter!r} option {where!r}: {err['msg']} "
                             f"(known: {', '.join(model.model_fields)})") from None
