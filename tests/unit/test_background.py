"""Low-priority background work (services.common.background.run_low)."""

import os
import threading

import pytest

from services.common import background


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not background.supported(), reason="cannot lower a nice value here")
def test_work_runs_low_and_the_threads_it_starts_end_at_the_usual_priority():
    seen = {}

    def work(x):
        seen["during"] = _nice()
        started = threading.Event()
        release = threading.Event()

        def pool_thread():  # like ONNX Runtime's pool, created while the work runs
            seen["thread_id"] = threading.get_native_id()
            started.set()
            release.wait(5)

        t = threading.Thread(target=pool_thread)
        t.start()
        started.wait(5)
        seen["release"], seen["t"] = release, t
        return x * 2

    base = _nice()
    assert background.run_low(work, 21) == 42
    assert seen["during"] == background.LOW
    assert _nice() == base
    try:
        assert os.getpriority(os.PRIO_PROCESS, seen["thread_id"]) == base
    finally:
        seen["release"].set()
        seen["t"].join()


def test_errors_propagate_and_restore_the_priority():
    base = _nice()

    def fail():
        raise ValueError("bad ramp set")

    with pytest.raises(ValueError, match="bad ramp set"):
        background.run_low(fail)
    assert _nice() == base


def test_without_the_privilege_the_work_runs_as_is(monkeypatch):
    monkeypatch.setattr(background, "supported", lambda: False)
    base = _nice()
    assert background.run_low(lambda: _nice()) == base
