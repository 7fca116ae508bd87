"""Reading training records for the predictor: the shape a record measured (its layout too; a record
from before the layouts ran dp only), whether it can be learnt from, and which records are comparable
(same system, precision and host threads)."""
from __future__ import annotations

from accel_kit.mesh import ParallelLayout
from accel_kit.predict.shape import StepShape, shape_for
from accel_kit.results import Record


def shape_of_record(record: Record) -> StepShape:
    """The step shape a training record measured."""
    p, m = record.params, record.metrics
    return shape_for(p["preset"], ParallelLayout.of(p), seq_len=p["seq_len"], precision=p["precision"],
                     activation_checkpointing=p.get("activation_checkpointing", False),
                     vocab_size=p.get("vocab_size"), flash_attention=m.get("attention_kernel_ran", "flash") != "math")


def host_threads(record: Record) -> int | None:
    """Threads each rank computed with, where the device is the host CPU (ranks share its cores)."""
    return record.env.get("device", {}).get("threads")


def usable(record: Record) -> bool:
    """An ok, dense training record with a step time, of a model known here: what the compute fit learns from."""
    p, m = record.params, record.metrics
    return bool(record.status == "ok" and p.get("kind", "train") == "train" and "preset" in p
                and not p.get("sparsity") and not p.get("dense_finetune_steps") and m.get("step_time_s")
                and known_preset(p["preset"]))


def known_preset(preset: str) -> bool:
    """Whether ``preset`` names a model here. Records travel between machines: an ``hf:`` config file moved or
    deleted since its record was made (or a preset of another accel-kit version) gives no step shape to fit on,
    so its records are left out rather than failing every prediction of their system."""
    from accel_kit.errors import ParameterError
    from accel_kit.models import check_preset

    try:
        check_preset(preset)
    except ParameterError:
        return False
    return True


def group_key(record: Record) -> tuple:
    """Records whose rates are comparable: same system, precision and host threads per rank."""
    return record.system, record.params["precision"], host_threads(record)
