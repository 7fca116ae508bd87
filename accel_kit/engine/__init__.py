"""The engine: every kind of measured work and what runs it. A point's kind (``kinds.KIND_MODULES``:
a training step, a transformer block, a matmul or bandwidth peak, offline generation, a served load)
names its point type and measurement; a point runs in its own worker process (``worker``), started by
the sweep runner that isolates, records and resumes points (``sweep``). ``step`` is the training step
the train kind times."""
from accel_kit.engine.point import TrainPoint
from accel_kit.engine.step import NonFiniteLoss, OptimConfig, Trainer, learning_rate, make_optimizer

__all__ = ["TrainPoint", "NonFiniteLoss", "OptimConfig", "Trainer", "learning_rate", "make_optimizer"]
