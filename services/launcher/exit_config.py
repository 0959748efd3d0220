"""``offramp exit-config``: store a new exit-config version and broadcast it to workers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from schemas import subjects
from schemas.messages import ExitConfig
from services.common import bus
from services.common.config import Config
from services.common.credentials import login_for
from services.exits.depth_caps import lever_caps
from services.store.repository import Store


def pinned_heads(store: Store, model: str, current: dict[int, str], pins: list[str]
                 ) -> dict[int, str]:
    """``current`` heads with each ``RAMP=VERSION`` of ``pins`` applied (version 0: the
    prepared head); ValueError naming the versions that exist for an unknown one. Only the
    heads refitted for the model as prepared now count: an earlier preparation's ramps
    read other features, and its head files went with it."""
    heads = dict(current)
    registered = store.model(model)
    prepared = None if registered is None else registered["version"]
    stored = [h for h in store.ramp_heads(model)
              if prepared is None or h["prepared"] in (None, prepared)]
    for pin in pins:
        ramp_s, _, version_s = pin.partition("=")
        try:
            ramp, version = int(ramp_s), int(version_s)
        except ValueError:
            raise ValueError(f"--head {pin!r}: use RAMP=VERSION (0: the prepared head)") from None
        if version == 0:
            heads.pop(ramp, None)
            continue
        match = [h for h in stored if h["ramp"] == ramp and h["version"] == version]
        if not match:
            have = sorted(h["version"] for h in stored if h["ramp"] == ramp)
            raise ValueError(f"ramp {ramp} has no head version {version} for the model as "
                             f"prepared now (stored: {have or 'none'}; 0 = the prepared head)")
        heads[ramp] = match[0]["file"]
    return heads


def active_set(spec: str | None, ramps: list[int], in_force: list[int] | None,
               caps: Callable[[], list[int]] = list) -> list[int]:
    """The active ramps ``--active`` asks for: ``all``, ``none`` (vanilla), ``caps`` (the
    depth caps SuperServe's lever wants: ``caps()``, the model's
    :func:`~services.exits.depth_caps.lever_caps`) or a comma list; without it the set in
    force, so a threshold, a head pin or a mode change leaves the deployment's ramps alone
    (every ramp for a model with no config yet)."""
    if spec is None:
        return list(in_force) if in_force is not None else list(ramps)
    word = spec.strip().lower()
    if word == "none":
        return []
    if word == "all":
        return list(ramps)
    if word == "caps":
        chosen = caps()
        if not chosen:
            raise ValueError("--active caps: the model has no trained ramp to cap at")
        return chosen
    try:
        chosen = [int(a) for a in spec.split(",") if a.strip()]
    except ValueError:
        raise ValueError(f"--active {spec!r}: use all, none, caps or a comma list of ramps "
                         f"(model has {ramps})") from None
    unknown = set(chosen) - set(ramps)
    if unknown:
        raise ValueError(f"unknown ramp(s) {sorted(unknown)}; model has {ramps}")
    return chosen


def thresholds_asked(current: dict[int, float], active: list[int], threshold: float | None,
                     sets: list[str]) -> dict[int, float]:
    """``current`` with ``--threshold`` applied to the active ramps and each ``--set
    RAMP=THRESHOLD``; ValueError for a ``--set`` that is not one."""
    out = dict(current)
    if threshold is not None:
        out.update(dict.fromkeys(active, threshold))
    for s in sets:
        ramp, _, value = s.partition("=")
        try:
            out[int(ramp)] = float(value)
        except ValueError:
            raise ValueError(f"--set {s!r}: use RAMP=THRESHOLD, e.g. --set 3=0.2") from None
    return out


def budget_note(cfg: Config, model: str, active: list[int], mode: str) -> str | None:
    """``over_budget`` of the model as prepared here (None without a manifest: prepared on
    another machine, as in compose)."""
    from services.exits.latency_profile import LatencyProfile
    from services.runtime.manifest import Manifest

    if mode != "latency" or not active:
        return None
    try:
        manifest = Manifest.load(cfg.models_dir / model)
    except (OSError, ValueError, KeyError):  # not prepared here (compose): nothing to cost
        return None
    return over_budget(LatencyProfile.from_manifest(manifest),
                       sorted(r.index for r in manifest.ramps), active, cfg.ramp_budget)


def over_budget(prof, ramp_ids: list[int], active: list[int], budget: float) -> str | None:
    """A note when the active ramps cost more than ``budget`` of the full model (costed as a
    worker pays them, ``prof`` with one site per ramp of ``ramp_ids``): an operator may go
    over it by hand, but should know what every latency-mode request then pays."""
    cost = sum(float(prof.ramp_cost_ms[ramp_ids.index(r)]) for r in active if r in ramp_ids)
    if cost <= budget * prof.full_ms:
        return None
    return (f"note: the active ramps add {cost:.3f} ms, {cost / prof.full_ms:.1%} of the full "
            f"model's {prof.full_ms:.3f} ms, over the ramp budget ({budget:.1%}, "
            "OFFRAMP_RAMP_BUDGET): every latency-mode request pays them")


def set_exit_config(cfg: Config, nats_url: str, model: str, threshold: float | None,
                    sets: list[str], active: str | None, reason: str,
                    head_pins: list[str] | None = None, mode: str | None = None,
                    say=print) -> int:
    store = Store(cfg.database_url)
    try:
        ramps = [r["idx"] if "idx" in r else r["index"] for r in store.ramps(model)]
        if not ramps:
            say(f"error: model {model!r} is not registered (run `offramp up` or `offramp prepare`)")
            return 2
        latest = store.latest_exit_config(model)
        mode = mode or (latest.mode if latest else "latency")
        try:
            active_ramps = active_set(active, ramps, None if latest is None else latest.active,
                                      lambda: lever_caps(store.model(model)["manifest"]))
            thresholds = thresholds_asked(dict(latest.thresholds) if latest else
                                          dict.fromkeys(ramps, 0.0), active_ramps, threshold,
                                          sets)
            heads = pinned_heads(store, model, dict(latest.heads) if latest else {},
                                 head_pins or [])
            if set(thresholds) - set(ramps):
                raise ValueError(f"unknown ramp(s) {sorted(set(thresholds) - set(ramps))}; "
                                 f"model has {ramps}")
            # what workers would refuse is not stored either
            ExitConfig(model, 0, mode, thresholds, active_ramps, heads=heads).check()
            if threshold is not None:  # checked even where no active ramp takes it
                ExitConfig(model, 0, mode, dict.fromkeys(ramps, threshold), ramps).check()
        except ValueError as exc:
            say(f"error: {exc}")
            return 2
        row = store.save_exit_config(model, thresholds, active_ramps, mode, reason, heads)
    finally:
        store.close()
    idle = sorted({int(x.partition("=")[0]) for x in sets} - set(active_ramps))
    if idle and active_ramps:
        say(f"note: ramp(s) {idle} are not active; their thresholds apply once they are "
            "(--active)")
    if (note := budget_note(cfg, model, active_ramps, row.mode)) is not None:
        say(note)
    if active is None and not active_ramps and (threshold is not None or sets):
        say("note: no ramp is active in the config in force, so no threshold applies "
            "(--active all or a list turns ramps on)")
    config = row.message()

    async def publish() -> None:
        nc = await bus.connect(nats_url, "offramp-exit-config", connect_timeout=3,
                               login=login_for(cfg, "admin"))
        await nc.publish(subjects.exit_config(model), config.encode())
        await nc.flush()
        await nc.close()

    try:
        asyncio.run(publish())
        say(f"exit config v{row.version} for {model} ({row.mode} mode): thresholds={row.thresholds} "
              f"active={row.active} heads={row.heads or 'prepared'}")
    except RuntimeError as exc:
        say(f"stored exit config v{row.version}; not broadcast ({exc}); workers load it on start")
    return 0
