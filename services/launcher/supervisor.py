"""``offramp up``: the embedded NATS server, the store, and every service as a child process.

A child that dies is restarted with exponential backoff (logged); Ctrl-C / SIGTERM
stops every child and the server cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from services.common import bus
from services.common.client import models as list_models
from services.common.config import Config
from services.common.credentials import (
    CredentialsError,
    credentials_file,
    login_for,
    server_url_file,
    with_login,
)
from services.common.readiness import READY_FILE_ENV, is_ready, ready_file
from services.common.service_loop import PARENT_PID_ENV
from services.exits.initial import initial_ramps
from services.launcher import metrics_ports
from services.launcher.home_lock import HomeLock
from services.launcher.nats_auth import authorization_block, ensure_logins
from services.launcher.natsserver import EmbeddedNats
from services.prepare.pipeline import SUPERNETS, ZOO, load_if_intact, prepare
from services.runtime.manifest import Manifest, manifest_kind
from services.runtime.stage import spin_for
from services.store.migrate import upgrade
from services.store.repository import Store
from services.zoo.registry import LLMS

log = logging.getLogger("offramp.up")

BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 10.0
HEALTHY_AFTER_S = 30.0     # a child that lived this long gets its backoff reset


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen | None = None
    started: float = 0.0
    backoff: float = BACKOFF_START_S
    restart_at: float | None = None
    restarts: int = 0
    log_file: Path | None = None
    metrics_port: int | None = None  # kept across restarts: the scrape target stays put
    ready_file: Path | None = None    # the child writes its pid here once it serves


@dataclass
class Deployment:
    """What to run: per model its cut points and replicas of every stage."""

    models: tuple[str, ...]
    cuts: dict[str, list[int]] = field(default_factory=dict)
    replicas: int = 1
    routers: int = 1  # in one queue group: a request goes to one of them
    # E3 (`--workers N --plan auto`): N pool workers take their stages from the optimizer's
    # plans instead of a fixed layout
    pool_workers: int = 0


def prepare_state(cfg: Config, say=print) -> None:
    """Create the state folder, migrate the store, prepare and register the served models.

    Zoo models are prepared on demand; any other name must already be prepared (``offramp
    prepare PATH --name NAME``) under the models folder."""
    cfg.home.mkdir(parents=True, exist_ok=True)
    upgrade(cfg.database_url)
    store = Store(cfg.database_url)
    try:
        for name in cfg.models:
            register_prepared(store, ensure_prepared(cfg, name, say), cfg.ramp_budget)
    finally:
        store.close()


def ensure_prepared(cfg: Config, name: str, say=print) -> Path:
    if name in LLMS:  # generative: exit heads over a cached base model
        from services.prepare.llm_models import prepare_llm

        return prepare_llm(name, cfg, log=say)
    if name in ZOO:
        return prepare(name, cfg.models_dir, log=say)
    if name in SUPERNETS:  # prepared like the zoo: idempotent, trained once and cached
        from services.prepare.supernet import prepare_configured

        return prepare_configured(cfg, log=say, name=name)
    model_dir = cfg.models_dir / name
    if load_if_intact(model_dir, name) is None:
        raise SystemExit(f"model {name!r} is neither in the zoo ({', '.join(sorted(ZOO))}) nor "
                         f"prepared under {cfg.models_dir}: run `offramp prepare PATH --name "
                         f"{name} --data INPUTS.npz` first")
    say(f"using prepared {name} at {model_dir}")
    return model_dir


def register_prepared(store, model_dir: Path, budget: float) -> None:
    """Record a prepared model (models, artifacts, ramps) and its initial exit config; a
    generative model has none of these (its exit heads are in its manifest): it becomes a
    candidate of HELIOS's model repository, with its footprint."""
    if manifest_kind(model_dir) == "llm":
        from services.runtime.llm_footprint import candidate_row

        store.save_repository_candidates([candidate_row(model_dir)])
        return
    manifest = Manifest.load(model_dir)
    before = store.model(manifest.name)
    store.register_model(manifest.to_dict(), str(model_dir))
    if manifest.kind == "supernet":  # its variants: what routers choose each batch from
        from services.prepare.supernet import subnet_rows

        store.save_subnet_profiles(manifest.name, manifest.meta["device"],
                                   subnet_rows(manifest), source="search")
    latest = store.latest_exit_config(manifest.name)
    # A re-prepared model has new ramps: the thresholds, set and refitted heads in force
    # were chosen for the old ones (whose head files went with the old preparation).
    reprepared = before is not None and before["version"] != manifest.version
    if latest is None or reprepared:
        active = initial_ramps(manifest, budget)  # never an untrained ramp
        untrained = sum(not r.trained for r in manifest.ramps)
        note = f"; {untrained} untrained, inactive until refitted" if untrained else ""
        why = (f"re-prepared (version {before['version'][:12]} -> {manifest.version[:12]}): "
               if reprepared and latest is not None else "")
        store.save_exit_config(manifest.name, {r.index: 0.0 for r in manifest.ramps}, active,
                               latest.mode if latest is not None else "latency",
                               f"{why}initial deployment: {len(active)} of "
                               f"{len(manifest.ramps)} ramps active (evenly spaced within the "
                               f"ramp budget), thresholds 0, prepared heads{note}")
    if manifest.kind != "supernet":
        save_cap_estimates(store, manifest)


def save_cap_estimates(store, manifest: Manifest) -> None:
    """An early-exit model's depth caps as variants, estimated from its preparation (the
    ramps' held-out agreement, the measured block costs) until the profiler measures them
    on the served stream."""
    from services.exits.depth_caps import SOURCE_PREPARED, cap_accuracy, cap_profile
    from services.profiler.latency import from_manifest

    if any(r["source"] != SOURCE_PREPARED
           for r in store.subnet_profiles(manifest.name, pareto=False)):
        return  # measured on a stream before: the profiler keeps those up to date
    doc = manifest.to_dict()
    active = store.latest_exit_config(manifest.name).active
    rows = cap_profile(doc, from_manifest(manifest), active, cap_accuracy(doc, {}))
    if rows:
        store.save_subnet_profiles(manifest.name, manifest.meta.get("device_class", "cpu"),
                                   rows, SOURCE_PREPARED)


class Supervisor:
    def __init__(self, cfg: Config, deployment: Deployment, log_dir: Path | None = None) -> None:
        self.cfg = cfg
        self.deployment = deployment
        self.log_dir = log_dir
        self.nats: EmbeddedNats | None = None
        self.nats_restarts = 0
        self.logins_mtime = 0  # of the credentials file the embedded server was given
        self.children: list[Child] = []
        self.url = cfg.nats_url
        self.home_lock = HomeLock(cfg.home)

    def claim_home(self) -> None:
        """Hold ``OFFRAMP_HOME`` for this stack (StackRunning if another holds it): before
        anything is prepared or registered, so a refused stack changes nothing."""
        self.home_lock.acquire(f"offramp {sys.argv[1]}" if len(sys.argv) > 1 else "a stack")

    def start(self) -> str:
        self.claim_home()
        if self.url is None:
            # the file the children read their logins from (credentials.login_for)
            logins = ensure_logins(credentials_file(self.cfg))
            self.logins_mtime = credentials_file(self.cfg).stat().st_mtime_ns
            self.nats = EmbeddedNats(self.cfg.home / "nats", procs=self.cfg.nats_procs,
                                     authorization=authorization_block(logins))
            self.url = self.nats.start()
            server_url_file(self.cfg.home).write_text(self.url + "\n")
        env_cfg = self.cfg.as_env()
        env_cfg["OFFRAMP_NATS_URL"] = self.url
        env_cfg["OFFRAMP_ORT_SPIN"] = self.ort_spin()
        self.env = {**os.environ, **env_cfg}
        base = [sys.executable, "-m", "services.cli", "serve"]
        self.children = [Child("router" if r == 0 else f"router-{r + 1}", base + ["router"])
                         for r in range(max(1, self.deployment.routers))]
        self.children += [Child("monitor", base + ["monitor"]), Child("profiler", base + ["profiler"])]
        if self.cfg.adapt:
            self.children.append(Child("tuner", base + ["tuner"]))
            # HELIOS picks candidate and depth, unless the operator fixed the depth
            if not self.cfg.llm_depth and any(manifest_kind(self.cfg.models_dir / m) == "llm"
                                              for m in self.deployment.models):
                self.children.append(Child("helios", base + ["helios"]))
        if self.deployment.pool_workers:
            self.children.append(Child("optimizer", base + ["optimizer"]))
            self.children += [Child(f"worker-pool-{k}", base + ["worker", "--pool"])
                              for k in range(self.deployment.pool_workers)]
        for model in self.deployment.models if not self.deployment.pool_workers else ():
            cuts = self.deployment.cuts.get(model, [])
            for stage in range(len(cuts) + 1):
                for r in range(self.deployment.replicas):
                    argv = base + ["worker", "--model", model, "--stage", str(stage),
                                   "--cuts", ",".join(map(str, cuts))]
                    self.children.append(Child(f"worker-{model}-s{stage}-r{r}", argv))
        self.assign_metrics_ports()
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        for child in self.children:
            self._spawn(child)
        return self.url

    def client_url(self) -> str | None:
        """The URL an application connects with: the client role's login, when there is one."""
        try:
            login = login_for(self.cfg, "client")
        except CredentialsError:  # a user's file with the service roles only
            return None
        return with_login(self.url, login) if login and self.url else None

    def assign_metrics_ports(self) -> None:
        """A metrics port per child (``metrics_ports.assign``), recorded for ``offramp
        status``."""
        ports = metrics_ports.assign([c.name for c in self.children], self.cfg.metrics_port,
                                     self.cfg.metrics_bind)
        for child in self.children:
            child.metrics_port = ports[child.name]
        metrics_ports.write(self.cfg.home, ports, self.cfg.metrics_bind)

    def workers(self) -> int:
        """Worker processes this deployment starts: every stage of every model, replicated
        (or the pool)."""
        if self.deployment.pool_workers:
            return self.deployment.pool_workers
        return sum((len(self.deployment.cuts.get(m, [])) + 1) * self.deployment.replicas
                   for m in self.deployment.models)

    def ort_spin(self) -> str:
        """The workers' ``OFFRAMP_ORT_SPIN``, resolved here where the number of workers on
        this host is known (see ``runtime.spin_for``)."""
        return "on" if spin_for(self.cfg.ort_spin, self.workers()) else "off"

    def _spawn(self, child: Child) -> None:
        out = None
        if self.log_dir is not None:
            child.log_file = self.log_dir / f"{child.name}.log"
            out = open(child.log_file, "ab")  # noqa: SIM115 - owned by the child
        child.ready_file = ready_file(self.cfg.home, child.name)
        env = {**self.env, READY_FILE_ENV: str(child.ready_file),
               PARENT_PID_ENV: str(os.getpid())}
        if child.metrics_port is not None:
            env["OFFRAMP_METRICS_PORT"] = str(child.metrics_port)
        child.proc = subprocess.Popen(child.argv, env=env, stdout=out, stderr=out,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        child.started = time.monotonic()
        child.restart_at = None

    def poll(self) -> None:
        """Restart the embedded NATS server and children that died (children with backoff).
        Call periodically."""
        self._keep_nats()
        self._follow_logins()
        now = time.monotonic()
        for child in self.children:
            if child.proc is not None and child.proc.poll() is not None:
                code = child.proc.returncode
                if now - child.started > HEALTHY_AFTER_S:
                    child.backoff = BACKOFF_START_S
                child.restart_at = now + child.backoff
                log.warning("service %s (pid %s) exited with code %s; restarting in %.1fs",
                            child.name, child.proc.pid, code, child.backoff)
                child.backoff = min(child.backoff * 2, BACKOFF_MAX_S)
                child.proc = None
            elif child.proc is None and child.restart_at is not None and now >= child.restart_at:
                child.restarts += 1
                self._spawn(child)
                log.warning("service %s restarted (restart #%d, pid %s)", child.name,
                            child.restarts, child.proc.pid)

    def _follow_logins(self) -> None:
        """A login added while ``up`` runs (``offramp credentials client --name APP``) is
        given to the embedded server at once, by a config reload."""
        path = credentials_file(self.cfg)
        if self.nats is None or not path.exists() or \
                path.stat().st_mtime_ns == self.logins_mtime:
            return
        self.logins_mtime = path.stat().st_mtime_ns
        self.nats.reload(authorization_block(ensure_logins(path)))
        log.info("embedded nats-server reloaded its logins from %s", path)

    def _keep_nats(self) -> None:
        """An embedded server that died comes back at once on the same port and store
        directory (JetStream keeps the telemetry it held; services reconnect on their own);
        if it cannot, ``up`` stops loudly rather than leave every service retrying."""
        if self.nats is None or self.nats.proc is None or self.nats.proc.poll() is None:
            return
        code = self.nats.proc.returncode
        log.warning("embedded nats-server (pid %s) exited with code %s; restarting it on %s",
                    self.nats.proc.pid, code, self.nats.url)
        try:
            self.nats.start()
        except RuntimeError as exc:
            raise RuntimeError(f"the embedded nats-server died (code {code}) and could not be "
                               f"restarted: {exc}") from None
        self.nats_restarts += 1
        log.warning("embedded nats-server restarted (restart #%d, pid %s)", self.nats_restarts,
                    self.nats.proc.pid)

    def not_ready(self) -> list[str]:
        """Children that have not said they serve (``services.common.readiness``)."""
        return [c.name for c in self.children
                if c.proc is None or not is_ready(c.ready_file, c.proc.pid)]

    def wait_ready(self, timeout: float = 120.0,
                   stopped: Callable[[], bool] = lambda: False) -> bool:
        """Block until every served model reports ready (all stages have a live worker) and
        every service started here has subscribed (a controller that subscribes late misses
        the telemetry of the first requests): True. False as soon as ``stopped()`` (Ctrl-C
        while it waits); RuntimeError after ``timeout``."""
        deadline = time.monotonic() + timeout

        async def check() -> bool | None:
            nc = await bus.connect(self.url, "offramp-up-ready",
                                   login=login_for(self.cfg, "client"))
            try:
                while time.monotonic() < deadline:
                    if stopped():
                        return None
                    self.poll()
                    with contextlib.suppress(Exception):  # the router is still starting
                        ms = await list_models(nc, timeout=1.0)
                        if ms and all(m["ready"] for m in ms) and not self.not_ready():
                            return True
                    await asyncio.sleep(0.2)
                return False
            finally:
                await nc.close()

        ready = asyncio.run(check())
        if ready is None:
            return False
        if not ready:
            dead = [c.name for c in self.children if c.proc is None]
            hint = f" (logs in {self.log_dir})" if self.log_dir else ""
            raise RuntimeError(f"services not ready within {timeout:.0f}s; not running: {dead}; "
                               f"not ready: {self.not_ready()}{hint}")
        return True

    def stop(self) -> None:
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.terminate()
        deadline = time.monotonic() + 10
        for child in self.children:
            if child.proc is not None:
                try:
                    child.proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.warning("service %s did not stop in time; killing it", child.name)
                    child.proc.kill()
                    child.proc.wait()
            child.restart_at = None
            child.proc = None
        metrics_ports.remove(self.cfg.home)
        if self.nats is not None:
            self.nats.stop()
        self.home_lock.release()

    def pids(self) -> dict[str, int]:
        out = {c.name: c.proc.pid for c in self.children if c.proc is not None}
        if self.nats is not None and self.nats.proc is not None:
            out["nats"] = self.nats.proc.pid
        return out

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
