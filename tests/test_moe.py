"""The MoE family: published totals and active counts, FLOPs of the active experts against torchtitan's figure,
transformers equivalence (Qwen3-MoE, Mixtral and OLMoE: logits and eight AdamW steps with the aux loss; one
layer's gradients), the experts' two kernels, token dispatch, bad shapes."""
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from accel_kit.errors import ParameterError
from accel_kit.models import count_active_params, count_params, get_config
from accel_kit.models.moe import FAMILY, PRESETS, Experts, LocalDispatch, MoEConfig
from accel_kit.models.moe.hf import from_hf, state_map, to_hf
from accel_kit.models.init import initialised
from numerics import assert_close_sums, engine_adamw

DEBUG = PRESETS["moe-debug"]  # Qwen3-MoE-shaped: per-head QK-norm, a dense first layer


def _experts(*args) -> Experts:
    """A lone ``Experts`` drawn as the family draws a model's (its module leaves its weights to the family's rule)."""
    return initialised(lambda: Experts(*args), FAMILY.init_rule(DEBUG))
MIXTRAL = replace(DEBUG, qk_norm=None, dense_layers=(), ffn_hidden_size=0, hf_architecture="MixtralForCausalLM")
OLMOE = replace(DEBUG, qk_norm="full", dense_layers=(), ffn_hidden_size=0, norm_topk_prob=False,
                hf_architecture="OlmoeForCausalLM")
SEQ = 32
ROUTER_STD = 1.0  # tests' router weights: well-separated top-k choices, so rounding never flips one


def moe_forward_terms(cfg: MoEConfig, seq_len: int, n_layers: int | None = None) -> int:
    """Terms along the longest path of a forward (a chain: stages add): per layer RMSNorm, qkv, QK-norm, scores,
    softmax and weighted values, o_proj, RMSNorm, the router and its softmax, gate/up, down, the top-k sum;
    then the final RMSNorm and the head."""
    h = cfg.hidden_size
    per_layer = 5 * h + 2 * cfg.head_dim + 2 * seq_len + 2 * cfg.n_experts + h + cfg.expert_ffn_hidden_size
    per_layer += max(cfg.ffn_hidden_size, cfg.experts_per_token)
    return (cfg.n_layers if n_layers is None else n_layers) * per_layer + 2 * h


def _built(cfg: MoEConfig, seed: int = 0):
    torch.manual_seed(seed)
    model = FAMILY.build(cfg)
    with torch.no_grad():
        for mlp in model.moe_layers():
            mlp.router.weight.normal_(0.0, ROUTER_STD)
    return model


@pytest.mark.parametrize("preset, total, active, published", [
    ("mixtral-8x7b", 46_702_792_704, 12_879_925_248, (46.7, 12.9)),
    ("qwen3-30b-a3b", 30_532_122_624, 3_353_032_704, (30.5, 3.3)),
    ("olmoe-1b-7b", 6_919_161_856, 1_282_017_280, (6.9, 1.3)),
])
def test_published_totals_and_active_counts_exact(preset, total, active, published):
    cfg = PRESETS[preset]
    # By hand: per layer q, o (h x nh hd), k, v (h x nkv hd), the QK-norm weights, the router (h x E), E experts
    # of 3 h F, two norms (h); the final norm, the embedding and the untied head.
    h, q, kv = cfg.hidden_size, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    qk_norm = {None: 0, "head": 2 * cfg.head_dim, "full": q + kv}[cfg.qk_norm]
    expert = 3 * h * cfg.expert_ffn_hidden_size
    layer = 2 * h * q + 2 * h * kv + qk_norm + h * cfg.n_experts + cfg.n_experts * expert + 2 * h
    by_hand = cfg.n_layers * layer + h + 2 * cfg.vocab_size * h
    assert by_hand == total and count_params(preset) == total
    skipped = cfg.n_layers * (cfg.n_experts - cfg.experts_per_token) * expert
    assert total - skipped == active and count_active_params(preset) == active
    # The releases' own figures, in billions to one decimal: rounded (Mistral, AllenAI) or truncated (Qwen's
    # 3.35B active published as 3.3B)
    for count, figure in zip((total, active), published):
        assert figure in (round(count / 1e9, 1), math.floor(count / 1e8) / 10)


def test_flops_of_qwen3_30b_a3b_are_torchtitans_37_6_gflop_per_token():
    # torchtitan (get_moe_model_nparams_and_flops): 6 x (active parameters - embedding) + 12 L H Q T. Its active
    # parameters hold the norms' weights, which we do not count as products: exactly 6 x those apart.
    cfg, seq = PRESETS["qwen3-30b-a3b"], 8192
    L, h = cfg.n_layers, cfg.hidden_size
    torchtitan = 6 * (count_active_params("qwen3-30b-a3b") - cfg.vocab_size * h) + \
        12 * L * cfg.n_heads * cfg.head_dim * seq
    norms = L * (2 * h + 2 * cfg.head_dim) + h
    total = FAMILY.flop_terms(cfg, seq).total()
    assert total == torchtitan - 6 * norms == 37_577_293_824
    assert round(total / 1e9, 1) == round(torchtitan / 1e9, 1) == 37.6
    # Every expert counted would be five times as many (the mistake the active count avoids)
    every_expert = total + 6 * FAMILY.inactive_weight_count(cfg)
    assert every_expert > 5 * total


def test_flops_of_a_model_with_dense_layers_and_shared_experts_by_hand():
    cfg = replace(DEBUG, n_shared_experts=2, shared_expert_ffn_hidden_size=16)
    h, q, kv, E, k, f = 64, 64, 32, 8, 2, 32
    attention = h * (q + 2 * kv) + q * h
    moe = attention + h * E + k * 3 * h * f + 3 * h * 32  # router, top-2 experts, two shared of 16
    dense = attention + 3 * h * 128
    terms = FAMILY.flop_terms(cfg, SEQ)
    assert terms.matmul == 2 * (2 * moe + dense) and terms.matmul_unpruned == 2 * 2 * (h * E + k * 3 * h * f)
    assert terms.attention == 3 * 4 * SEQ * q and terms.logits == 2 * h * 512
    model = FAMILY.build(cfg)
    assert model.num_params() == count_params("moe-debug") + 2 * 3 * h * 32


@pytest.mark.parametrize("cfg", [DEBUG, MIXTRAL, OLMOE], ids=["qwen3", "mixtral", "olmoe"])
def test_hf_round_trip_logits_and_weights(cfg):
    ours = _built(cfg).eval()
    hf = to_hf(ours).eval()
    assert type(hf).__name__ == cfg.hf_architecture
    idx = torch.randint(0, cfg.vocab_size, (2, SEQ))
    with torch.no_grad():
        assert_close_sums(ours(idx)[0], hf(idx).logits, n_terms=moe_forward_terms(cfg, SEQ))
    back = from_hf(hf)
    assert back.cfg == cfg
    for (name, a), b in zip(ours.state_dict().items(), back.state_dict().values()):
        assert torch.equal(a, b), name


def test_the_microbenchmarks_two_layers_hold_the_same_weights():
    # transformers' experts are torch.empty until a whole model's post_init: a lone layer's stayed untouched
    # pages (zeros the cache held), and the layer benchmark timed ours on real weights against those
    torch.manual_seed(0)
    ours = state_map(DEBUG).layer_names(FAMILY.build_layer(DEBUG, "native").state_dict())
    torch.manual_seed(0)
    theirs = FAMILY.build_layer(DEBUG, "hf").layer.state_dict()
    assert set(ours) <= set(theirs)
    for name, t in ours.items():
        assert torch.equal(t, theirs[name]), name
    assert all(theirs[n].abs().sum() > 0 for n in theirs if "experts" in n)


@pytest.mark.parametrize("cfg", [DEBUG, MIXTRAL], ids=["qwen3", "mixtral"])
def test_layer_matches_transformers_forward_and_backward(cfg):
    torch.manual_seed(0)
    ours = FAMILY.build_layer(cfg, "native")
    with torch.no_grad():
        ours.mlp.router.weight.normal_(0.0, ROUTER_STD)
    theirs = FAMILY.build_layer(cfg, "hf")
    theirs.layer.load_state_dict(state_map(cfg).layer_names(ours.state_dict()))
    x = torch.randn(2, SEQ, cfg.hidden_size)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ours(xa), theirs(xb)
    n_forward = moe_forward_terms(cfg, SEQ, n_layers=1)
    assert_close_sums(ya, yb, n_terms=n_forward)
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    n_backward = 2 * n_forward + 2 * SEQ  # weight gradients sum over the 2 x SEQ tokens besides
    assert_close_sums(xa.grad, xb.grad, n_terms=n_backward)
    ours_grads = state_map(cfg).layer_names({n: p.grad for n, p in ours.named_parameters()})
    theirs_grads = {n: p.grad for n, p in theirs.layer.named_parameters()}
    assert ours_grads.keys() == theirs_grads.keys()
    for name, grad in theirs_grads.items():
        assert_close_sums(ours_grads[name], grad, n_terms=n_backward, msg=name)


def _hf_loss(hf, cfg):
    def loss_of(x, y):
        out = hf(x)  # output_router_logits is on: transformers computes the aux loss in its forward
        # its own loss shifts its labels; ours takes shifted targets, so the same cross-entropy over its logits,
        # plus the aux loss as transformers adds it when labels are given
        return F.cross_entropy(out.logits.float().flatten(0, 1), y.flatten()) + cfg.router_aux_loss_coef * out.aux_loss
    return loss_of


@pytest.mark.parametrize("cfg", [DEBUG, MIXTRAL, OLMOE], ids=["qwen3", "mixtral", "olmoe"])
def test_training_matches_transformers_for_eight_steps(cfg):
    ours = _built(cfg).train()
    hf = to_hf(ours).train()
    assert hf.config.output_router_logits and hf.config.router_aux_loss_coef == cfg.router_aux_loss_coef
    batches = torch.randint(0, cfg.vocab_size, (2, 2, SEQ + 1))
    runs, aux = [], []
    for model, loss_of in ((ours, lambda x, y: ours(x, y)[1]), (hf, _hf_loss(hf, cfg))):
        optimizer, losses = engine_adamw(model), []
        for step in range(8):
            tokens = batches[step % 2]
            loss = loss_of(tokens[:, :-1], tokens[:, 1:])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
        runs.append(losses)
    aux = ours.aux_loss().item()
    assert runs[0][-2] < runs[0][0] and runs[0][-1] < runs[0][1]  # it trains
    assert cfg.experts_per_token * 0.9 < aux < cfg.n_experts  # k for a uniform router, E for a collapsed one
    # The family's acceptance bound, as Llama's (tests/test_llama.py): no drift over the steps.
    for step, (a, b) in enumerate(zip(*runs)):
        assert abs(a - b) / abs(b) < 1e-5, f"step {step}: ours {a}, transformers {b}"


def test_grouped_mm_and_loop_kernels_agree():
    torch.manual_seed(0)
    for dtype, h, f in ((torch.float32, 64, 32), (torch.bfloat16, 64, 32), (torch.bfloat16, 36, 12)):
        # the last: 16-bit widths off the 16-byte alignment run padded
        grouped, loop = _experts(4, h, f, "grouped_mm").to(dtype), _experts(4, h, f, "loop").to(dtype)
        loop.load_state_dict(grouped.state_dict())
        counts = torch.tensor([5, 0, 11, 8])  # an expert with no tokens
        x = torch.randn(24, h, dtype=dtype)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = grouped.forward_sorted(xa, counts), loop.forward_sorted(xb, counts)
        assert (grouped.kernel_ran, loop.kernel_ran) == ("grouped_mm", "loop")
        acc = torch.float32  # CPU kernels accumulate 16-bit products in fp32
        assert_close_sums(ya, yb, n_terms=h + f, accumulate=acc)
        g = torch.randn_like(ya)
        ya.backward(g)
        yb.backward(g)
        assert_close_sums(xa.grad, xb.grad, n_terms=2 * (h + f), accumulate=acc)
        for a, b in ((grouped.gate_up_proj, loop.gate_up_proj), (grouped.down_proj, loop.down_proj)):
            assert_close_sums(a.grad, b.grad, n_terms=2 * (h + f) + 24, accumulate=acc)
        assert grouped.down_proj.grad[1].abs().sum() == 0  # the idle expert gets no gradient


def test_dispatch_is_the_weighted_sum_of_each_tokens_experts():
    torch.manual_seed(0)
    experts, dispatch = _experts(4, 16, 8, "loop"), LocalDispatch()
    x, index = torch.randn(6, 16), torch.tensor([[0, 2], [2, 3], [2, 0], [1, 2], [3, 0], [2, 1]])
    weights = torch.rand(6, 2)
    y = dispatch(x, index, weights, experts)

    def expert(e, row):
        gate, up = (experts.gate_up_proj[e] @ row).chunk(2)
        return experts.down_proj[e] @ (F.silu(gate) * up)

    by_token = torch.stack([sum(weights[t, j] * expert(index[t, j], x[t]) for j in range(2)) for t in range(6)])
    assert_close_sums(y, by_token, n_terms=16 + 8 + 2)
    assert dispatch.last_tokens_per_expert.tolist() == [3, 2, 5, 2]


def test_aux_loss_is_k_for_a_uniform_router_and_survives_checkpointing():
    torch.manual_seed(0)
    model = FAMILY.build(DEBUG)
    with torch.no_grad():
        for mlp in model.moe_layers():
            mlp.router.weight.zero_()  # every expert equally likely: f sums to k over experts, P = 1/E
    idx = torch.randint(0, 512, (2, SEQ))
    model(idx, idx)
    assert model.aux_loss().item() == pytest.approx(DEBUG.experts_per_token, rel=1e-6)
    a, b = _built(DEBUG), FAMILY.build(DEBUG, activation_checkpointing=True)
    b.load_state_dict(a.state_dict())
    for m in (a, b):
        m.train()
        m(idx, idx)[1].backward()
    n = 2 * moe_forward_terms(DEBUG, SEQ) + 2 * SEQ
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert_close_sums(pb.grad, pa.grad, n_terms=n, msg=name)
    router = a.layers[1].mlp.router.weight
    coef_off = _built(replace(DEBUG, router_aux_loss_coef=0.0))
    coef_off(idx, idx)[1].backward()
    assert not torch.equal(coef_off.layers[1].mlp.router.weight.grad, router.grad)  # the aux loss reaches the router


def test_bad_shapes_are_one_line_errors():
    base = dict(n_layers=2, hidden_size=64, n_heads=4, n_kv_heads=2, n_experts=4, experts_per_token=2,
                expert_ffn_hidden_size=32)
    for bad, words in ((dict(experts_per_token=5), "experts_per_token 5 is above n_experts 4"),
                       (dict(dense_layers=(2,)), "dense_layers \\[2\\] must be distinct layer indices"),
                       (dict(dense_layers=(0,)), "need a positive ffn_hidden_size"),
                       (dict(n_kv_heads=3), "not a multiple of n_kv_heads"),
                       (dict(qk_norm="rms"), "qk_norm 'rms' is not one of"),
                       (dict(expert_kernel="triton"), "expert_kernel 'triton' is not one of"),
                       (dict(hidden_size=62), "not a multiple of n_heads")):
        with pytest.raises(ValueError, match=words) as exc:
            MoEConfig(**{**base, **bad})
        assert "\n" not in str(exc.value)
    with pytest.raises(ParameterError, match="'n_experts' is not one the moe family has"):
        get_config("moe-debug", n_experts=4)
    with pytest.raises(ValueError, match="MixtralForCausalLM has no model with dense layers"):
        FAMILY.hf_config(replace(MIXTRAL, dense_layers=(0,), ffn_hidden_size=64))
    assert MoEConfig(**base, head_dim=32).head_dim == 32  # Qwen3's decoupled head width
    from accel_kit.models.moe.hf import config_from_hf

    stepped = FAMILY.hf_config(replace(DEBUG, n_layers=4, dense_layers=(0,)))
    stepped.decoder_sparse_step = 2  # Qwen3-MoE: layers 1 and 3 sparse, 0 listed dense, 2 off the step
    assert config_from_hf(stepped).dense_layers == (0, 2)


def test_shape_record_and_kernel_choice():
    from accel_kit.devices import get_adapter

    overrides = FAMILY.kernel_overrides(get_adapter("cpu"), torch.float32)
    assert overrides == {"expert_kernel": "grouped_mm"}  # runs on every CPU torch builds it for
    cfg = get_config("qwen3-30b-a3b", **overrides)
    record = FAMILY.shape(cfg).record()
    assert {k: record[k] for k in ("family", "n_experts", "experts_per_token", "expert_ffn_hidden_size",
                                   "n_shared_experts", "n_moe_layers", "expert_kernel")} == {
        "family": "moe", "n_experts": 128, "experts_per_token": 8, "expert_ffn_hidden_size": 768,
        "n_shared_experts": 0, "n_moe_layers": 48, "expert_kernel": "grouped_mm"}
    model = _built(replace(DEBUG, expert_kernel="loop"))
    assert FAMILY.ran_fields(model) == {}  # nothing ran yet: the shape's answer stands
    model(torch.randint(0, 512, (1, 8)))
    # what ran replaces the shape's answer in the record, found through a wrapper as under DDP
    assert model.expert_kernel_ran() == "loop" and FAMILY.ran_fields(torch.nn.Sequential(model)) == {
        "expert_kernel": "loop"}
    imbalance = model.load_imbalance()  # 16 routed copies over 8 experts in each of the two MoE layers
    assert len(imbalance) == 2 and all(1.0 <= r <= 8.0 for r in imbalance)
    assert FAMILY.layer_weight_count(DEBUG) == 64 * 128 + 64 * 64 + 64 * 8 + 8 * 3 * 64 * 32
    names = [name for name, _ in FAMILY.prunable_linears(model)]
    assert "layers.1.mlp.router" not in names and "layers.0.mlp.gate_up_proj" in names
    assert math.isclose(FAMILY.activation_bytes_per_layer(DEBUG, 1, SEQ, flash_attention=True, tp=1),
                        FAMILY.activation_bytes_per_layer(DEBUG, 1, SEQ, flash_attention=True), rel_tol=0)


def test_activation_bytes_are_what_a_moe_layer_keeps():
    """The memory formula against the tensors autograd keeps for one bf16 MoE layer's backward (weights and RoPE
    tables aside; the layer's input counted, as the first norm keeps it), as tests/test_llama.py checks Llama's."""
    from accel_kit.models.moe.experts import grouped_mm_runs

    if not grouped_mm_runs("cpu", torch.bfloat16):  # tried here, outside the hooks below
        pytest.skip("torch._grouped_mm does not run in bf16 on this CPU")
    cfg = replace(DEBUG, expert_kernel="grouped_mm")
    layer = FAMILY.build_layer(cfg).to(torch.bfloat16)
    not_activations = {t.untyped_storage().data_ptr() for t in [*layer.parameters(), *layer.buffers()]}
    kept: dict[int, int] = {}  # storage -> bytes: views of one tensor count once

    def pack(t):
        if t.untyped_storage().data_ptr() not in not_activations:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    x = torch.randn(2, SEQ, cfg.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    # CPU SDPA runs its flash kernel for a causal bf16 attention with no mask
    assert sum(kept.values()) == FAMILY.activation_bytes_per_layer(cfg, 2, SEQ, flash_attention=True)


def test_grouped_experts_run_in_autocasts_dtype():
    torch.manual_seed(0)
    experts = _experts(4, 64, 32, "grouped_mm")  # fp32 weights, as mixed precision keeps them
    counts, x = torch.tensor([3, 5, 0, 8]), torch.randn(16, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = experts.forward_sorted(x, counts)
    assert y.dtype == torch.bfloat16  # the products in bf16, as autocast runs a linear's
    reference = _experts(4, 64, 32, "loop")
    reference.load_state_dict(experts.state_dict())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        # both in bf16: one bf16 rounding of each product apart at most (rtol), and the fp32 sums' orders (atol)
        assert_close_sums(y, reference.forward_sorted(x, counts), n_terms=64 + 32, accumulate=torch.float32)


def test_a_training_record_carries_both_counts_the_experts_and_active_flops():
    from accel_kit import metrics
    from accel_kit.engine.point import TrainPoint
    from accel_kit.engine.worker import run_point

    point = TrainPoint(system="cpu", preset="moe-debug", precision="fp32", micro_batch_size=2, seq_len=32, steps=2,
                       warmup_steps=1)
    result = run_point(point, rank=0, world=1, local_rank=0)
    assert result["status"] == "ok", result.get("reason")
    m = result["metrics"]
    assert not metrics.undeclared(m), metrics.undeclared(m)
    cfg = get_config("moe-debug", seq_len=32)
    assert (m["n_params"], m["n_params_active"]) == (count_params("moe-debug"), count_active_params("moe-debug"))
    assert {k: m[k] for k in ("n_experts", "experts_per_token", "expert_ffn_hidden_size", "n_moe_layers",
                              "expert_kernel")} == {"n_experts": 8, "experts_per_token": 2,
                                                    "expert_ffn_hidden_size": 32, "n_moe_layers": 2,
                                                    "expert_kernel": "grouped_mm"}
    assert m["flops_per_token"] == FAMILY.flop_terms(cfg, 32).total()
    # the active weights' FLOPs: fewer than every expert's by 6 per skipped weight
    assert m["flops_per_token"] + 6 * FAMILY.inactive_weight_count(cfg) == FAMILY.flop_terms(
        replace(cfg, experts_per_token=cfg.n_experts), 32).total()
