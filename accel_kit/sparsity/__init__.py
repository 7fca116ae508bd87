"""Weight sparsity (paper Figures 7-8): magnitude pruning, masks kept through training, sparse kernels.

The paper prunes a fraction ``s`` of the weights of every dense layer and trains on a
Cerebras CS-2, whose hardware skips zero weights. This module makes the same models
anywhere accel-kit runs, and says truthfully how each run executed:

- **Pruning.** Every linear of every transformer block (attention QKV and output
  projections, MLP up and down; not embeddings, LayerNorm or the tied output projection)
  is pruned by magnitude, per weight matrix. ``unstructured``: the ``round(s * numel)``
  smallest |w| are zeroed (an exact count; ties broken by ``topk``). ``2:4``: in each group
  of 4 consecutive input weights of a row the 2 largest are kept (always 50 %), the pattern
  NVIDIA's sparse tensor cores execute (Ampere and newer).
- **Masks survive training.** A gradient hook zeroes the gradient of pruned weights (so
  clipping's global norm and AdamW's moments see only live weights, as on sparse hardware),
  and ``apply_masks`` re-zeroes the weights after every optimizer step (``Trainer``'s
  ``after_step``), so nothing (weight decay, a scaler, a fused optimizer) can revive them.
- **Execution** (``sparse_kernels``): ``dense`` always multiplies zeros in a dense matmul.
  ``auto`` uses a sparse kernel for a layer only where one exists for this device and
  dtype (the device adapter's ``sparse_kernel`` says which) *and* it measured faster than
  the dense matmul at that layer's shape (a short forward+backward timing at setup,
  recorded): 2:4 semi-structured tensors
  (``torch.sparse.to_sparse_semi_structured``: cuSPARSELt / CUTLASS) on NVIDIA GPUs of
  compute capability >= 8.0 in fp16/bf16, and CSR products (``torch.sparse``: MKL on CPU,
  cuSPARSE on GPUs) for unstructured sparsity. Everything else is the dense fallback, and
  the record says so (``sparse_execution``; its kind, for tables, in ``sparse_execution_kind``).
  FLOPs are recorded both ways (dense-equivalent, which MFU uses, and effective) by
  ``accel_kit.flops``.

What the sparse kernels do in training (both are exact, up to rounding, against the dense
path on the masked weights; tests check it):

- 2:4: the forward product Y = X W^T runs on the compressed weight, rebuilt once per
  optimizer step. The backward products run dense on the masked weight: dX = dY W reduces
  over W's output dimension, along which W has no 2:4 structure, so a tensor-core sparse
  product cannot serve it without a second, transposed pruning (which would change the
  model). So 2:4 speeds up one of the three products of a training step at best.
- CSR: all three products are sparse: Y^T = W_csr X^T, dX^T = (W^T)_csr dY^T, and dW only at
  the kept positions (``torch.sparse.sampled_addmm``). On CPU these exist in fp32/fp64 only
  (MKL), so a bf16 run (the CPU default) always takes the dense fallback. In fp32 the
  benchmark (``benchmarks/sparsity_speed.py``, GPT-2 XL MLP shapes, two Xeon cores) finds
  the CSR forward product faster than dense from about 95 % zeros, a whole training step
  (forward + backward) only at about 99 %, and even then 2-4x slower than bf16 dense.

Costs and limits, recorded rather than hidden: on the dense fallback a sparse run is a little
*slower* than the dense model, because the masks cost a pass over the pruned layers' gradients
and one over their weights each step (O(parameters): visible when a step has few tokens). The
masks take as many bytes per block weight as the weights (they are kept in the weight's dtype,
see ``WeightSparsity``), which the memory-fit estimate does not count. The DeepSpeed
engine is not supported (no ``after_step``). Under data parallelism each rank times the kernels
itself at setup, so ranks could in principle choose differently; the record is rank 0's.

Layout: ``prune`` (which layers, the magnitude masks and patterns), ``kernels`` (the sparse
kernel classes and their autograd function), ``select`` (choosing and timing a kernel per
layer shape), ``execution`` (``SparseExecution``, the path chosen, typed), ``weights``
(``WeightSparsity``: masks through training, execution, record), ``metrics`` (a record's
FLOPs both ways). The names others import are re-exported here.
"""
from accel_kit.sparsity.execution import (
    DENSE_FALLBACK,
    EXECUTION_KINDS,
    EXECUTION_LABELS,
    NO_SPARSITY,
    ExecutionKind,
    SparseExecution,
)
from accel_kit.sparsity.kernels import CSRKernel, KernelLinear, SemiStructuredKernel, SparseKernel
from accel_kit.sparsity.metrics import MFU_BASIS, record_metrics
from accel_kit.sparsity.prune import PATTERNS, Pattern, PrunedLayer, check_pattern, magnitude_mask, prunable_layers
from accel_kit.sparsity.select import CSR_MIN_SPARSITY, KERNEL_MIN_SPEEDUP, KERNEL_MODES, KERNELS
from accel_kit.sparsity.weights import WeightSparsity

__all__ = [
    "CSRKernel", "CSR_MIN_SPARSITY", "DENSE_FALLBACK", "EXECUTION_KINDS", "EXECUTION_LABELS", "ExecutionKind",
    "KERNELS", "KERNEL_MIN_SPEEDUP", "KERNEL_MODES", "KernelLinear", "MFU_BASIS", "NO_SPARSITY", "PATTERNS",
    "Pattern", "PrunedLayer", "SemiStructuredKernel", "SparseExecution", "SparseKernel",
    "WeightSparsity", "check_pattern", "magnitude_mask", "prunable_layers", "record_metrics",
]
