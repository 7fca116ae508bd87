"""transformers' mixture-of-experts architectures through ``-p preset hf:PATH``: FLOPs of the active experts,
the expert fields and active weights, training in fp32 and bf16, the studies and the predictor.

The configs are tiny ones the tests write with transformers' classes (``hf_configs``)."""
from __future__ import annotations

import math

import pytest
import torch

from accel_kit import cli
from accel_kit.models import count_active_params, count_params, family_of, get_config
from accel_kit.models.hf.family import _structure
from hf_configs import H, HEAD_DIM, HEADS, LAYERS, MOE_ARCHITECTURES, VOCAB, active_weights, moe_config, write

# (routed experts, top-k, expert width, shared experts, MoE layers) of each tiny config, by hand
EXPERTS = {"mixtral": (4, 2, 96, 0, 2), "qwen2_moe": (8, 2, 32, 2, 2), "qwen3_moe": (8, 2, 32, 0, 2),
           "olmoe": (8, 2, 32, 0, 2), "deepseek_v3": (8, 2, 32, 1, 1), "gpt_oss": (4, 2, 32, 0, 2)}


@pytest.mark.parametrize("name", MOE_ARCHITECTURES)
def test_the_count_is_of_the_active_experts(tmp_path, name):
    """Counted on fake tensors, no crash on the routing: per token forward, 2 x the weights a token multiplies
    (attention projections, router, top-k experts, shared experts, dense layers) exactly (the counter counts
    every product, 2 per multiply-add, and no bias), the attention over the full score matrix, backward twice."""
    hf = moe_config(name)
    preset = write(tmp_path / name, hf)
    cfg = get_config(preset, seq_len=32)
    family = family_of(cfg)
    terms = family.flop_terms(cfg, 32, micro_batch=2)
    assert family.flops_source(cfg, 32, micro_batch=2) == "counted"
    assert terms.matmul == 2 * active_weights(name, hf)
    qk, v = ((hf.qk_nope_head_dim + hf.qk_rope_head_dim, hf.v_head_dim) if name == "deepseek_v3"
             else (HEAD_DIM, HEAD_DIM))
    assert terms.attention == LAYERS * 2 * 32 * HEADS * (qk + v)  # Q K^T and P V over 32 keys, every head
    assert (terms.logits, terms.backward) == (2 * H * VOCAB, 2 * terms.forward)

    n_experts, top_k, width, _, moe_layers = EXPERTS[name]
    shape = family.shape(cfg)
    assert (shape.n_experts, shape.experts_per_token, shape.expert_ffn_hidden_size, shape.n_shared_experts,
            shape.n_moe_layers) == EXPERTS[name]
    assert _structure(cfg).experts_seen == (n_experts, width, moe_layers)  # the table agrees with the model
    one_expert = 3 * H * width + (2 * width + H if name == "gpt_oss" else 0)  # gpt-oss: biased gate_up and down
    assert count_params(preset) - count_active_params(preset) == moe_layers * (n_experts - top_k) * one_expert


def test_an_architecture_off_the_table_has_its_experts_read_off_its_model(tmp_path):
    """Granite-MoE (not in ``hf.moe``'s table, its experts behind transformers' interface): experts, width and
    MoE layers from its experts modules, top-k from the config; counted on its active experts."""
    from transformers import GraniteMoeConfig

    hf = GraniteMoeConfig(hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=2,
                          vocab_size=VOCAB, max_position_embeddings=64, intermediate_size=32, num_local_experts=4,
                          num_experts_per_tok=2, bos_token_id=0, eos_token_id=1, pad_token_id=None)
    preset = write(tmp_path / "granitemoe", hf)
    cfg = get_config(preset, seq_len=32)
    family = family_of(cfg)
    shape = family.shape(cfg)
    assert (shape.n_experts, shape.experts_per_token, shape.expert_ffn_hidden_size, shape.n_moe_layers) == (4, 2, 32, 2)
    assert count_params(preset) - count_active_params(preset) == LAYERS * 2 * 3 * H * 32
    q, kv = HEADS * HEAD_DIM, 2 * HEAD_DIM
    assert family.flop_terms(cfg, 32).matmul == 2 * LAYERS * (2 * H * q + 2 * H * kv + H * 4 + 2 * 3 * H * 32)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_moe_config_trains_in_fp32_and_bf16(tmp_path, precision):
    """transformers' grouped experts where the widths are 16-byte aligned, its batched ones where they are not
    (torch's CPU grouped product refuses such strides): both train, in fp32 and in bf16."""
    from accel_kit.data import SyntheticBatches
    from accel_kit.engine.step import OptimConfig, Trainer, cast_for_precision
    from accel_kit.models import build_model

    for width, kernel in ((32, "grouped_mm"), (36, "batched_mm")):
        preset = write(tmp_path / str(width), moe_config("qwen3_moe", moe_intermediate_size=width))
        torch.manual_seed(0)
        model = build_model(preset, seq_len=16)
        assert model.model.config._experts_implementation == kernel
        model = cast_for_precision(model, precision)
        trainer = Trainer(model, iter(SyntheticBatches(VOCAB, 16, 2, seed=0)), torch.device("cpu"), precision, 1,
                          OptimConfig(warmup_steps=1))
        assert all(math.isfinite(trainer.step()) for _ in range(2))


@pytest.mark.slow
@pytest.mark.parametrize(("name", "precision"), [("mixtral", "fp32"), ("deepseek_v3", "bf16")])
def test_gas_and_scaling_smoke_run_ok_with_the_active_flops(tmp_path, name, precision):
    from accel_kit.metrics import undeclared
    from accel_kit.studies import run_study

    preset = write(tmp_path / name, moe_config(name))
    records = []
    for study, axes in (("gas", {"micro_batch_sizes": [1]}), ("scaling", {"device_counts": [1]})):
        run = run_study(study, "cpu", "smoke", output_dir=tmp_path / "out", progress=False, preset=preset,
                        data="synthetic", precision=precision, **axes)
        records += list(run.records if hasattr(run, "records") else run)
    assert len(records) == 3
    for rec in records:
        m = rec["metrics"]
        assert rec["status"] == "ok", rec.get("reason")
        assert (m["family"], m["flops_source"], m["n_experts"]) == ("hf", "counted", EXPERTS[name][0])
        assert m["n_params_active"] < m["n_params"]
        cfg = get_config(preset, seq_len=rec["params"]["seq_len"], vocab_size=rec["params"]["vocab_size"])
        counted = family_of(cfg).flop_terms(cfg, cfg.seq_len, micro_batch=rec["params"]["micro_batch_size"])
        assert m["flops_per_token"] == counted.total()
        assert not undeclared(m)


def test_the_predictor_takes_an_hf_preset(tmp_path, capsys):
    """``accel-kit predict --preset hf:PATH/config.json``: predicted from the datasheet, on the counted FLOPs; its
    records are learnt from while their config file is there."""
    from accel_kit.predict import resolve_params, what_if

    preset = write(tmp_path / "qwen3_moe", moe_config("qwen3_moe"))
    file_preset = preset + "/config.json"
    records = tmp_path / "records"
    records.mkdir()
    assert cli.main(["predict", "--system", "a100", "--preset", file_preset, "-p", "seq_len", "32",
                     "--records", str(records)]) == 0
    assert file_preset in capsys.readouterr().out
    run = what_if("a100", resolve_params(None, {"preset": file_preset, "seq_len": 32, "records": [str(records)]}))
    cfg = get_config(file_preset, seq_len=32)
    assert run.predictions[0].shape.flop_terms == family_of(cfg).flop_terms(cfg, 32)

    # Its records are learnt from while the file is there; moved away (records travel), they are left out.
    from accel_kit.predict.records import usable

    from accel_kit.results import Record

    record = Record(record_id="r", study="scaling", system="cpu", kind="train", status="ok", run_id="r",
                    params={"kind": "train", "preset": file_preset}, metrics={"step_time_s": 0.1})
    assert usable(record)
    (tmp_path / "qwen3_moe" / "config.json").unlink()
    assert not usable(record)


def test_experts_the_count_cannot_see_are_one_line(tmp_path):
    """JetMoE's experts (outside transformers' experts interface) loop over the experts a batch reaches: on fake
    tensors that is a shape no one knows, said in one line rather than as torch's traceback."""
    from transformers import JetMoeConfig

    from accel_kit.errors import ParameterError

    preset = write(tmp_path / "jetmoe", JetMoeConfig(hidden_size=H, num_hidden_layers=1, num_key_value_heads=2,
                                                     kv_channels=HEAD_DIM, vocab_size=VOCAB, max_position_embeddings=64,
                                                     num_local_experts=4, num_experts_per_tok=2, intermediate_size=32,
                                                     bos_token_id=0, eos_token_id=1))
    cfg = get_config(preset, seq_len=16)
    with pytest.raises(ParameterError, match="cannot be counted on fake tensors: an operation's shape depends"):
        family_of(cfg).flop_terms(cfg, 16)
