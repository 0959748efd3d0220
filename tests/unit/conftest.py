"""Unit tests are pure: no subprocess, no socket or server, no model runtime, no database,
no prepared models. Anything that needs them belongs in tests/integration (or tests/e2e for
a whole stack), and the guards below fail a unit test that tries."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

MOVE = "unit tests are pure: move this test to tests/integration"


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{what}: {MOVE}")
    return refuse


@pytest.fixture(autouse=True)
def _pure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("a subprocess"))
    monkeypatch.setattr(socket.socket, "connect", _refuse("a socket connection"))
    monkeypatch.setattr(socket.socket, "connect_ex", _refuse("a socket connection"))
    monkeypatch.setattr(socket.socket, "bind", _refuse("a listening socket"))
    if (ort := sys.modules.get("onnxruntime")) is not None:
        monkeypatch.setattr(ort, "InferenceSession", _refuse("an ONNX Runtime session"))
    if (sa := sys.modules.get("sqlalchemy")) is not None:
        monkeypatch.setattr(sa, "create_engine", _refuse("a database"))


@pytest.fixture
def models_dir():
    pytest.fail(f"prepared models: {MOVE}")


@pytest.fixture
def zoo_dir():
    pytest.fail(f"prepared models: {MOVE}")
