"""accel_kit.timing.measure with an energy meter: the meter covers the timed trials only, not the warm-up."""
from accel_kit.devices.power import EnergyWindow
from accel_kit.timing import measure


class RecordingMeter:
    source = None

    def __init__(self, events):
        self.events = events

    def start(self):
        self.events.append("start")

    def poll(self):
        self.events.append("poll")

    def stop(self):
        self.events.append("stop")
        return EnergyWindow(None, 0.0, None, "recording only")


def test_meter_brackets_the_timed_trials_not_the_warmup():
    events = []
    t = measure(lambda: events.append("fn"), lambda: events.append("sync"), warmup=2, trials=3,
                meter=RecordingMeter(events))
    warm = ["sync", "fn", "sync"] * 2
    trial = ["sync", "fn", "sync"]
    assert events == warm + ["sync", "start"] + trial + ["poll"] + trial + ["poll"] + trial + ["stop"]
    assert t.energy.reason == "recording only"
