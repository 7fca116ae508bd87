"""accel_kit.devices.power.counter: a cumulative counter read around a window (wrap-around: test_power_rapl.py)."""
from energy_standins import Clock, source

from accel_kit.devices.power.counter import Counter, CounterMeter


def test_counter_without_a_range_that_goes_backwards_has_no_figure():
    values = iter([50.0, 60.0, 10.0])
    clock = Clock()
    meter = CounterMeter([Counter("fake counter", lambda: next(values))], source(), clock)
    meter.start()
    clock.now += 2
    meter.poll()
    clock.now += 2
    window = meter.stop()
    assert window.energy_j is None and "went backwards" in window.reason and window.window_s == 4
