"""Freezing a service's startup heap (services.common.gc_pauses)."""

from __future__ import annotations

import gc
import weakref

import pytest

from services.common import gc_pauses


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture
def unfrozen(monkeypatch):
    gc.unfreeze()
    monkeypatch.setattr(gc_pauses, "_settled", False)
    yield
    gc.unfreeze()  # leave the test process as it was


def test_settle_freezes_what_is_alive_and_collects_dead_cycles_first(unfrozen):
    a, b = _Node(), _Node()
    a.other, b.other = b, a               # a cycle only the collector can free
    dead = weakref.ref(a)
    del a, b
    alive = _Node()
    assert gc_pauses.settle(True) and gc.get_freeze_count() > 0
    assert dead() is None                 # collected before the freeze, not kept for good
    assert not any(o is alive for o in gc.get_objects())  # moved out of the generations


def test_settle_does_nothing_when_turned_off(unfrozen, monkeypatch):
    assert not gc_pauses.settle(False) and gc.get_freeze_count() == 0
    monkeypatch.setenv("OFFRAMP_GC_FREEZE", "0")
    assert not gc_pauses.settle() and gc.get_freeze_count() == 0
    monkeypatch.setenv("OFFRAMP_GC_FREEZE", "1")
    assert gc_pauses.settle() and gc.get_freeze_count() > 0


def test_settle_once_freezes_only_the_first_time(unfrozen):
    assert gc_pauses.settle_once(True)
    first = gc.get_freeze_count()
    later = [_Node() for _ in range(100)]
    assert not gc_pauses.settle_once(True) and gc.get_freeze_count() == first
    assert all(any(o is n for o in gc.get_objects()) for n in later[:3])  # not frozen


def test_the_setting_reaches_child_services(monkeypatch):
    from services.common import config

    monkeypatch.setenv("OFFRAMP_GC_FREEZE", "0")
    cfg = config.load()
    assert cfg.gc_freeze is False and cfg.as_env()["OFFRAMP_GC_FREEZE"] == "0"
    monkeypatch.delenv("OFFRAMP_GC_FREEZE")
    assert config.load().gc_freeze is True


def test_timing_keeps_the_collector_off_inside_and_restores_it(unfrozen):
    assert gc.isenabled()
    with gc_pauses.timing(True):
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        with gc_pauses.timing(True):  # nested: the outer block decides when it comes back
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_pauses.timing(True):
        raise RuntimeError("a failed run")
    assert gc.isenabled()                 # back on however the block ends


def test_timing_leaves_the_collector_alone_when_turned_off(unfrozen, monkeypatch):
    monkeypatch.setenv("OFFRAMP_GC_FREEZE", "0")
    with gc_pauses.timing():
        assert gc.isenabled() and gc.get_freeze_count() == 0
