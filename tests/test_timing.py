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


class _Clock:
    """A clock the work advances: iteration k takes ``durations_s[k]`` seconds, whatever the machine does."""

    def __init__(self, durations_s):
        self.now, self.durations_s, self.calls = 0.0, list(durations_s), 0

    def perf_counter(self):
        return self.now

    def work(self):
        self.now += self.durations_s[self.calls]
        self.calls += 1


@pytest.mark.parametrize("durations_s, runs, skipped", [
    # a slow first iteration (one-time costs) then fast ones: the second judges, and the point runs
    ([0.9] + [0.06] * 159, 160, False),
    # slow throughout: skipped after the second iteration, one more than the first alone would have run
    ([0.9] * 160, 2, True),
    # the first within budget: no second look
    ([0.1] * 160, 160, False),
])
def test_the_budget_is_judged_again_by_the_second_iteration(monkeypatch, durations_s, runs, skipped):
    import accel_kit.timing as T

    clock = _Clock(durations_s)
    monkeypatch.setattr(T, "time", clock)
    if skipped:
        with pytest.raises(T.OverBudget, match=r"estimated 144 s \(the first iteration 0.90 s, the 159 others at "
                                               r"0.90 s, the second's\) exceeds the time budget of 120 s"):
            measure(clock.work, lambda: None, warmup=10, trials=150, budget_s=120)
    else:
        t = measure(clock.work, lambda: None, warmup=10, trials=150, budget_s=120)
        assert len(t.times_s) == 150
    assert clock.calls == runs


def test_a_single_iteration_over_budget_is_judged_by_itself(monkeypatch):
    import accel_kit.timing as T

    clock = _Clock([5.0])
    monkeypatch.setattr(T, "time", clock)
    # one timed trial and 9 iterations the caller runs after: no second one here to judge by
    with pytest.raises(T.OverBudget, match=r"estimated 50 s \(10 iterations at 5.00 s, the first one's time\)"):
        measure(clock.work, lambda: None, warmup=0, trials=1, budget_s=20, extra_iterations=9)
