"""Models built where they run, in the precision they run in (``accel_kit.models.materialize``, issue 40): no host
copy, no fp32 copy of a 16-bit model, a seeded fp32 build bit for bit the host's; each parameter drawn from the
seed and its name alone (``accel_kit.models.init``), so threads, depth and sharding do not change its values."""
import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from accel_kit.models import building_on, family_of, get_config, materialize
from accel_kit.models.init import allocate, init_parameters

SMALL = ("gpt2-debug", "llama3-debug", "moe-debug")


@pytest.mark.parametrize("preset", SMALL)
def test_an_fp32_build_is_the_host_build(preset):
    cfg = get_config(preset)
    torch.manual_seed(0)
    host = family_of(cfg).build(cfg)
    torch.manual_seed(0)
    built = materialize(preset, device="cpu", dtype=torch.float32)
    ours = built.state_dict()
    for name, t in host.state_dict().items():
        assert torch.equal(ours[name], t), name


@pytest.mark.parametrize("preset", SMALL)
def test_a_bf16_build_holds_bf16_weights_and_keeps_the_fp32_tables(preset):
    torch.manual_seed(0)
    model = materialize(preset, device="cpu", dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    # what a family computes in fp32 on purpose (RoPE tables) stays fp32; integer buffers stay integers
    assert all(b.dtype in (torch.float32, torch.int64) for b in model.buffers())
    assert torch.get_default_dtype() == torch.float32
    idx = torch.randint(0, 64, (1, 8))
    logits, _ = model(idx)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()


def test_the_default_dtype_is_restored_after_a_failed_build():
    with pytest.raises(RuntimeError):
        with building_on("cpu", torch.bfloat16):
            assert torch.empty(1).dtype == torch.bfloat16
            raise RuntimeError("build failed")
    assert torch.get_default_dtype() == torch.float32


def test_the_transformers_reference_holds_our_weights_in_our_dtype():
    family = family_of("llama3-debug")
    torch.manual_seed(0)
    model = materialize("llama3-debug", device="cpu", dtype=torch.bfloat16)
    with building_on("cpu", torch.bfloat16):
        hf = family.to_hf(model)
    assert {p.dtype for p in hf.parameters()} == {torch.bfloat16}
    expected = family.to_hf(model.float()).state_dict()  # the host's fp32 conversion of the same weights
    for name, t in hf.state_dict().items():
        assert torch.equal(t, expected[name].to(t.dtype)), name


RSS_SCRIPT = textwrap.dedent("""
    import resource, psutil, torch
    from accel_kit.models import materialize
    # The random draws fill the weights in place and allocate 16 MB of scratch per thread (with them the same build
    # grew 1.05x the weights: benchmarks/build_time.py), but 3.2 billion of them take half a minute of a 2-core
    # CPU: a fill writes every page instead, so the test measures what the build allocates, in seconds.
    torch.Tensor.normal_ = torch.Tensor.uniform_ = lambda self, *args, **kwargs: self.fill_(0.01)  # still written
    before = psutil.Process().memory_info().rss  # imports done; the peak from here on is the build's
    torch.manual_seed(0)
    model = materialize("llama3.2-3b", device="cpu", dtype=torch.bfloat16)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    weights = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    print(peak - before, weights)
""")


@pytest.mark.slow  # 6 GB allocated and touched in a fresh interpreter: about 10 s on 2 cores
def test_a_bf16_generate_build_of_llama32_3b_costs_its_bf16_weights_in_host_memory():
    """Built the old way (host fp32, then ``.to(bf16)``) the peak was 3x the bf16 weights (12.8 GB fp32 plus
    the 6.4 GB copy); built on meta and allocated in place, the weights alone (1.06x with fills)."""
    root = str(Path(__file__).resolve().parents[1])
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", RSS_SCRIPT], capture_output=True, text=True, check=True, env=env)
    grown, weights = map(int, out.stdout.split())
    assert grown <= 1.25 * weights, f"peak RSS grew {grown / weights:.2f}x the bf16 weights ({weights / 2**30:.2f} GiB)"


# --- drawn by name (accel_kit.models.init): values from the seed and the parameter's name alone

def _drawn(cfg, seed, threads):
    """``cfg``'s model made on meta, allocated on the host and drawn from ``seed`` on ``threads`` threads."""
    family = family_of(cfg)
    with torch.device("meta"):
        model = family.build(cfg)
    init_parameters(allocate(model, "cpu"), family.init_rule(cfg), seed, threads=threads)
    return model.state_dict()


@pytest.mark.parametrize("preset", SMALL)
def test_a_parameter_is_drawn_from_the_seed_and_its_name_alone(preset):
    cfg = get_config(preset)
    one = _drawn(cfg, 1234, threads=1)
    # other threads (the draws in another order), and a deeper model (more parameters drawn before and after the
    # ones it shares): each shared name holds the same values, bit for bit
    deeper = _drawn(dataclasses.replace(cfg, n_layers=cfg.n_layers + 1), 1234, threads=2)
    for name, t in _drawn(cfg, 1234, threads=3).items():
        assert torch.equal(t, one[name]), name
        if "c_proj.weight" not in name:  # (GPT-2's residual projections' std depends on the depth)
            assert torch.equal(deeper[name], t), name
    other_seed = _drawn(cfg, 1235, threads=1)
    assert all(not torch.equal(t, other_seed[name]) for name, t in one.items() if t.std() > 0)
    # the seed is drawn from torch's default generator: manual_seed decides the build
    torch.manual_seed(7)
    a = materialize(preset, device="cpu").state_dict()
    torch.manual_seed(7)
    b = materialize(preset, device="cpu").state_dict()
    assert all(torch.equal(t, b[name]) for name, t in a.items())


@pytest.mark.parametrize("preset", SMALL)
def test_a_bf16_build_is_the_fp32_build_rounded(preset):
    torch.manual_seed(0)
    fp32 = materialize(preset, device="cpu", dtype=torch.float32).state_dict()
    torch.manual_seed(0)
    bf16 = materialize(preset, device="cpu", dtype=torch.bfloat16).state_dict()
    for name, t in bf16.items():
        assert torch.equal(t, fp32[name].to(t.dtype)), name


def _sharded_build(rank, world, meet):
    """On each of two gloo ranks: GPT-2's and Llama's models built on meta, laid out (FSDP2 over both ranks, then
    tensor parallel 2) before they are allocated, then drawn: each rank holds half the weights, and the gathered
    weights are one process's build from the same seed (in the regrouped row order tensor parallelism keeps)."""
    from torch.distributed.device_mesh import init_device_mesh

    from accel_kit.engine.parallel import fsdp_wrap
    from accel_kit.models import build_deferred, build_model, materialize_deferred

    os.environ.update(meet)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    for preset in ("gpt2-debug", "llama3-debug"):
        family = family_of(preset)
        for layout in ("fsdp", "tp"):
            torch.manual_seed(0)
            model = build_deferred(preset)
            if layout == "fsdp":
                fsdp_wrap(model, getattr(model, family.pipeline_stages(model).blocks), mesh, "fp32")
            else:
                family.apply_tensor_parallel(model, mesh)
            materialize_deferred(model, "cpu")
            torch.manual_seed(0)
            whole = dict(build_model(preset).named_parameters())
            for name, p in model.named_parameters():
                owner = model.get_submodule(name.rpartition(".")[0])
                expected = whole[name].detach()
                if hasattr(owner, "init_layout"):  # rows regrouped per tensor-parallel shard
                    expected = owner.init_layout(expected)
                full = p.full_tensor() if hasattr(p, "full_tensor") else p
                assert torch.equal(full.detach(), expected), f"{preset} {layout}: {name}"
            if layout == "fsdp":  # every parameter sharded: this rank allocated its half
                local = sum(p.to_local().numel() for p in model.parameters())
                assert local <= sum(p.numel() for p in model.parameters()) // world + 64, preset
    torch.distributed.destroy_process_group()


@pytest.mark.slow  # two gloo ranks: about 10 s on 2 cores
def test_a_sharded_build_gathers_to_the_single_process_build():
    from ranks import rendezvous, spawn

    with rendezvous(1) as meets:
        spawn(_sharded_build, (2, meets[0]), 2)
