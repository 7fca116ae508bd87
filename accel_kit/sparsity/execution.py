"""How a run's pruned layers executed, as a typed value rather than text to be parsed back.

``SparseExecution.kind`` is what tables group by (recorded as ``sparse_execution_kind``);
``describe()`` is the full sentence a record keeps (``sparse_execution``).

The kinds here are the engine's own; a device whose hardware executes pruned layers its own way
declares that kind (``declare_kind``) where it makes one, so this module names no device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

ExecutionKind = Literal["dense-model", "dense-zeros", "csr", "2:4"]
EXECUTION_KINDS: tuple[str, ...] = get_args(ExecutionKind)  # the built-in kinds (declared ones come on top)
# The kinds in which the pruned layers (some of them at least) run a sparse kernel.
KERNEL_KINDS: tuple[str, ...] = ("csr", "2:4")

NO_SPARSITY = "dense (no sparsity)"
DENSE_FALLBACK = "dense (zeros in dense matmul)"

# Short names for tables and figures: the built-in kinds', then each declared kind's.
EXECUTION_LABELS: dict[str, str] = {
    "dense-model": "dense model",
    "dense-zeros": "zeros in dense matmul",
    "csr": "CSR sparse matmul",
    "2:4": "2:4 sparse tensor cores",
}
_DECLARED_KERNEL_KINDS: set[str] = set()


def declare_kind(kind: str, label: str, *, kernel: bool) -> str:
    """Make ``kind`` (a device's own execution of pruned layers) a known kind; returns ``kind``.

    ``label`` is its short name for tables; ``kernel`` says whether its pruned layers run a sparse
    kernel (a ``SparseExecution`` of it then names one). Declaring a kind again the same way is a
    no-op; a built-in kind, or a declared one with another label or kernel flag, is a ValueError.
    """
    if kind in EXECUTION_KINDS:
        raise ValueError(f"sparse execution kind {kind!r} is built in")
    known = EXECUTION_LABELS.get(kind)
    if known is not None and (known != label or (kind in _DECLARED_KERNEL_KINDS) != kernel):
        raise ValueError(f"sparse execution kind {kind!r} is declared already, as {known!r}")
    EXECUTION_LABELS[kind] = label
    if kernel:
        _DECLARED_KERNEL_KINDS.add(kind)
    return kind


def known_kinds() -> tuple[str, ...]:
    """Every kind a ``SparseExecution`` may have now: the built-in ones and those declared."""
    return tuple(EXECUTION_LABELS)


def _runs_kernel(kind: str) -> bool:
    return kind in KERNEL_KINDS or kind in _DECLARED_KERNEL_KINDS


@dataclass(frozen=True)
class SparseExecution:
    """The execution path of the pruned layers.

    Attributes:
        kind: ``dense-model`` (nothing pruned), ``dense-zeros`` (pruned, zeros multiplied in a
            dense matmul), ``csr`` or ``2:4`` (a sparse kernel on some or all pruned layers), or
            a kind a device declared (``declare_kind``).
        detail: for ``dense-zeros`` why no sparse kernel runs; for a kernel kind which layers
            run it and how (e.g. ``every pruned layer``); empty for ``dense-model``.
        kernel: for a kernel kind, the kernel's name, with the library behind it when known.
    """

    kind: str
    detail: str = ""
    kernel: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in EXECUTION_LABELS:
            raise ValueError(f"sparse execution kind must be one of {known_kinds()}, got {self.kind!r}")
        if (self.kernel is not None) != _runs_kernel(self.kind):
            kernel_kinds = tuple(k for k in known_kinds() if _runs_kernel(k))
            raise ValueError(f"a kernel name goes with kinds {kernel_kinds} only (kind {self.kind!r}, "
                             f"kernel {self.kernel!r})")

    @property
    def label(self) -> str:
        """A short name for tables: 'dense model', 'zeros in dense matmul', 'CSR sparse matmul', ..."""
        return EXECUTION_LABELS[self.kind]

    def describe(self) -> str:
        """The full sentence a record keeps as ``sparse_execution``."""
        if self.kind == "dense-model":
            return NO_SPARSITY
        if self.kind == "dense-zeros":
            return f"{DENSE_FALLBACK}: {self.detail}"
        return f"{self.kernel} on {self.detail}"

    def __str__(self) -> str:
        return self.describe()
