"""Pre-training engine: one training step (``step``), a point run in a worker process
(``worker``), and the sweep runner that isolates, records and resumes points (``sweep``)."""
from accel_kit.engine.point import TrainPoint
from accel_kit.engine.step import NonFiniteLoss, OptimConfig, Trainer, learning_rate, make_optimizer

__all__ = ["TrainPoint", "NonFiniteLoss", "OptimConfig", "Trainer", "learning_rate", "make_optimizer"]
