"""One stack per OFFRAMP_HOME: a second `offramp up`, demo or live bench on the same folder
is refused before it writes anything there, and a stopped stack frees the folder."""

from __future__ import annotations

import dataclasses

import pytest

from services.common import config as config_mod
from services.common.credentials import server_url_file
from services.launcher.home_lock import HomeLock, StackRunning
from services.launcher.supervisor import Deployment, Supervisor


def test_a_held_folder_is_refused_with_its_holder_until_released(tmp_path):
    first = HomeLock(tmp_path)
    first.acquire("offramp up")
    with pytest.raises(StackRunning, match=r"already runs with its state in .* \(offramp up, "
                                           r"pid \d+\): stop it first.*OFFRAMP_HOME"):
        HomeLock(tmp_path).acquire("offramp demo")
    first.release()
    second = HomeLock(tmp_path)
    second.acquire("offramp demo")  # free again
    assert second.held
    second.release()


def test_a_second_supervisor_starts_nothing(tmp_path):
    cfg = dataclasses.replace(config_mod.load(), home=tmp_path, nats_url=None)
    holder = HomeLock(tmp_path)
    holder.acquire("offramp up")
    try:
        sup = Supervisor(cfg, Deployment(("m",)))
        with pytest.raises(StackRunning):
            sup.start()
        assert sup.nats is None and not sup.children
        assert not server_url_file(tmp_path).exists()  # the running stack's URL stays
        sup.stop()  # what `up` does on the way out: harmless
    finally:
        holder.release()


def test_a_refused_up_prepares_and_registers_nothing(tmp_path, monkeypatch):
    from services.cli.main import main

    monkeypatch.setenv("OFFRAMP_HOME", str(tmp_path))
    monkeypatch.delenv("OFFRAMP_DATABASE_URL", raising=False)
    monkeypatch.delenv("OFFRAMP_NATS_URL", raising=False)
    holder = HomeLock(tmp_path)
    holder.acquire("offramp up")
    try:
        assert main(["up", "--models", "tiny"]) == 1  # refused, one error line
        assert not (tmp_path / "offramp.db").exists()  # nothing registered in the store
        assert not (tmp_path / "models").exists()
    finally:
        holder.release()
