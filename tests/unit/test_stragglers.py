"""Straggler detection (services.optimizer.stragglers)."""

from __future__ import annotations

from services.optimizer.stragglers import StragglerWatch


def expect(_worker: str, rows: float) -> float:
    return 2.0 * rows  # 2 ms a sample on this class


def run(watch: StragglerWatch, slow_ms: float, windows: int) -> list[tuple[set, set]]:
    out = []
    for _ in range(windows):
        watch.observe("fast", 4, 64, 4 * 16 * 2.0)
        watch.observe("slow", 4, 64, 4 * 16 * slow_ms)
        out.append(watch.close_window(expect))
    return out


def test_marked_after_three_slow_windows_in_a_row_and_cleared_after_three_fast() -> None:
    w = StragglerWatch()
    got = run(w, 3.5, 3)  # 1.75x the profile
    assert got[0] == (set(), set()) and got[1] == (set(), set())
    assert got[2] == ({"slow"}, set()) and w.stragglers == {"slow"}
    assert run(w, 3.5, 1) == [(set(), set())]  # already marked: nothing new
    back = run(w, 2.2, 3)  # 1.1x: within the margin
    assert back[2] == (set(), {"slow"}) and w.stragglers == set()


def test_a_fast_window_breaks_the_streak_and_thin_windows_say_nothing() -> None:
    w = StragglerWatch()
    run(w, 3.5, 2)
    run(w, 2.0, 1)
    assert run(w, 3.5, 2)[-1] == (set(), set())  # 2 in a row again, not 3
    thin = StragglerWatch()
    for _ in range(5):
        thin.observe("slow", 2, 32, 2 * 16 * 9.0)  # 2 batches a window: too few
        assert thin.close_window(expect) == (set(), set())


def test_at_most_the_margin_is_not_slow_and_unknown_profiles_are_skipped() -> None:
    w = StragglerWatch()
    assert run(w, 3.0, 4)[-1] == (set(), set())  # exactly 1.5x
    unknown = StragglerWatch()
    for _ in range(4):
        unknown.observe("x", 5, 50, 5000.0)
        assert unknown.close_window(lambda *_: None) == (set(), set())


def test_workers_slow_alike_are_not_stragglers_the_profile_is_off() -> None:
    w = StragglerWatch()
    for _ in range(4):  # both 1.75x the profile: a loaded machine, not one bad worker
        w.observe("a", 4, 64, 4 * 16 * 3.5)
        w.observe("b", 4, 64, 4 * 16 * 3.6)
        assert w.close_window(expect) == (set(), set())
    for k in range(3):  # then one runs 1.6x slower than the other as well: marked
        w.observe("a", 4, 64, 4 * 16 * 3.5)
        w.observe("b", 4, 64, 4 * 16 * 5.6)
        got = w.close_window(expect)
    assert got == ({"b"}, set()) and k == 2
    alone = StragglerWatch()  # no peer in the window: the profile alone judges
    for _ in range(3):
        alone.observe("solo", 4, 64, 4 * 16 * 3.5)
        got = alone.close_window(expect)
    assert got == ({"solo"}, set())
