"""The device boundary, both ways: only ``accel_kit/devices/`` knows devices, and it knows nothing of the engine.

1. Outside ``accel_kit/devices/`` no code holds device knowledge: no device-type string (``"cuda"``,
   ``"hpu"``, ...), no ``torch.cuda``/``torch.hpu``-style module, no vendor package (imported or named in
   a string), no comparison of a ``.type``, an adapter's name or a system's adapter with a string.
   Everything else asks the adapter. Comments and docstrings may name devices (they explain); code
   and the strings it uses may not, so the check reads the syntax tree, not the lines.
2. Under ``accel_kit/devices/`` no module imports ``accel_kit.engine``, not even inside a function
   or by its name in a string: a vendor's programming model gets what it needs of the engine through
   the ``eager`` object its ``programming_model(eager)`` hook is handed.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "accel_kit"
DEVICES = PACKAGE / "devices"

DEVICE_TYPES = {"cuda", "hpu", "xla", "ipu", "csx", "mps", "xpu", "rocm", "hip", "npu", "mtia"}
VENDOR_PACKAGES = {"habana_frameworks", "poptorch", "popdist", "poprun", "cerebras", "cerebras_pytorch", "cstorch",
                   "sambaflow", "samba", "torch_xla", "intel_extension_for_pytorch", "ipex", "torch_npu", "pynvml",
                   "amdsmi", "pyhlml", "zeus", "nvidia_smi"}
# torch's own per-device namespaces: torch.cuda, torch.backends.cudnn, torch.version.hip, ...
TORCH_DEVICE_ATTRS = {"cuda", "hpu", "xpu", "mps", "xla", "npu", "mtia", "cudnn", "hip"}

def _docstring_nodes(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings or bare string statements (prose, not code)."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            ids.add(id(node.value))
    return ids


def _words(text: str) -> set[str]:
    """The lower-case words of a string, split at anything that is not a letter or digit ("cuda:0" ->
    cuda, 0; "hpu_backend" -> hpu, backend), so that a device named inside a longer string is found."""
    word, words = [], set()
    for ch in text.lower() + " ":
        if ch.isalnum():
            word.append(ch)
        elif word:
            words.add("".join(word))
            word = []
    return words


def _dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of names and attributes; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _chain(node: ast.AST) -> str | None:
    """``a.b().c`` for a chain of names, attributes and calls (``adapter.torch_device().type``): what ``_dotted``
    reads, with a call's result passed through; None for anything else."""
    parts = []
    while isinstance(node, (ast.Attribute, ast.Call)):
        if isinstance(node, ast.Call):
            parts.append("()")
            node = node.func
        else:
            parts.append("." + node.attr)
            node = node.value
    if isinstance(node, ast.Name):
        return node.id + "".join(reversed(parts))
    return None


def _is_str(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(_is_str(e) for e in node.elts)


def _device_compare(node: ast.Compare) -> str | None:
    """A comparison that branches on which device this is: ``x.type == "..."`` (``"cpu"`` too),
    ``device.type != other``, ``adapter.torch_device().type != "cpu"`` (a call's result), ``adapter.name == ...``,
    ``system.adapter in (...)``; None for any other (``is None`` included)."""
    if not all(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
        return None
    operands = [node.left, *node.comparators]
    with_str = any(_is_str(o) for o in operands)
    for o in operands:
        name = _chain(o) or ""
        if name.endswith(".type") and (with_str or "device" in name):
            return f"{name} compared"
        if name.endswith("adapter.name") or name.endswith(".adapter"):
            return f"{name} compared"
    return None


def device_knowledge(path: Path) -> list[tuple[int, str, str]]:
    """(line, word, what) for each piece of device knowledge in the code of ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    prose = _docstring_nodes(tree)
    found: list[tuple[int, str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            for word in _words(node.value) & (DEVICE_TYPES | VENDOR_PACKAGES):
                found.append((node.lineno, word, f"string {node.value[:60]!r}"))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in modules:
                if module.split(".")[0] in VENDOR_PACKAGES:
                    found.append((node.lineno, module.split(".")[0], f"import {module}"))
        elif isinstance(node, ast.Attribute):
            name = _dotted(node) or ""
            parts = name.split(".")
            if parts[0] == "torch" and len(parts) >= 2 and (
                    parts[1] in TORCH_DEVICE_ATTRS or (len(parts) >= 3 and parts[1] in ("backends", "version")
                                                       and parts[2] in TORCH_DEVICE_ATTRS)):
                found.append((node.lineno, parts[1] if parts[1] in TORCH_DEVICE_ATTRS else parts[2], name))
        elif isinstance(node, ast.Name) and node.id in VENDOR_PACKAGES:
            found.append((node.lineno, node.id, f"name {node.id}"))
        elif isinstance(node, ast.Compare):
            what = _device_compare(node)
            if what:
                found.append((node.lineno, "compare", what))
    # one finding per word and line (torch.cuda.synchronize is one, not one per attribute level)
    first = {}
    for line, word, what in found:
        first.setdefault((line, word), what)
    return sorted((line, word, what) for (line, word), what in first.items())


def test_the_guard_sees_device_knowledge_in_code_and_not_in_prose(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('"""Runs on "cuda" or an IPU (poptorch)."""\n'
                     "import torch  # torch.cuda would be found in code, not here\n"
                     "def f(device, adapter):\n"
                     '    """On a "hpu" device."""\n'
                     "    if device.type == 'cuda': pass\n"
                     "    torch.cuda.synchronize()\n"
                     "    x = torch.backends.cudnn.version()\n"
                     "    import habana_frameworks.torch.core\n"
                     "    if adapter.name == 'cerebras' or adapter is None: pass\n"
                     "    y = system.adapter != other and samba.run()\n"
                     "    z = adapter.torch_device().type != 'cpu' or ctx.device.type in ('cpu', 'meta')\n"
                     "    w = node.type == kind or adapter.torch_device(0).type\n"
                     "    return f'{device}:csx-kind', 'cpu', 'hpu_backend'\n")
    found = {(line, word) for line, word, _ in device_knowledge(probe)}
    assert found == {(5, "compare"), (5, "cuda"), (6, "cuda"), (7, "cudnn"), (8, "habana_frameworks"),
                     (9, "compare"), (9, "cerebras"), (10, "compare"), (10, "samba"), (11, "compare"),
                     (13, "csx"), (13, "hpu")}


def test_no_code_outside_devices_holds_device_knowledge():
    """The adapter is the only place that knows the device: elsewhere, no branch on it and no name of it.

    No exception is allowed today. Were one right (moving it wrong), it would be listed here with why.
    """
    offenders = [f"accel_kit/{path.relative_to(PACKAGE)}:{line}: {what} ({word})"
                 for path in sorted(PACKAGE.rglob("*.py")) if DEVICES not in path.parents
                 for line, word, what in device_knowledge(path)]
    assert not offenders, "device knowledge outside accel_kit/devices/ (ask the adapter):\n" + "\n".join(offenders)


def engine_imports(source: str, package: str) -> list[tuple[int, str]]:
    """(line, module) for each import of ``accel_kit.engine`` in ``source``, a module of ``package``: at top
    level or inside a function, absolute, relative or ``from accel_kit import engine``; and each string
    naming it (an ``importlib`` path)."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, one level up per extra dot
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)] + ([base] if base else []))
            # the module itself, or (``from accel_kit import engine``) the submodules it names
            targets = [base] if base.startswith("accel_kit.engine") else [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("accel_kit."):
            targets = [node.value.split(":")[0]]
        hits += [(node.lineno, t) for t in targets if t == "accel_kit.engine" or t.startswith("accel_kit.engine.")]
    return sorted(hits)


def test_the_engine_guard_sees_function_local_relative_and_named_imports():
    source = ("import torch\nfrom accel_kit.devices import base\n"
              "def f():\n    from ..engine import step\n    from accel_kit import engine\n"
              "    import accel_kit.engine.eager\n    return 'accel_kit.engine.worker:main'\n")
    assert engine_imports(source, "accel_kit.devices") == [
        (4, "accel_kit.engine"), (5, "accel_kit.engine"),
        (6, "accel_kit.engine.eager"), (7, "accel_kit.engine.worker")]


def test_devices_import_nothing_of_the_engine():
    hits = []
    for path in sorted(DEVICES.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        package = ".".join(parts if parts[-1] == "__init__" else parts[:-1]).removesuffix(".__init__")
        hits += [f"{path.relative_to(PACKAGE.parent)}:{line}: {module}"
                 for line, module in engine_imports(path.read_text(), package)]
    assert not hits, ("accel_kit/devices/ imports the engine (a programming model takes what it needs from the "
                      "eager object it is handed):\n" + "\n".join(hits))


def test_what_devices_take_from_the_eager_object_is_there():
    """Each ``eager.NAME`` (or ``self.eager.NAME``) that code under devices/ reads exists on the engine's
    eager model: the object stands in for the imports devices/ may not make, so a missing one fails here,
    not on the first vendor machine."""
    from accel_kit.devices import get_adapter
    from accel_kit.engine.eager import EagerModel

    eager = EagerModel(get_adapter("cpu"))
    used: dict[str, str] = {}
    for path in sorted(DEVICES.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = _dotted(node) if isinstance(node, ast.Attribute) else None
            parts = (name or "").split(".")
            for i, part in enumerate(parts[:-1]):
                if part == "eager" and (i == 0 or parts[i - 1] == "self"):
                    used.setdefault(parts[i + 1], f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert {"Trainer", "optim_for_point", "param_groups", "learning_rate", "NonFiniteLoss"} <= set(used)
    missing = [f"{where}: eager.{attr}" for attr, where in sorted(used.items()) if not hasattr(eager, attr)]
    assert not missing, "devices/ reads what the eager model does not have:\n" + "\n".join(missing)
