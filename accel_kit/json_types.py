"""The one name for JSON-shaped data as it travels through the package: a record's params, metrics and env, a
parameter file's values, a prepared data folder's ``meta.json``, a vendor's options.

``JSONValue`` is what ``json.loads`` returns and ``json.dumps`` takes: to a type checker the recursive union below.
At run time, where pydantic reads a field's annotation (``accel_kit.engine.result.Result``'s metrics), it is plain
``object``: pydantic builds no schema of a recursive alias written this way, and such a field keeps its values as
given, unvalidated, as it did under ``Any`` (``json.dumps`` checks them where they are written).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    JSONValue = Union[str, int, float, bool, None, list["JSONValue"], dict[str, "JSONValue"]]
else:
    JSONValue = object
#: One JSON object: a record's ``params`` / ``metrics`` / ``env``, a YAML parameter file's mapping.
JSONObject = dict[str, JSONValue]
