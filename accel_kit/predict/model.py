"""What-if: one training step's time and memory predicted from a system's own measurements.

Step time on one data-parallel rank = compute + exposed communication:

* **Compute** is a sum of terms, each a count of work per optimizer step times a rate fitted
  (non-negative least squares, on relative error) from the system's training records at the
  same precision and host threads:

  | term | work per optimizer step | what it stands for |
  |---|---|---|
  | ``matmul_flops`` | weight-matrix and LM-head FLOPs (forward + backward) | the matrix units |
  | ``attention_flops`` | score and weighted-sum FLOPs (grow with s^2) | attention kernels |
  | ``hidden_elementwise`` | tokens x layers x hidden | LayerNorm, GELU, residuals, dropout |
  | ``vocab_elementwise`` | tokens x vocabulary | softmax and cross-entropy over the logits |
  | ``layer_launches`` | micro-batches x layers | per-kernel overhead, independent of size |
  | ``optimizer_params`` | parameters | the AdamW update, once per step (so GAS amortises it) |

  Activation checkpointing recomputes the forward: its work terms grow by 4/3. Without
  training records, a system's microbenchmark block rate or, failing that, its datasheet
  peak times a stated efficiency stands in for the fitted rates, and the prediction says so.

* **Communication** is the alpha-beta ring model (``accel_kit.predict.comm``) of the gradient
  all-reduce (DDP) or reduce-scatter + all-gather (ZeRO-1), once per optimizer step, over the
  system's link (``interconnect`` in its YAML, or a measured probe). The exposed fraction is
  fitted from the system's multi-rank records whose data-parallel traffic overlaps the same way
  (``fits.exposure_class``); without them it is taken as 1 (no overlap with backward), the
  conservative case, and listed among the assumptions.

* **The layout** (dp x tp x pp x cp devices, ``StepShape``): a device computes its replica's work
  over tp x cp for a stage's blocks (``StepShape.work``); engine fsdp replaces the gradient sync by
  two all-gathers of the parameters per micro-batch and a reduce-scatter per step over dp;
  tensor parallelism adds four all-reduces of a chunk's activations per block (Megatron-LM's two
  in forward, two in backward) over the tensor-parallel group's link, exposed whole; a pipeline
  stretches the stage's compute and tensor-parallel time by its bubble:

      step = (compute + tensor-parallel) / (1 - (pp - 1) / (m + pp - 1)) + exposed x data-parallel

* **Memory** per device starts from ``accel_kit.models.estimate_training_memory`` (the live
  tensors at the peak) and fits, over the system's measured peaks, the terms of ``MEMORY_TERMS``:

  | term | bytes | what it stands for |
  |---|---|---|
  | ``runtime_baseline`` | 1 | interpreter, libraries, device context |
  | ``estimate`` | the estimate | the live tensors, times what the allocator holds beyond them |
  | ``accumulation_working_set`` | one micro-batch's activations and logits, where GAS > 1 | memory the allocator keeps from one micro-batch while the accumulated gradients are allocated among it |

  An allocator that caches freed blocks (PyTorch's on a GPU; glibc's with the CPU adapter's
  settings) holds more than the live peak, in proportion to it: a constant baseline alone
  misses that. The same subset selection as for compute keeps only the terms the records
  ask for.

Where each part lives: the step shape and its work and memory terms in ``shape``, reading
records in ``records``, the generic solver in ``nnls``, the three fits in ``fits``, the
predictor on top in ``predictor``. The names are also importable from here, as before the split.
"""
from __future__ import annotations

from accel_kit.predict.fits import (MIN_FIT_RECORDS, TERM_PENALTY, ComputeFit, MemoryFit, fit_compute, fit_exposure,
                                    fit_memory)
from accel_kit.predict.nnls import nnls_relative
from accel_kit.predict.predictor import NO_RECORDS_EFFICIENCY, SAME_PRESET_RECORDS, Prediction, Predictor
from accel_kit.predict.records import group_key, host_threads, shape_of_record, usable
from accel_kit.predict.shape import MEMORY_TERMS, TERMS, GiB, StepShape, shape_for

__all__ = ["GiB", "MEMORY_TERMS", "MIN_FIT_RECORDS", "NO_RECORDS_EFFICIENCY", "SAME_PRESET_RECORDS", "TERMS",
           "TERM_PENALTY", "ComputeFit", "MemoryFit", "Prediction", "Predictor", "StepShape", "fit_compute",
           "fit_exposure", "fit_memory", "group_key", "host_threads", "nnls_relative", "shape_for",
           "shape_of_record", "usable"]
