"""How a run's pruned layers executed, as a typed value rather than text to be parsed back.

``SparseExecution.kind`` is what tables group by (recorded as ``sparse_execution_kind``);
``describe()`` is the full sentence a record keeps (``sparse_execution``), worded as before.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

ExecutionKind = Literal["dense-model", "dense-zeros", "csr", "2:4", "csx"]
EXECUTION_KINDS: tuple[str, ...] = get_args(ExecutionKind)
# The kinds in which the pruned layers (some of them at least) run a sparse kernel.
KERNEL_KINDS: tuple[str, ...] = ("csr", "2:4", "csx")

NO_SPARSITY = "dense (no sparsity)"
DENSE_FALLBACK = "dense (zeros in dense matmul)"

# Short names for tables and figures.
EXECUTION_LABELS: dict[str, str] = {
    "dense-model": "dense model",
    "dense-zeros": "zeros in dense matmul",
    "csr": "CSR sparse matmul",
    "2:4": "2:4 sparse tensor cores",
    "csx": "zeros skipped by the CS-2",  # cstorch.sparse on a Cerebras cluster (accel_kit.devices.cerebras_train)
}


@dataclass(frozen=True)
class SparseExecution:
    """The execution path of the pruned layers.

    Attributes:
        kind: ``dense-model`` (nothing pruned), ``dense-zeros`` (pruned, zeros multiplied in a
            dense matmul), ``csr`` or ``2:4`` (a sparse kernel on some or all pruned layers), ``csx``
            (a Cerebras CS-2, whose hardware skips the zero weights).
        detail: for ``dense-zeros`` why no sparse kernel runs; for ``csr`` / ``2:4`` which layers
            run it and how (e.g. ``every pruned layer``); empty for ``dense-model``.
        kernel: for ``csr`` / ``2:4``, the kernel's name, with the library behind it when known.
    """

    kind: ExecutionKind
    detail: str = ""
    kernel: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in EXECUTION_KINDS:
            raise ValueError(f"sparse execution kind must be one of {EXECUTION_KINDS}, got {self.kind!r}")
        if (self.kernel is not None) != (self.kind in KERNEL_KINDS):
            raise ValueError(f"a kernel name goes with kinds {KERNEL_KINDS} only (kind {self.kind!r}, "
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
