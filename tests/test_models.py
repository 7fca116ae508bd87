import pytest
import torch

from accel_kit.errors import ParameterError
from accel_kit.models import (IGNORE_INDEX, PRESETS, build_model, count_params, estimate_training_memory, fits,
                              get_config)
from accel_kit.models.gpt2.hf import from_hf, to_hf
from numerics import assert_close_sums, eps, gpt_forward_terms



@pytest.mark.parametrize("preset, published", [
    ("gpt2-small", 124_439_808),   # transformers' GPT2LMHeadModel("gpt2"), tied embeddings
    ("gpt2-medium", 354_823_168),
    ("gpt2-large", 774_030_080),
    ("gpt2-xl", 1_557_611_200),
])
def test_gpt2_counts_exact(preset, published):
    assert count_params(preset) == published


@pytest.mark.parametrize("preset, nominal, rel", [
    ("gpt3-xl", 1.3e9, 0.02), ("gpt3-6.7b", 6.7e9, 0.01), ("gpt3-13b", 13e9, 0.02), ("gpt3-30b", 30e9, 0.01),
    ("genslm-25m", 25e6, 0.06), ("genslm-250m", 250e6, 0.04), ("genslm-2.5b", 2.5e9, 0.01),
    ("genslm-25b", 25e9, 0.02), ("gpt2-13b", 13e9, 0.02), ("genslm-gpt3-xl", 1.2e9, 0.03),
])
def test_published_sizes(preset, nominal, rel):
    # Not a rounding tolerance: papers quote round sizes ("1.3B"); rel is how far that figure is
    # from the exact count of the published architecture.
    assert count_params(preset) == pytest.approx(nominal, rel=rel)


def test_count_needs_no_memory():
    # 25B parameters would be 100 GB in fp32; counting happens on the meta device.
    assert count_params("genslm-25b") > 25e9


def test_overrides_and_padding():
    assert get_config("gpt2-small", vocab_size=50260).vocab_size == 50260
    cfg = get_config("gpt2-small", pad_vocab_multiple=64)
    assert cfg.padded_vocab_size == 50304
    assert count_params("gpt2-small", pad_vocab_multiple=64) == 124_439_808 + (50304 - 50257) * 768
    with pytest.raises(ParameterError, match="unknown model preset"):
        get_config("gpt5")
    with pytest.raises(ParameterError, match="n_layers"):
        get_config("gpt2-small", n_layers=3)


def test_every_preset_has_a_debug_sibling_family():
    assert {"gpt2-debug", "genslm-debug"} <= set(PRESETS)
    assert PRESETS["genslm-gpt3-xl"].vocab_size == 70 and PRESETS["genslm-gpt3-xl"].seq_len == 10240
    assert PRESETS["gpt2-13b"].vocab_size == 71


def test_forward_loss_and_ignore_index():
    torch.manual_seed(0)
    model = build_model("genslm-debug", seq_len=32)
    idx = torch.randint(0, 71, (2, 32))
    targets = torch.randint(0, 71, (2, 32))
    logits, loss = model(idx, targets)
    assert logits.shape == (2, 32, 71)
    # Not a rounding bound: small random initial weights give near-uniform predictions, whose loss
    # is log(vocab); 10% leaves room for the logits' spread at init (std 0.02 weights).
    assert loss.item() == pytest.approx(torch.log(torch.tensor(71.0)).item(), rel=0.1)
    targets[:, 16:] = IGNORE_INDEX
    _, half = model(idx, targets)
    ref = torch.nn.functional.cross_entropy(logits[:, :16].reshape(-1, 71), targets[:, :16].reshape(-1))
    # The same positive terms summed in another order: a log-sum-exp over the 71 logits, then
    # the mean over the 2 x 16 kept targets (numerics.py: eps x n x magnitude, no cancellation).
    assert half.item() == pytest.approx(ref.item(), rel=eps(torch.float32) * (71 + 2 * 16))
    with pytest.raises(ValueError, match="longer than"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_activation_checkpointing_same_gradients():
    torch.manual_seed(0)
    a = build_model("gpt2-debug", seq_len=16, vocab_size=128)
    b = build_model("gpt2-debug", seq_len=16, vocab_size=128, activation_checkpointing=True)
    b.load_state_dict(a.state_dict())
    idx = torch.randint(0, 128, (2, 16))
    for m in (a, b):
        m.train()
        m(idx, idx)[1].backward()
    # The recomputed forward runs the same kernels; only the order in which a shared weight's
    # gradient contributions arrive may change (the tied embedding): bound it like any reordering.
    n = 2 * gpt_forward_terms(a.cfg, 16) + 2 * 16
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert_close_sums(pb.grad, pa.grad, n_terms=n, msg=name)


def test_hf_logits_match_both_ways():
    torch.manual_seed(0)
    ours = build_model("gpt2-debug", seq_len=32).eval()
    hf = to_hf(ours).eval()
    idx = torch.randint(0, 50257, (2, 32))
    n = gpt_forward_terms(ours.cfg, 32)  # same math, transformers' kernels and summation orders
    with torch.no_grad():
        ref = hf(idx).logits
        assert_close_sums(ours(idx)[0], ref, n_terms=n)
        back = from_hf(hf).eval()
        assert_close_sums(back(idx)[0], ref, n_terms=n)


def test_memory_estimate_and_fit():
    cfg = get_config("gpt2-xl")
    n = count_params("gpt2-xl")
    est = estimate_training_memory(cfg, n, micro_batch=16, seq_len=1024, precision="bf16")
    assert est.weights_bytes == 6 * n and est.optimizer_bytes == 8 * n
    assert 24 * 2**30 < est.total_bytes < 141 * 2**30
    assert fits(est, 141 * 2**30) and not fits(est, 16 * 2**30) and fits(est, None)
    ckpt = estimate_training_memory(cfg, n, micro_batch=16, seq_len=1024, precision="bf16",
                                    activation_checkpointing=True)
    assert ckpt.activations_bytes < est.activations_bytes / 10
    no_flash = estimate_training_memory(cfg, n, 16, 1024, "bf16", flash_attention=False)
    assert no_flash.activations_bytes > est.activations_bytes
    assert "GiB" in est.describe()
