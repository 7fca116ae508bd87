"""The Llama 3 family: published sizes, the FFN width rule, transformers equivalence (logits, one
layer's gradients, eight AdamW steps), RoPE scaling, bad shapes, FLOP and memory accounting."""
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from accel_kit.errors import ParameterError
from accel_kit.models.llama import FAMILY, IGNORE_INDEX, PRESETS, LlamaConfig, RopeScaling, llama3_ffn_width
from accel_kit.models.llama.hf import from_hf, hf_config, state_map, to_hf
from accel_kit.models.common.rope import rope_tables
from numerics import assert_close_sums, engine_adamw, eps

DEBUG = PRESETS["llama3-debug"]
SEQ = 32  # tokens per test sequence (the debug context is 256)


def llama_forward_terms(cfg: LlamaConfig, seq_len: int, n_layers: int | None = None) -> int:
    """Terms summed along the longest path of a Llama forward (a chain: the stages' lengths add up).

    Per layer RMSNorm (h), qkv (h), scores (head_dim), softmax and the weighted values (2 T),
    o_proj (n_heads head_dim = h), RMSNorm (h), gate/up (h), down (ffn); then the final RMSNorm
    and the LM head (h each). A backward runs as many again.
    """
    h = cfg.hidden_size
    per_layer = 5 * h + cfg.head_dim + 2 * seq_len + cfg.ffn_hidden_size
    return (cfg.n_layers if n_layers is None else n_layers) * per_layer + 2 * h


def _meta_count(cfg: LlamaConfig) -> int:
    with torch.device("meta"):  # no allocation: 405B parameters would be 1.6 TB in fp32
        return FAMILY.build(cfg).num_params()


@pytest.mark.parametrize("preset, published", [
    ("llama3.2-1b", 1_235_814_400),   # tied embeddings
    ("llama3.2-3b", 3_212_749_824),   # tied
    ("llama3.1-8b", 8_030_261_248),
    ("llama3.1-70b", 70_553_706_496),
    ("llama3.1-405b", 405_853_388_800),
])
def test_published_counts_exact(preset, published):
    cfg = PRESETS[preset]
    # The same count by hand: per layer q, o (h x nh hd), k, v (h x nkv hd), gate, up, down
    # (h x ffn) and two norms (h); the final norm; the embedding, and the head when untied.
    h, q, kv, f = cfg.hidden_size, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.ffn_hidden_size
    layer = 2 * h * q + 2 * h * kv + 3 * h * f + 2 * h
    by_hand = cfg.n_layers * layer + h + (1 if cfg.tie_embeddings else 2) * cfg.vocab_size * h
    assert by_hand == published
    assert _meta_count(cfg) == published


def test_release_shapes():
    shapes = {name: (c.n_layers, c.hidden_size, c.n_heads, c.n_kv_heads, c.ffn_hidden_size, c.tie_embeddings)
              for name, c in PRESETS.items() if name.startswith("llama3.")}
    assert shapes == {"llama3.2-1b": (16, 2048, 32, 8, 8192, True), "llama3.2-3b": (28, 3072, 24, 8, 8192, True),
                      "llama3.1-8b": (32, 4096, 32, 8, 14336, False), "llama3.1-70b": (80, 8192, 64, 8, 28672, False),
                      "llama3.1-405b": (126, 16384, 128, 8, 53248, False)}
    for name, c in PRESETS.items():
        assert name in FAMILY.sources and c.vocab_size == (512 if name == "llama3-debug" else 128256)
        if name.startswith("llama3."):  # the released ones (llama3-debug and llama3-small are ours)
            assert (c.seq_len, c.rope_theta, c.rms_norm_eps) == (131072, 500000.0, 1e-5)
            assert c.rope_scaling == RopeScaling(factor=32.0 if name.startswith("llama3.2") else 8.0)
            assert c.head_dim == (64 if name == "llama3.2-1b" else 128)


@pytest.mark.parametrize("hidden, multiplier, multiple_of, width", [
    (4096, 1.3, 1024, 14336), (8192, 1.3, 4096, 28672), (16384, 1.2, 4096, 53248),
    (2048, 1.5, 256, 8192), (3072, 1.0, 256, 8192),
])
def test_ffn_width_rule(hidden, multiplier, multiple_of, width):
    assert llama3_ffn_width(hidden, multiplier, multiple_of) == width


def test_hf_round_trip_logits_and_weights():
    torch.manual_seed(0)
    for cfg in (DEBUG, replace(DEBUG, tie_embeddings=False, rope_scaling=None)):
        ours = FAMILY.build(cfg).eval()
        hf = to_hf(ours).eval()
        assert type(hf).__name__ == FAMILY.hf_model_class
        assert hf.config._attn_implementation == "sdpa" and hf.config.num_key_value_heads == cfg.n_kv_heads
        idx = torch.randint(0, cfg.vocab_size, (2, SEQ))
        with torch.no_grad():
            ref = hf(idx).logits
            # Same math, transformers' kernels and summation orders (numerics.py)
            assert_close_sums(ours(idx)[0], ref, n_terms=llama_forward_terms(cfg, SEQ))
        back = from_hf(hf)
        assert back.cfg == cfg and back.num_params() == ours.num_params()
        for (name, a), b in zip(ours.state_dict().items(), back.state_dict().values()):
            assert torch.equal(a, b), name
        assert (back.lm_head.weight is back.embed_tokens.weight) == cfg.tie_embeddings


def test_layer_matches_transformers_forward_and_backward():
    torch.manual_seed(0)
    ours = FAMILY.build_layer(DEBUG, "native")
    theirs = FAMILY.build_layer(DEBUG, "hf")
    theirs.layer.load_state_dict(state_map(DEBUG).layer_names(ours.state_dict()))
    x = torch.randn(2, SEQ, DEBUG.hidden_size)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ours(xa), theirs(xb)
    n_forward = llama_forward_terms(DEBUG, SEQ, n_layers=1)
    assert_close_sums(ya, yb, n_terms=n_forward)
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    # Backward: as many terms again; weight gradients sum over the 2 x SEQ tokens besides.
    n_backward = 2 * n_forward + 2 * SEQ
    assert_close_sums(xa.grad, xb.grad, n_terms=n_backward)
    ours_grads = state_map(DEBUG).layer_names({n: p.grad for n, p in ours.named_parameters()})
    theirs_grads = {n: p.grad for n, p in theirs.layer.named_parameters()}
    assert ours_grads.keys() == theirs_grads.keys()
    for name, grad in theirs_grads.items():
        assert_close_sums(ours_grads[name], grad, n_terms=n_backward, msg=name)


def test_training_matches_transformers_for_eight_steps():
    torch.manual_seed(0)
    ours = FAMILY.build(DEBUG).train()
    hf = to_hf(ours).train()
    # Two batches in turn: the loss on each falls as the model learns it (random tokens have nothing else).
    batches = torch.randint(0, DEBUG.vocab_size, (2, 2, SEQ + 1))
    runs = []
    for model, loss_of in ((ours, lambda x, y: ours(x, y)[1]),
                           # transformers' own loss shifts its labels; ours takes shifted targets, so the
                           # same cross-entropy is taken over its logits.
                           (hf, lambda x, y: F.cross_entropy(hf(x).logits.float().flatten(0, 1), y.flatten()))):
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
    assert runs[0][-2] < runs[0][0] and runs[0][-1] < runs[0][1]  # it trains
    # Not a derived rounding bound but the family's acceptance bound, stricter than numerics.py's
    # for one forward (eps32 x the forward's ~1000 terms, ~1e-4): the two runs must not drift apart
    # at all over the steps. Measured ~2e-7 on an AVX-512 CPU.
    for step, (a, b) in enumerate(zip(*runs)):
        assert abs(a - b) / abs(b) < 1e-5, f"step {step}: ours {a}, transformers {b}"


def test_bad_shapes_are_one_line_errors():
    base = dict(n_layers=1, hidden_size=64, ffn_hidden_size=128)
    for bad, words in ((dict(n_heads=4, n_kv_heads=3), "not a multiple of n_kv_heads"),
                       (dict(n_heads=5, n_kv_heads=5), "not a multiple of n_heads"),
                       (dict(hidden_size=60, n_heads=4, n_kv_heads=2), "is odd; RoPE rotates pairs"),
                       (dict(n_heads=4, n_kv_heads=2, dropout=0.1), "no dropout")):
        with pytest.raises(ValueError, match=words) as exc:
            LlamaConfig(**{**base, **bad})
        assert "\n" not in str(exc.value)
    with pytest.raises(ParameterError, match="'n_layers' is not one the llama family has"):
        FAMILY.with_overrides(DEBUG, n_layers=3)
    with pytest.raises(ParameterError, match="seq_len must be a positive integer"):
        FAMILY.with_overrides(DEBUG, seq_len=0)
    cfg = FAMILY.with_overrides(DEBUG, seq_len=64, vocab_size=500, pad_vocab_multiple=64)
    assert (cfg.seq_len, cfg.padded_vocab_size, FAMILY.shape(cfg).vocab_size_model) == (64, 512, 512)


def test_flops_count_the_module_structure():
    model = FAMILY.build(DEBUG)
    s = DEBUG.seq_len
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]  # the lm_head too, tied or not
    assert len(linears) == 4 * DEBUG.n_layers + 1
    by_structure = sum(2 * m.weight.numel() for m in linears) + DEBUG.n_layers * 4 * s * DEBUG.n_heads * DEBUG.head_dim
    assert FAMILY.flop_terms(DEBUG, s).total() == 3 * by_structure
    block_linears = sum(m.weight.numel() for _, m in FAMILY.prunable_linears(model))
    assert block_linears == DEBUG.n_layers * FAMILY.layer_weight_count(DEBUG)
    assert sum(2 * m * k * n for m, k, n in FAMILY.gemm_shapes(DEBUG, 1)) == FAMILY.layer_flop_terms(DEBUG, s).matmul


def test_flops_against_torchtitan_for_8b():
    # torchtitan (models/utils.py, get_dense_model_nparams_and_flops): 6 (N - embedding) + 12 L H Q T
    # per token, N every parameter. Its N - embedding holds the untied output projection (our 6 h V
    # logits term) and the block linears (our matmul term), and besides the RMSNorm weights,
    # (2L + 1) h, which we do not count as matrix products: exactly that much apart.
    cfg = PRESETS["llama3.1-8b"]
    L, h, seq = cfg.n_layers, cfg.hidden_size, 8192
    n = _meta_count(cfg)
    torchtitan = 6 * (n - cfg.vocab_size * h) + 12 * L * cfg.n_heads * cfg.head_dim * seq
    assert FAMILY.flop_terms(cfg, seq).total() == torchtitan - 6 * (2 * L + 1) * h


def test_rope_beyond_the_original_context_matches_transformers():
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    # Llama 3.1 8B's RoPE (head dim 128, factor 8 beyond 8192 positions) out to 20000 positions.
    cfg = replace(PRESETS["llama3.1-8b"], n_layers=1, seq_len=20000)
    cos, sin = rope_tables(cfg)
    positions = torch.arange(cfg.seq_len)[None]
    hf_cos, hf_sin = LlamaRotaryEmbedding(hf_config(cfg))(torch.zeros(1, dtype=torch.float32), positions)
    half = cfg.head_dim // 2
    for ours, theirs in ((cos, hf_cos[0]), (sin, hf_sin[0])):
        # One fp32 product and one cos/sin each, both sides (numerics.py: one term of magnitude 1).
        assert_close_sums(ours, theirs[:, :half], n_terms=1, magnitude=1.0)
        assert_close_sums(ours, theirs[:, half:], n_terms=1, magnitude=1.0)
    # the scaling is on: the lowest frequency turns 8 times slower than plain RoPE's
    plain = rope_tables(replace(cfg, rope_scaling=None, seq_len=2))
    assert math.atan2(sin[1, -1], cos[1, -1]) == pytest.approx(math.atan2(plain[1][1, -1], plain[0][1, -1]) / 8)


def test_meta_build_then_materialise_recomputes_rope():
    torch.manual_seed(0)
    with torch.device("meta"):
        meta = FAMILY.build(DEBUG)
    assert meta.layers[0].self_attn.rope_cos.is_meta
    ref = FAMILY.build(DEBUG)
    real = meta.to_empty(device="cpu")
    real.load_state_dict(ref.state_dict())  # the weights only: the tables are not in it
    real.reset_buffers()
    idx = torch.randint(0, DEBUG.vocab_size, (1, SEQ))
    with torch.no_grad():
        assert torch.equal(real(idx)[0], ref(idx)[0])


def test_forward_loss_ignore_index_and_checkpointing():
    torch.manual_seed(0)
    a = FAMILY.build(DEBUG)
    b = FAMILY.build(DEBUG, activation_checkpointing=True)
    b.load_state_dict(a.state_dict())
    idx, targets = torch.randint(0, 512, (2, SEQ)), torch.randint(0, 512, (2, SEQ))
    logits, loss = a(idx, targets)
    # Not a rounding bound: std-0.02 initial weights give near-uniform predictions, loss about log V.
    assert loss.item() == pytest.approx(math.log(512), rel=0.1)
    targets[:, SEQ // 2:] = IGNORE_INDEX
    _, half = a(idx, targets)
    ref = F.cross_entropy(logits[:, : SEQ // 2].reshape(-1, 512), targets[:, : SEQ // 2].reshape(-1))
    assert half.item() == pytest.approx(ref.item(), rel=eps(torch.float32) * (512 + SEQ))
    for m in (a, b):
        m(idx, idx)[1].backward()
    n = 2 * llama_forward_terms(DEBUG, SEQ) + 2 * SEQ
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert_close_sums(pb.grad, pa.grad, n_terms=n, msg=name)
    with pytest.raises(ValueError, match="longer than"):
        a(torch.zeros(1, DEBUG.seq_len + 1, dtype=torch.long))


def test_family_structure_and_memory():
    model = FAMILY.build(DEBUG)
    stages = FAMILY.pipeline_stages(model)
    assert all(hasattr(model, name) for name in stages.embedding + stages.head + (stages.blocks,))
    names = [name for name, _ in FAMILY.prunable_linears(model)]
    assert names[:4] == ["layers.0.self_attn.qkv_proj", "layers.0.self_attn.o_proj", "layers.0.mlp.gate_up_proj",
                         "layers.0.mlp.down_proj"]
    assert FAMILY.shape(DEBUG).record()["family"] == "llama" and FAMILY.shape(DEBUG).attention.n_kv_heads == 2
    # weights only: the RoPE tables are non-persistent buffers (the tied head is listed under both names)
    assert list(model.state_dict()) == [k for k, _ in model.named_parameters(remove_duplicate=False)]
    # Memory, by hand for the 8B at b 1, s 4096: 8sbh + 4sb(dq + dkv) + 8sbf + 8sb, + 4 a s b (flash).
    cfg, s = PRESETS["llama3.1-8b"], 4096
    by_hand = s * (8 * 4096 + 4 * (4096 + 1024) + 8 * 14336 + 8) + 4 * 32 * s
    assert FAMILY.activation_bytes_per_layer(cfg, 1, s, flash_attention=True) == by_hand
    assert FAMILY.activation_bytes_per_layer(cfg, 1, s, flash_attention=False) == by_hand - 4 * 32 * s + 2 * 32 * s * s
    with pytest.raises(ValueError, match="impl"):
        FAMILY.build_layer(DEBUG, "jax")


def test_the_family_imports_no_upper_layer():
    from test_imports import import_graph

    graph = import_graph()
    reached, todo = set(), [m for m in graph if m.startswith("accel_kit.models.llama")]
    while todo:  # everything the family's modules import, transitively
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo.extend(graph[module])
    upper = ("accel_kit.engine", "accel_kit.studies", "accel_kit.devices")
    assert not [m for m in reached if m.startswith(upper)]


def test_activation_bytes_are_what_a_layer_keeps():
    """The memory formula against the tensors autograd actually keeps for one bf16 layer's backward
    (weights and RoPE tables aside; the layer's input counted, as the first norm keeps it)."""
    layer = FAMILY.build_layer(DEBUG).to(torch.bfloat16)
    not_activations = {t.untyped_storage().data_ptr() for t in [*layer.parameters(), *layer.buffers()]}
    kept: dict[int, int] = {}  # storage -> bytes: views of one tensor count once

    def pack(t):
        if t.untyped_storage().data_ptr() not in not_activations:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    x = torch.randn(2, SEQ, DEBUG.hidden_size, dtype=torch.bfloat16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    # CPU SDPA runs its flash kernel for a causal bf16 attention with no mask
    assert sum(kept.values()) == FAMILY.activation_bytes_per_layer(DEBUG, 2, SEQ, flash_attention=True)
