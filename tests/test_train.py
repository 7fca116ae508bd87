import os

import pytest
import torch
import torch.distributed as dist

from accel_kit.models import build_model
from accel_kit.engine import NonFiniteLoss, OptimConfig, Trainer, learning_rate
from accel_kit.engine.launch import (distributed_env, render_jobscript, rendezvous_endpoint, torchrun_command,
                                     worker_command)
from accel_kit.engine.point import NOT_IN_KEY, TrainPoint
from accel_kit.peaks import MeasuredPeak
from accel_kit.engine.worker import end_group
from numerics import assert_close_sums, eps, gpt_forward_terms
from ranks import rendezvous, spawn

VOCAB, SEQ = 97, 16


def _batches(n, batch, seed=0):
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, VOCAB, (n * batch, SEQ + 1), generator=g)
    return [(data[i * batch:(i + 1) * batch, :-1], data[i * batch:(i + 1) * batch, 1:]) for i in range(n)]


def _model(seed=0):
    torch.manual_seed(seed)
    return build_model("gpt2-debug", vocab_size=VOCAB, seq_len=SEQ)


def test_gas_equals_one_big_batch():
    (x, y), = _batches(1, 8)
    big = Trainer(_model(), iter([(x, y)]), torch.device("cpu"), "fp32", 1, OptimConfig())
    big.accumulate()
    small = Trainer(_model(), iter([(x[i * 2:(i + 1) * 2], y[i * 2:(i + 1) * 2]) for i in range(4)]),
                    torch.device("cpu"), "fp32", 4, OptimConfig())
    small.accumulate()
    # The same gradients summed in another order (and the micro-batches' GEMMs blocked otherwise):
    # a forward and a backward through the model, then the weight gradients' sum over 8 x SEQ tokens.
    n = 2 * gpt_forward_terms(big.model.cfg, SEQ) + 8 * SEQ
    for (name, a), b in zip(big.model.named_parameters(), small.model.parameters()):
        assert_close_sums(b.grad, a.grad, n_terms=n, msg=name)


def test_step_updates_and_schedules():
    cfg = OptimConfig(lr=1e-3, min_lr=1e-4, warmup_steps=2, decay_steps=10)
    assert learning_rate(0, cfg) == pytest.approx(5e-4) and learning_rate(1, cfg) == pytest.approx(1e-3)
    assert learning_rate(12, cfg) == pytest.approx(1e-4) and learning_rate(100, cfg) == pytest.approx(1e-4)
    trainer = Trainer(_model(), iter(_batches(3, 2)), torch.device("cpu"), "fp32", 1, cfg)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    losses = [trainer.step() for _ in range(3)]
    assert all(l > 0 for l in losses) and trainer.step_count == 3
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    assert all(p.grad is None for p in trainer.model.parameters())


def test_bf16_keeps_fp32_master_weights():
    from accel_kit.engine.step import cast_for_precision

    with pytest.raises(ValueError, match="bf16 model"):
        Trainer(_model(), iter([]), torch.device("cpu"), "bf16", 1, OptimConfig())
    model = cast_for_precision(_model(), "bf16")
    trainer = Trainer(model, iter(_batches(2, 2)), torch.device("cpu"), "bf16", 1, OptimConfig(warmup_steps=1))
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert all(m.dtype == torch.float32 for m in trainer.master)
    first = [m.detach().clone() for m in trainer.master]
    trainer.step()
    trainer.step()
    # the optimizer updated the fp32 masters; the bf16 model holds their rounding
    assert any(not torch.equal(a, b) for a, b in zip(first, trainer.master))
    for m, p in zip(trainer.master, trainer.params):
        assert torch.equal(m.to(torch.bfloat16), p)


def test_fp16_uses_a_scaler():
    trainer = Trainer(_model(), iter(_batches(1, 2)), torch.device("cpu"), "fp16", 1, OptimConfig())
    assert trainer.scaler is not None
    assert trainer.step() > 0


def test_non_finite_loss_stops_with_the_step():
    model = _model()
    with torch.no_grad():
        model.ln_f.weight.fill_(float("nan"))
    trainer = Trainer(model, iter(_batches(2, 2)), torch.device("cpu"), "fp32", 1, OptimConfig())
    with pytest.raises(NonFiniteLoss, match="at step 1"):
        trainer.step()


def _ddp_rank(rank, world, meet, out):
    os.environ.update(meet)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    (x, y), = _batches(1, 4)
    mine = (x[rank * 2:(rank + 1) * 2], y[rank * 2:(rank + 1) * 2])
    model = torch.nn.parallel.DistributedDataParallel(_model())
    trainer = Trainer(model, iter([mine]), torch.device("cpu"), "fp32", 1, OptimConfig(grad_clip=0.0))
    grads = {}  # the all-reduced gradients, as the optimizer sees them
    trainer.optimizer.register_step_pre_hook(lambda *_: grads.update(
        {n: p.grad.detach().clone() for n, p in model.module.named_parameters(remove_duplicate=False)}))
    trainer.step()
    if rank == 0:
        torch.save({"state": {k: v.detach() for k, v in model.module.state_dict().items()}, "grads": grads}, out)
    del trainer, model  # the reducer lets go of the group first (worker.end_group says why)
    end_group()


@pytest.mark.slow  # two spawned gloo processes: about 9 s on 2 cores
def test_two_process_ddp_equals_one_process(tmp_path):
    out = tmp_path / "ddp.pt"
    with rendezvous(1) as [meet]:
        spawn(_ddp_rank, (2, meet, str(out)), 2)
    (x, y), = _batches(1, 4)
    single = Trainer(_model(), iter([(x, y)]), torch.device("cpu"), "fp32", 1, OptimConfig(grad_clip=0.0))
    grads = {}
    single.optimizer.register_step_pre_hook(lambda *_: grads.update(
        {n: p.grad.detach().clone() for n, p in single.model.named_parameters(remove_duplicate=False)}))
    single.step()
    ddp = torch.load(out)
    # The averaged gradients equal the whole batch's, up to summation order (numerics.py: a forward,
    # a backward, then the sum over the 4 x SEQ tokens, here split over two ranks).
    n = 2 * gpt_forward_terms(single.model.cfg, SEQ) + 4 * SEQ
    for name, grad in grads.items():
        assert_close_sums(ddp["grads"][name], grad, n_terms=n, msg=name)
    # After the step the weights differ by lr_0 times the change in Adam's first update
    # g / (|g| + eps_adam): at most |delta g| / eps_adam (its slope at g = 0), and 2 (a sign)
    # where a gradient is rounding noise (the attention key bias); then rounded to fp32 (rtol).
    lr_0, eps32, eps_adam = learning_rate(0, single.optim_cfg), eps(torch.float32), 1e-8
    for name, value in single.model.state_dict().items():
        delta_g = eps32 * n * grads[name].abs().max().item()
        torch.testing.assert_close(ddp["state"][name], value, rtol=2 * eps32,
                                   atol=lr_0 * min(2.0, delta_g / eps_adam), msg=name)


def test_point_identity_and_nodes():
    fields = dict(system="a100", preset="gpt2-xl", precision="fp16", micro_batch_size=1, seq_len=2048,
                  devices=64, devices_per_node=4)
    p = TrainPoint(**fields)
    assert p.nodes == 16 and p.global_batch_size == 64
    # The run's measured peak is a field of the point (validated: a misspelt field would raise here),
    # but a new peak measurement must not make a recorded point run again: it is not in the key.
    peak = MeasuredPeak("fp16", 1.0, "64", {"64": 1.0}).to_dict()
    measured = TrainPoint(**fields, peak=peak)
    assert measured.peak == peak and "peak" in NOT_IN_KEY
    assert measured.key() == p.key()
    assert p.key() != TrainPoint(**fields | {"gas": 2}).key()


def test_launchers():
    assert distributed_env({}) == (0, 1, 0)
    assert distributed_env({"PMI_RANK": "3", "PMI_SIZE": "8", "PALS_LOCAL_RANKID": "3"}) == (3, 8, 3)
    assert distributed_env({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}) == (5, 8, 1)
    cmd, _ = worker_command("local", 2, 1)
    assert "torch.distributed.run" in cmd and "--nproc_per_node=2" in cmd
    with pytest.raises(ValueError, match="batch job"):
        worker_command("local", 8, 2)
    cmd, env = worker_command("mpiexec", 16, 4)
    assert cmd[:5] == ["mpiexec", "-n", "16", "--ppn", "4"] and "MASTER_ADDR" in env
    cmd, _ = worker_command("srun", 16, 4)
    assert "--ntasks-per-node=4" in cmd


def test_records_say_where_the_ranks_met():
    cmd, env = worker_command("mpiexec", 4, 2)
    assert rendezvous_endpoint(cmd, env) == f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    assert rendezvous_endpoint(torchrun_command(4, 2, "node1", 29500, slurm=True), {}) == "node1:29500"
    assert rendezvous_endpoint(worker_command("local", 2, 1)[0], {}) is None
    # a site's own port (-p rendezvous_port), for every launcher that meets across nodes
    assert worker_command("srun", 2, 2, port=29511)[1]["MASTER_PORT"] == "29511"
    assert rendezvous_endpoint(*worker_command("torchrun", 2, 2, port=29511)).endswith(":29511")


@pytest.mark.parametrize("scheduler, marker", [("pbs", "#PBS -l select=4"), ("slurm", "#SBATCH --nodes=4")])
def test_jobscripts(scheduler, marker):
    text = render_jobscript(scheduler, study="scaling", system="a100", nodes=4, devices_per_node=4,
                            profile="full", walltime="01:00:00", path="job.sh", overrides=[("steps", "20")])
    assert marker in text and "accel-kit run scaling --system a100 --profile full" in text
    assert "-p max_nodes 4" in text and "-p steps '20'" in text


@pytest.mark.slow
def test_deepspeed_zero1_under_its_launcher(out_dir, tmp_path, monkeypatch):
    """ZeRO-1 through DeepSpeed, as a point in a group of its own (DeepSpeed initialises torch.distributed
    itself: the worker gets torchrun's variables, from the fork server or from torchrun).

    One rank: the launch, the engine's config and its step are ours to test; several ranks' collectives
    are DeepSpeed's (two DDP and FSDP ranks are tested in tests/test_train.py and tests/test_parallel.py).
    Its one rank must not JIT-build DeepSpeed's shared-memory all-reduce (about 70 s on 2 cores; it was
    most of this test's time in a fresh environment)."""
    pytest.importorskip("deepspeed")
    extensions = tmp_path / "torch_extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(extensions))  # where torch's JIT builds would go
    from accel_kit.engine.sweep import run_worker

    point = TrainPoint(system="cpu", preset="gpt2-debug", vocab_size=VOCAB, precision="bf16", micro_batch_size=2,
                       gas=2, seq_len=SEQ, devices=1, devices_per_node=8, engine="deepspeed", steps=2, warmup_steps=1)
    result = run_worker(point, timeout_s=600, cpu_threads=1)
    assert result["status"] == "ok", result.get("reason")
    assert result["metrics"]["dp"] == 1 and result["metrics"]["global_batch_size"] == 4
    assert result["metrics"]["tokens_per_s"] > 0
    assert not extensions.exists() or not any(extensions.iterdir()), "a C++ extension was built"
