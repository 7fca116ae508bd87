"""Weight sparsity: pruning, masks through training, 2:4, sparse kernels against dense, FLOPs, the study."""
import copy
import math
import warnings

import pytest
import torch
from pydantic import ValidationError

from accel_kit import flops, results, studies
from accel_kit import sparsity as S
from accel_kit.devices import get_adapter
from accel_kit.errors import ParameterError
from accel_kit.models import build_model, family_of, get_config
from accel_kit.models.gpt2 import flops as gpt2_flops
from accel_kit.engine import OptimConfig, Trainer
from accel_kit.engine.step import cast_for_precision
from accel_kit.engine.point import TrainPoint
from numerics import assert_close_sums, eps, gpt_forward_terms

VOCAB, SEQ = 97, 16
CPU = torch.device("cpu")
CPU_ADAPTER = get_adapter("cpu")


@pytest.fixture(autouse=True)
def _quiet_csr_beta_warning():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")
        yield


def _model(seed=0):
    torch.manual_seed(seed)
    return build_model("gpt2-debug", vocab_size=VOCAB, seq_len=SEQ)


def _pruned_fraction(sparse):
    """The fraction of weights the masks prune: what zero_fraction must read while the masks hold
    (a kept weight lands on exactly 0.0 with probability ~2^-24 per step: never in practice)."""
    layers = sparse.layers
    return sum(int((~layer.mask).sum()) for layer in layers) / sum(layer.mask.numel() for layer in layers)


def _rounding_bound(model):
    """How far the pruned fraction may be from the requested one: each layer prunes round(s x n)
    of its n weights, half a weight off at most, over all the prunable weights."""
    layers = [linear.weight.numel() for _, linear in S.prunable_layers(model)]
    return len(layers) / (2 * sum(layers))


def _batches(n, batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, VOCAB, (n * batch, SEQ + 1), generator=g)
    return [(data[i * batch:(i + 1) * batch, :-1], data[i * batch:(i + 1) * batch, 1:]) for i in range(n)]


@pytest.mark.parametrize("s", [0.6, 0.8, 0.9])
def test_zero_fraction_matches_request_per_layer(s):
    model = _model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    sparse = S.WeightSparsity(model, s)
    assert [layer.name for layer in sparse.layers][:4] == ["h.0.attn.c_attn", "h.0.attn.c_proj", "h.0.mlp.c_fc",
                                                           "h.0.mlp.c_proj"]
    assert len(sparse.layers) == 4 * model.cfg.n_layers
    for layer in sparse.layers:
        w = layer.module.weight
        assert int((w == 0).sum()) == round(s * w.numel()), layer.name  # exact count per layer
        # Magnitude: every kept weight is at least as large as every pruned one.
        orig = before[f"{layer.name}.weight"].abs()
        assert orig[layer.mask].min() >= orig[~layer.mask].max()
    assert sparse.zero_fraction() == _pruned_fraction(sparse) == pytest.approx(s, abs=_rounding_bound(model))
    # Embeddings, LayerNorms, biases and the tied output projection are not pruned.
    pruned = {f"{layer.name}.weight" for layer in sparse.layers}
    for name, p in model.named_parameters():
        if name not in pruned:
            assert torch.equal(p, before[name]), name


def test_two_four_pattern():
    model = _model()
    before = {name: linear.weight.detach().clone() for name, linear in S.prunable_layers(model)}
    sparse = S.WeightSparsity(model, 0.5, "2:4")
    for layer in sparse.layers:
        w = layer.module.weight
        groups = w.view(w.shape[0], -1, 4)  # 4 consecutive input weights
        assert ((groups != 0).sum(-1) <= 2).all(), layer.name
        assert (layer.mask.view(w.shape[0], -1, 4).sum(-1) == 2).all()
        orig = before[layer.name].abs().view(w.shape[0], -1, 4)
        keep = layer.mask.view_as(orig)
        # The two kept weights of each group are its two largest.
        assert (orig.masked_fill(~keep, float("inf")).amin(-1) >= orig.masked_fill(keep, -1).amax(-1)).all()
    assert sparse.zero_fraction() == 0.5  # 2 of every 4: exact
    with pytest.raises(ValueError, match="divisible by 4"):
        S.magnitude_mask(torch.randn(8, 6), 0.5, "2:4")


def test_bad_sparsity_parameters_are_rejected():
    base = dict(system="cpu", preset="gpt2-debug", precision="bf16", micro_batch_size=1, seq_len=8)
    with pytest.raises(ValidationError, match="must be 0.5"):
        TrainPoint(**base, sparsity=0.9, sparsity_pattern="2:4")
    with pytest.raises(ValidationError):
        TrainPoint(**base, sparsity=1.0)
    assert TrainPoint(**base).sparsity == 0 and TrainPoint(**base).sparse_kernels == "dense"
    with pytest.raises(ParameterError, match="sparsities"):
        studies.resolve("sparsity", "quick", sparsities=[0, 1.2])
    with pytest.raises(ParameterError, match="sparsity_patterns"):
        studies.resolve("sparsity", "quick", sparsity_patterns=["4:8"])
    with pytest.raises(ValueError, match="must be 0.5"):
        S.WeightSparsity(_model(), 0.75, "2:4")


@pytest.mark.parametrize("precision,pattern,s", [("fp32", "unstructured", 0.8), ("bf16", "2:4", 0.5)])
def test_masks_survive_optimizer_steps(precision, pattern, s):
    model = cast_for_precision(_model(), precision)  # bf16: a bf16 model, fp32 master weights in the optimizer
    sparse = S.WeightSparsity(model, s, pattern)
    start = {layer.name: layer.module.weight.detach().clone() for layer in sparse.layers}
    trainer = Trainer(model, iter(_batches(4)), CPU, precision, 1, OptimConfig(lr=1e-2, warmup_steps=1),
                      after_step=sparse.apply_masks)
    trainer.accumulate()
    for layer in sparse.layers:  # pruned weights get no gradient (the hook)
        assert (layer.module.weight.grad[~layer.mask] == 0).all()
    trainer.optimizer.zero_grad(set_to_none=True)
    for _ in range(3):
        trainer.step()
    for layer in sparse.layers:
        w = layer.module.weight
        assert (w[~layer.mask] == 0).all(), layer.name
        assert not torch.equal(w[layer.mask], start[layer.name][layer.mask])  # the kept ones trained
    assert sparse.zero_fraction() == _pruned_fraction(sparse)
    # apply_masks really re-zeroes: disturb the pruned weights, as a stray update would.
    with torch.no_grad():
        for layer in sparse.layers:
            layer.module.weight.add_(1.0)
    sparse.apply_masks()
    assert sparse.zero_fraction() == _pruned_fraction(sparse)


def test_release_lets_every_weight_train():
    model = _model()
    sparse = S.WeightSparsity(model, 0.9)
    layers = list(sparse.layers)
    sparse.release()
    trainer = Trainer(model, iter(_batches(2)), CPU, "fp32", 1, OptimConfig(lr=1e-2, warmup_steps=1))
    trainer.step()
    for layer in layers:
        assert (layer.module.weight[~layer.mask] != 0).any(), layer.name


def test_csr_kernel_matches_dense_through_training():
    """Forced CSR kernels and the dense path on the same masked model: same outputs, gradients and updates.

    In float64 (MKL's CSR takes it too): the attention key bias gets only rounding noise as gradient
    (softmax ignores a constant shift), which AdamW normalises into full-size steps, so fp32 paths
    that differ in summation order drift apart there while agreeing everywhere else.
    """
    dense_model, csr_model = _model().double(), _model().double()
    dense = S.WeightSparsity(dense_model, 0.9)
    csr = S.WeightSparsity(csr_model, 0.9)
    execution = csr.select_kernels("auto", CPU_ADAPTER, "fp32", tokens=2 * SEQ, force=True)
    assert execution.kind == "csr" and execution.label == "CSR sparse matmul"
    assert execution.describe().startswith("CSR sparse matmul") and "every pruned layer" in execution.describe()
    assert type(csr_model.h[0].mlp.c_fc).__name__ == "KernelLinear"
    assert csr_model.h[0].mlp.c_fc.weight is csr.layers[2].module.weight
    # the state dict is unchanged by the swap (same names, same tensors)
    assert list(csr_model.state_dict()) == list(dense_model.state_dict())
    (x, y), = _batches(1)
    logits_d, loss_d = dense_model(x, y)
    logits_c, loss_c = csr_model(x, y)
    # The CSR kernel sums each row's non-zeros in its own order: bounds from float64's eps and the
    # model's reductions (numerics.py), forward; forward, backward and the sum over 2 x SEQ tokens.
    n_forward = gpt_forward_terms(dense_model.cfg, SEQ)
    n_grad = 2 * n_forward + 2 * SEQ
    assert_close_sums(logits_c, logits_d, n_terms=n_forward)
    loss_d.backward()
    loss_c.backward()
    grad_scale = {}  # each tensor's gradient magnitude, for the bound on the trained weights below
    for (name, a), b in zip(dense_model.named_parameters(), csr_model.parameters()):
        assert_close_sums(b.grad, a.grad, n_terms=n_grad, msg=name)
        grad_scale[name] = a.grad.abs().max().item()
    # Two optimizer steps: the CSR operands must be rebuilt from the updated weights each time.
    runs = []
    for model, sparse in ((dense_model, dense), (csr_model, csr)):
        model.zero_grad(set_to_none=True)
        trainer = Trainer(model, iter(_batches(3, seed=1)), CPU, "fp32", 1, OptimConfig(lr=1e-2, warmup_steps=1),
                          after_step=sparse.apply_masks)
        runs.append([trainer.step() for _ in range(3)])
    # Each AdamW step moves a weight by lr x g / (|g| + eps_adam), whose change is at most
    # |delta g| / eps_adam (its slope's maximum, at g = 0: this covers the attention key bias,
    # whose gradient is only rounding noise); delta g is the bound above, eps64 x n_grad x the
    # tensor's gradient magnitude. Three steps add up; the weights are rounded each step (rtol).
    steps, lr, eps64, eps_adam = 3, 1e-2, eps(torch.float64), 1e-8
    assert runs[1] == pytest.approx(runs[0], rel=eps64 * steps * n_grad)
    for (name, a), b in zip(dense_model.named_parameters(), csr_model.parameters()):
        atol = steps * lr * eps64 * n_grad * grad_scale[name] / eps_adam
        torch.testing.assert_close(b, a, rtol=steps * eps64, atol=atol, msg=name)
    csr.release()
    assert type(csr_model.h[0].mlp.c_fc).__name__ == "Linear"


def test_kernel_selection_is_honest_about_fallbacks():
    def execution(s, pattern, mode, precision, kind):
        chosen = S.WeightSparsity(_model(), s, pattern).select_kernels(mode, CPU_ADAPTER, precision, tokens=32)
        assert chosen.kind == kind
        return chosen.describe()

    assert execution(0.0, "unstructured", "auto", "bf16", "dense-model") == "dense (no sparsity)"
    assert execution(0.9, "unstructured", "dense", "bf16", "dense-zeros") == \
        "dense (zeros in dense matmul): sparse_kernels=dense"
    text = execution(0.9, "unstructured", "auto", "bf16", "dense-zeros")
    assert text.startswith(S.DENSE_FALLBACK) and "bfloat16" in text
    text = execution(0.6, "unstructured", "auto", "fp32", "dense-zeros")
    assert text.startswith(S.DENSE_FALLBACK) and "60%" in text
    text = execution(0.5, "2:4", "auto", "bf16", "dense-zeros")
    assert text.startswith(S.DENSE_FALLBACK) and "NVIDIA" in text


class _FakeAdapter:
    """Answers ``sparse_kernel`` with a fixed kind: the kind -> kernel mapping without the device."""

    name = "fake"

    def __init__(self, kind):
        self.kind, self.synced = kind, 0

    def sparse_kernel(self, pattern, dtype):
        return self.kind, f"fake {self.kind} kernel" if self.kind else "fake: no sparse kernel"

    def synchronize(self):
        self.synced += 1


def test_the_adapter_says_which_kernel_and_the_sparsity_rule_stays_here():
    # The adapter's kind picks the kernel class.
    assert S.KERNELS == {"2:4": S.SemiStructuredKernel, "csr": S.CSRKernel}
    chosen = S.WeightSparsity(_model(), 0.5, "2:4").select_kernels("auto", _FakeAdapter(None), "bf16", tokens=32)
    assert chosen.kind == "dense-zeros" and chosen.describe() == f"{S.DENSE_FALLBACK}: fake: no sparse kernel"
    # "2:4" on a CPU: the semi-structured kernel is tried. torch's 2:4 tensors are CUDA-only, so its
    # self-check fails, and the record says so; should a torch run them on CPUs, the layers use them.
    sparse = S.WeightSparsity(_model(), 0.5, "2:4")
    chosen = sparse.select_kernels("auto", _FakeAdapter("2:4"), "bf16", tokens=32, force=True)
    assert {e["kernel"] for e in sparse.calibration} == {S.SemiStructuredKernel.label}
    if chosen.kind == "2:4":
        assert all(e["use"] for e in sparse.calibration)
        assert type(sparse.layers[0].module.kernel) is S.SemiStructuredKernel
    else:
        assert all(not e["use"] and "error" in e for e in sparse.calibration)
        assert chosen.kind == "dense-zeros" and "semi-structured sparse matmul failed here" in chosen.describe()
    # CSR from the adapter is still tried only from CSR_MIN_SPARSITY: a rule about the model, not the device.
    chosen = S.WeightSparsity(_model(), 0.6).select_kernels("auto", _FakeAdapter("csr"), "fp32", tokens=32)
    assert chosen.kind == "dense-zeros" and "60%" in chosen.describe()
    # The timing synchronizes through the adapter.
    adapter = _FakeAdapter("csr")
    S.WeightSparsity(_model(), 0.95).select_kernels("auto", adapter, "fp32", tokens=32)
    assert adapter.synced > 0
    with pytest.raises(ValueError, match="kind 'blocked'"):
        S.WeightSparsity(_model(), 0.9).select_kernels("auto", _FakeAdapter("blocked"), "fp32", tokens=32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masks_are_kept_in_the_weight_dtype(dtype):
    sparse = S.WeightSparsity(_model().to(dtype), 0.8)
    for layer in sparse.layers:
        assert layer.keep.dtype == layer.module.weight.dtype == dtype
        assert layer.mask.dtype == layer.pruned.dtype == torch.bool
        assert torch.equal(layer.mask, ~layer.pruned)


def test_execution_is_a_typed_value_and_tables_read_its_kind():
    from accel_kit.studies.sparsity import execution_label

    kernel = S.SparseExecution("csr", "every pruned layer", kernel="CSR sparse matmul (torch.sparse)")
    assert kernel.describe() == "CSR sparse matmul (torch.sparse) on every pruned layer" == str(kernel)
    assert kernel.label == "CSR sparse matmul"
    assert S.SparseExecution("dense-model").describe() == S.NO_SPARSITY
    assert S.SparseExecution("dense-zeros", "why").describe() == f"{S.DENSE_FALLBACK}: why"
    with pytest.raises(ValueError, match="kind"):
        S.SparseExecution("sparse")
    with pytest.raises(ValueError, match="kernel name"):
        S.SparseExecution("2:4", "every pruned layer")  # a kernel kind names its kernel
    with pytest.raises(ValueError, match="kernel name"):
        S.SparseExecution("dense-zeros", "why", kernel="CSR")
    # Tables read the kind; a record from before the kind column is named from its text.
    for kind, label in S.EXECUTION_LABELS.items():
        assert execution_label(kind, "unrelated text") == label
    assert execution_label(float("nan"), "CSR sparse matmul (torch.sparse) on every pruned layer") == \
        "CSR sparse matmul"
    assert execution_label(None, "dense (no sparsity)") == "dense model"
    assert execution_label(None, "dense (zeros in dense matmul): sparse_kernels=dense") == "zeros in dense matmul"
    assert execution_label(None, None) == "?"


def test_auto_times_csr_and_records_the_choice():
    model = _model()
    sparse = S.WeightSparsity(model, 0.95)
    execution = sparse.select_kernels("auto", CPU_ADAPTER, "fp32", tokens=2 * SEQ)
    text = execution.describe()
    timing = sparse.calibration
    assert {tuple(e["shape"]) for e in timing} == {(192, 64), (64, 64), (256, 64), (64, 256)}
    assert all(e["dense_ms"] > 0 and e["sparse_ms"] > 0 for e in timing)
    used = [e for e in timing if e["use"]]
    assert all(e["speedup"] >= S.KERNEL_MIN_SPEEDUP for e in used)
    kernels = sum(type(layer.module).__name__ == "KernelLinear" for layer in sparse.layers)
    if used:
        assert text.startswith("CSR") and kernels > 0 and execution.kind == "csr"
    else:
        assert text.startswith(S.DENSE_FALLBACK) and "measured slower" in text and kernels == 0
        assert execution.kind == "dense-zeros"
    m = sparse.metrics()
    assert m["sparse_execution"] == text and m["sparse_kernel_layers"] == kernels
    assert m["sparse_execution_kind"] == execution.kind


@pytest.mark.skipif(not (torch.cuda.is_available() and torch.version.cuda
                         and torch.cuda.get_device_capability() >= (8, 0)), reason="needs an NVIDIA GPU, cc >= 8.0")
def test_two_four_kernel_matches_dense_on_gpu():
    torch.manual_seed(0)
    dev = torch.device("cuda")
    dense_model = build_model("gpt2-small", seq_len=128).to(dev)
    kernel_model = copy.deepcopy(dense_model)
    S.WeightSparsity(dense_model, 0.5, "2:4")
    sparse = S.WeightSparsity(kernel_model, 0.5, "2:4")
    execution = sparse.select_kernels("auto", get_adapter("cuda"), "bf16", tokens=256, force=True)
    assert execution.kind == "2:4" and execution.describe().startswith("2:4")
    x = torch.randint(0, 50257, (2, 128), device=dev)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits_d, loss_d = dense_model(x, x)
        _, loss_k = kernel_model(x, x)
    loss_d.backward()
    loss_k.backward()
    # bf16 under autocast: both paths round each block's output and the logits to bf16, their
    # products summed in other orders (fp32 accumulation): one ulp per rounding, the 12 blocks'
    # and the logits' carried to the logits; a cross-entropy moves by at most its largest logit change.
    roundings = dense_model.cfg.n_layers + 1
    bound = roundings * eps(torch.bfloat16) * logits_d.detach().abs().max().item()
    assert loss_k.item() == pytest.approx(loss_d.item(), abs=bound)
    w_d, w_k = dense_model.h[0].mlp.c_fc.weight.grad, kernel_model.h[0].mlp.c_fc.weight.grad
    assert torch.nn.functional.cosine_similarity(w_d.flatten(), w_k.flatten(), dim=0) > 0.99


def test_effective_flops_against_hand_count():
    L, h, s, V = 2, 64, 16, 97
    block_weights = L * (4 + 2 * 4) * h * h  # QKV 3h^2 + proj h^2 + MLP 8h^2, per layer
    dense = gpt2_flops.gpt_flops_per_token(L, h, s, V)
    assert gpt2_flops.sparse_gpt_flops_per_token(L, h, s, V, nonzero_block_weights=block_weights) == dense
    nnz = block_weights // 10
    # 3 x (2 FLOPs per non-zero weight + attention 4 s h per layer + output projection 2 h V)
    expected = 3 * (2 * nnz + L * 4 * s * h + 2 * h * V)
    assert gpt2_flops.sparse_gpt_flops_per_token(L, h, s, V, nonzero_block_weights=nnz) == expected
    cfg = get_config("gpt2-debug", vocab_size=V)  # the family's terms, which training records use, agree
    assert family_of(cfg).flop_terms(cfg, s).sparse(nnz) == expected
    model = _model()
    sparse = S.WeightSparsity(model, 0.9)
    assert sparse.nonzero_weights() == block_weights - sum(round(0.9 * layer.mask.numel()) for layer in sparse.layers)


TINY = dict(presets=["gpt2-debug"], preset="gpt2-debug", vocab_size=128, precision="bf16", micro_batch_size=2,
            seq_len=32, steps=2, warmup_steps=1, data="synthetic", measure_peak=False, timeout_s=180)


@pytest.mark.slow
def test_study_records_flops_both_ways_and_the_execution_path(out_dir):
    run = studies.run_study("sparsity", "cpu", None, progress=False, sparsities=[0, 0.9],
                            sparsity_patterns=["unstructured", "2:4"], **TINY)
    recs = {(r["params"]["sparsity_pattern"], r["params"]["sparsity"]): r for r in run.records}
    assert set(recs) == {("unstructured", 0.0), ("unstructured", 0.9), ("2:4", 0.5)}
    assert all(r["status"] == "ok" for r in recs.values()), [r["reason"] for r in recs.values()]
    dense, sparse, two_four = (recs[k]["metrics"] for k in (("unstructured", 0.0), ("unstructured", 0.9),
                                                               ("2:4", 0.5)))
    assert dense["flops_effective"] == dense["flops_dense_equivalent"] == dense["flops"]
    assert sparse["flops_dense_equivalent"] == dense["flops_dense_equivalent"]
    assert sparse["flops_effective"] < sparse["flops_dense_equivalent"]
    bound = _rounding_bound(build_model("gpt2-debug", vocab_size=128, seq_len=32))
    assert sparse["sparsity_measured"] == pytest.approx(0.9, abs=bound)  # after training: the masks held
    assert two_four["sparsity_measured"] == 0.5
    assert dense["sparse_execution"] == "dense (no sparsity)"
    assert sparse["sparse_execution"].startswith("dense (zeros in dense matmul)")
    assert (dense["sparse_execution_kind"], sparse["sparse_execution_kind"], two_four["sparse_execution_kind"]) == \
        ("dense-model", "dense-zeros", "dense-zeros")
    assert all(m["mfu_basis"].startswith("dense-equivalent") for m in (dense, sparse, two_four))
    # MFU and TFLOP/s are from the dense-equivalent count; the effective rate is recorded beside it.
    assert sparse["tflops_per_device"] == pytest.approx(sparse["flops_dense_equivalent"] / sparse["step_time_s"] / 1e12)
    assert sparse["tflops_effective_per_device"] < sparse["tflops_per_device"]
    table = run.table()
    assert table.loc[table["config"] == "dense", "speedup_vs_dense"].iloc[0] == 1.0
    assert (table.loc[table["config"] != "dense", "ideal_speedup"] > 1).all()
    assert set(table["execution"]) == {"dense model", "zeros in dense matmul"}


@pytest.mark.slow
def test_sparse_pretrain_dense_finetune_through_the_notebooks_calls(out_dir):
    """Loss curves, dense against sparse, and the dense fine-tune after; through the calls the notebook's
    cells make, in this process (nbval runs the notebook itself, as committed)."""
    from training_notebooks import run_cells

    df = run_cells("sparsity", out_dir, sparsities=[0, 0.8], sparsity_patterns=["unstructured"], loss_steps=20,
                   loss_warmup_steps=2, dense_finetune_steps=20, **TINY)
    assert set(df["status"]) == {"ok"}
    # 2 throughput points (dense, 0.8) and the same 2 as 20-step loss-curve runs
    assert len(df) == 4 and sorted(df["steps"]) == [2, 2, 20, 20]
    assert (df["mfu_basis"].str.startswith("dense-equivalent")).all()
    curves = df[df["steps"] == 20]
    assert all(len(v) == 22 for v in curves["losses"]) and all(len(v) == 20 for v in curves["finetune_losses"])
    # Both runs see the same tokens from the same initial weights: the first losses match. Not a
    # rounding bound: at init both predict near-uniformly (loss ~ log vocab) whatever is pruned, and
    # 5% is the slack for what pruning 80% of the small initial weights changes in that.
    first = list(curves["loss_first"])
    assert first[0] == pytest.approx(first[1], rel=0.05)
    table = studies.study_module("sparsity").table(df)
    rows = table[table["loss_curve_run"] & (table["config"] == "s=0.8")].iloc[0]
    assert rows["loss_gap_pct"] == pytest.approx(100 * (rows["loss_final"] / table[
        table["loss_curve_run"] & (table["config"] == "dense")]["loss_final"].iloc[0] - 1))
    assert math.isfinite(rows["finetune_gap_pct"])
    for name in ("sparsity_throughput", "sparsity_loss_curves", "sparsity_loss_gap"):
        assert (out_dir / "sparsity" / "figures" / f"{name}.html").exists()
