import pytest

import time

from accel_kit.timing import Stopwatch, Timing, measure


def test_statistics():
    t = Timing(times_s=[1.0, 2.0, 3.0, 4.0, 5.0], warmup_times_s=[10.0])
    assert t.median_s == 3.0
    assert t.iqr_s == pytest.approx(2.0)  # inclusive quartiles 2 and 4
    assert t.cv == pytest.approx(1.5811388 / 3.0)
    assert t.noisy
    assert t.warmup_total_s == 10.0
    s = t.summary()
    assert s["time_median_s"] == 3.0 and s["trials"] == 5


def test_steady_point_is_not_noisy():
    t = Timing(times_s=[1.0, 1.01, 0.99])
    assert not t.noisy


def test_single_trial():
    t = Timing(times_s=[2.0])
    assert t.iqr_s == 0.0 and t.cv == 0.0


def test_needs_a_trial():
    with pytest.raises(ValueError):
        Timing(times_s=[])


def test_measure_syncs_around_every_iteration_and_separates_warmup():
    events = []
    measure(lambda: events.append("fn"), lambda: events.append("sync"), warmup=2, trials=3)
    assert events == ["sync", "fn", "sync"] * 5


def test_measure_counts():
    seen = []
    t = measure(lambda: None, lambda: None, warmup=1, trials=4, on_trial=lambda i, s: seen.append(i))
    assert len(t.times_s) == 4 and len(t.warmup_times_s) == 1 and seen == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        measure(lambda: None, lambda: None, trials=0)


def test_stopwatch_syncs_around_each_region_and_totals_a_step():
    events = []
    watch = Stopwatch(lambda: events.append("sync"))
    for regions in (2, 0, 1):  # a step may have several regions, or none
        for _ in range(regions):
            with watch.region():
                events.append("work")
                time.sleep(0.01)
        watch.end_step()
    assert events == ["sync", "work", "sync"] * 3
    two, none, one = watch.times_s
    # (only lower bounds: a sleep lasts at least its time, however busy the machine)
    assert none == 0 and two >= 0.02 and one >= 0.01
