"""glibc malloc thresholds for large message buffers (services/common/memory.py)."""


import pytest

from services.common import memory


@pytest.mark.parametrize("var", ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"])
def test_user_settings_win(monkeypatch, var):
    monkeypatch.setenv(var, "131072")
    assert memory.keep_large_buffers() is False


def test_mmap_threshold_covers_the_largest_message():
    from services.launcher.natsserver import MAX_PAYLOAD

    assert memory.MMAP_THRESHOLD >= MAX_PAYLOAD
