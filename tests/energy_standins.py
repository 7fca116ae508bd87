"""Stand-ins the energy tests share: a clock the test moves, a counter's source, a meter with a fixed reading."""
from accel_kit.devices.power import ENERGY_COUNTER, EnergySource, EnergyWindow


class Clock:
    """A clock that stands still until the test moves ``now`` (seconds)."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def source(**kw) -> EnergySource:
    """An energy counter's source named "fake"; ``kw`` overrides any field."""
    return EnergySource(**({"counter": "fake", "library": "test", "method": ENERGY_COUNTER} | kw))


class FakeMeter:
    """A meter whose window reads ``joules`` over ``seconds`` (what a device with a counter would give)."""

    def __init__(self, joules, seconds=2.0, rated_w=100.0):
        self.joules, self.seconds = joules, seconds
        self.source = source(rated_power_w=rated_w, rated_power_source="test")

    def start(self):
        pass

    def poll(self):
        pass

    def stop(self):
        return EnergyWindow(self.joules, self.seconds, self.source)
