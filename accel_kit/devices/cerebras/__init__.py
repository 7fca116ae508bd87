"""Cerebras through cerebras-pytorch (``cstorch``): a CS-2 cluster (backend CSX) or the host CPU (backend CPU).

One adapter for both, the same code path: only the cstorch backend differs. The CPU backend
executes the Cerebras programming model on the host (it needs no Cerebras hardware), so it
is what runs here and in CI; the CSX backend sends the same compiled step to a Wafer-Scale
Cluster. The programming model replaces eager PyTorch (``CerebrasAdapter.programming_model``):
``cstorch.compile`` of the model, one ``@cstorch.trace`` training step (forward and backward,
clipping, ``cstorch.optim.AdamW``), the loss read in a ``@cstorch.step_closure``, batches from
``cstorch.utils.data.DataLoader(input_fn)`` driven by a ``DataExecutor``, and weight sparsity
through ``cstorch.sparse``.

cerebras-pytorch 2.10 pins torch 2.4, so it lives in its own environment (``make cerebras``:
``.venv-cerebras``); nothing imports it before a point runs, and ``availability`` reads only
package metadata.

The modules, one concern each (those marked * import cerebras-pytorch):

- ``fields``: the record metrics cstorch's figures add (declared in ``accel_kit.metrics``);
- ``options``: ``CerebrasOptions``, the system YAML's ``options:``, each overridable by an
  environment variable ``ACCEL_KIT_CEREBRAS_<NAME>`` (a cluster's address and paths belong to
  the site, not to the committed file);
- ``adapter``: ``CerebrasAdapter``, the device, what it cannot run and why;
- ``jobscript``: the cluster's job script;
- ``model`` *: the programming model the worker calls (``prepare_model``, ``make_sparsity``,
  ``make_trainer``, ``make_block_step``);
- ``backend`` *: the process's cstorch backend and its mixed precision;
- ``data``: the input functions cstorch's DataLoader runs (here, or on the cluster's input workers);
- ``executor`` *: cstorch's DataExecutor driven one step at a time;
- ``sparsity`` *: weight sparsity through ``cstorch.sparse``;
- ``trainer`` *: the training step; ``metrics`` *: cstorch's own figures for the record;
- ``block`` *: the microbenchmark's block.
"""
from __future__ import annotations

from accel_kit.devices.cerebras import fields  # noqa: F401  (declares cstorch's record metrics)
from accel_kit.devices.cerebras.adapter import CerebrasAdapter, required_torch
from accel_kit.devices.cerebras.options import ENV_PREFIX, CerebrasOptions

__all__ = ["CerebrasAdapter", "CerebrasOptions", "ENV_PREFIX", "required_torch"]
