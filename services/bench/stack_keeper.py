"""Keeps a private stack alive while a bench does violence to it: a thread calls the
supervisor's ``poll()`` (which restarts dead services and a dead nats-server) and notes
when each service's process changed, so a bench can kill a service and read how long it
took to come back."""

from __future__ import annotations

import os
import signal
import threading
import time

from services.launcher import metrics_ports
from services.launcher.supervisor import Supervisor

POLL_S = 0.05


class Keeper:
    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        # poll() replaces child processes; pids() read meanwhile could see one half done
        self.lock = threading.Lock()
        self.expected = set(sup.pids())
        self.started: list[tuple[float, str, int]] = []  # (monotonic, service, new pid)
        self.error: BaseException | None = None
        self._last = sup.pids()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="offramp-chaos-keeper",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self.lock:
                    self.sup.poll()
                    pids = self.sup.pids()
            except Exception as exc:  # noqa: BLE001 - a server that cannot come back
                self.error = exc
                return
            now = time.monotonic()
            for name, pid in pids.items():
                if self._last.get(name) != pid:
                    self.started.append((now, name, pid))
            self._last = pids
            self._stop.wait(POLL_S)

    def pids(self) -> dict[str, int]:
        with self.lock:
            return self.sup.pids()

    def kill(self, name: str) -> tuple[int, float] | None:
        """SIGKILL ``name``'s process now: (its pid, when), or None if it is not running."""
        pid = self.pids().get(name)
        if pid is None:
            return None
        os.kill(pid, signal.SIGKILL)
        return pid, time.monotonic()

    def back_after(self, name: str, since: float) -> float | None:
        """Seconds from ``since`` until ``name`` had a new process, if it has one yet."""
        return next((t - since for t, n, _ in list(self.started) if n == name and t > since),
                    None)

    def restarts_since(self, since: float) -> dict[str, int]:
        """Services that got a new process after ``since``, and how many times."""
        out: dict[str, int] = {}
        for t, name, _ in list(self.started):
            if t > since:
                out[name] = out.get(name, 0) + 1
        return out

    def metrics_urls(self, prefix: str) -> list[str]:
        """The ``/metrics`` URLs of the services whose name starts with ``prefix``."""
        bind = self.sup.cfg.metrics_bind
        return [metrics_ports.url(bind, c.metrics_port) for c in self.sup.children
                if c.name.startswith(prefix) and c.metrics_port is not None]

    def all_running(self) -> bool:
        if self.error is not None:
            raise RuntimeError(f"the stack could not be kept up: {self.error}")
        return self.expected <= set(self.pids())
