"""Configuration from ``OFFRAMP_*`` environment variables, with documented defaults.

Every service reads its settings through :func:`load`; nothing else looks at the
environment, so the README's configuration table and this file stay in step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def _env(name: str, default: str) -> str:
    value = os.environ.get(name)
    return default if value is None or value == "" else value


@dataclass(frozen=True)
class Config:
    home: Path
    models_dir: Path
    database_url: str
    nats_url: str | None
    models: tuple[str, ...]
    log_level: str
    queue_limit: int
    max_batch: int
    batch_timeout_ms: float
    default_slo_ms: float
    heartbeat_ms: float
    worker_credit: int
    monitor_window: int
    request_timeout_s: float
    device: str
    ort_threads: int
    accuracy_loss: float = 0.01
    ramp_budget: float = 0.02
    adapt: bool = False
    nats_procs: int = 0
    ort_spin: str = "off"
    feedback_backlog: int = 8
    inline_ms: float = 5.0
    tuner_native: bool = True
    # share of batches whose pooled ramp features a last-stage worker computes and publishes
    # for online ramp refits (0: no features, no refits), at most ramp_feature_max_per_s
    # samples per worker; 0.25 keeps their cost (~6 % of a batch) within the 2 % ramp budget
    ramp_feature_rate: float = 0.25
    ramp_feature_max_per_s: float = 200.0
    # while few rows exit early, sample this many times the rate from credit banked while
    # most do (the long-run share stays the rate; 1: a fixed rate)
    ramp_feature_boost: float = 2.0
    shadow_rate: float = 0.05  # compute mode: share of requests kept as feedback (shadow)
    profile_window_s: float = 10.0  # batch-profile window of the profiler (E3 uses 2 min)
    plan_interval_s: float = 120.0  # the optimizer re-plans at least this often
    plan_slack: float = 0.2         # share of the SLO a plan keeps free (E3's slack)
    plan_alpha: float = 1.0         # a plan costs at most alpha x vanilla serving
    # latency mode: a worker that runs the whole model caps a ramp that answered wrongly at
    # once, until the next exit config (services/exits/exit_guard.py)
    exit_guard: bool = True
    refit: bool = True  # the tuner refits ramp heads from the features (needs a rate > 0)
    gc_freeze: bool = True  # services freeze their startup heap (services/common/gc_pauses.py)
    metrics_port: int | None = None  # None: no metrics (`offramp up` gives each child one)
    metrics_bind: str = "127.0.0.1"
    nats_credentials: Path | None = None  # role credentials for a server the user runs
    # how routers choose each batch of a model served by variant (one with variant profiles
    # in the store): fixed (the model as prepared), slackfit, maxacc, maxbatch, infaas, or
    # variant=KEY (Clipper+: that one variant); models without profiles batch as fixed
    router_policy: str = "fixed"
    variant_overhead_ms: float = 5.0  # taken off a request's slack: the hops besides compute
    # a variant batch's profiled time may fill the slack divided by this (and by the live
    # slowdown): live batch times scatter around their mean, and SlackFit spends all the
    # slack it is given, so without headroom its answers land at the SLO's edge
    variant_headroom: float = 1.5
    # an LLM worker's KV cache budget bounds the streams it serves at once: each gets
    # llm_slot_tokens tokens of KV at every layer; an exit head answers at llm_threshold
    kv_budget_mb: float = 256.0
    llm_slot_tokens: int = 1024
    llm_threshold: float = 0.9
    # the exit heads an LLM worker evaluates ("" none, "all", or layers "24,27"): each costs
    # a vocabulary projection, about five of SmolLM2's layers at batch 1 (docs/benchmarks.md)
    llm_heads: str = ""
    # the layers an LLM worker loads (0: all): HELIOS's greedy partial loading, fixed by the
    # operator; the exit head there answers every token that gets that deep
    llm_depth: int = 0
    # HELIOS: a new assessment every helios_ri requests of a generative model, starting
    # with helios_eval_prompts requests on each candidate (004 §3.3: 150 and 5)
    helios_ri: int = 150
    helios_eval_prompts: int = 5
    # a candidate meets HELIOS's SLO only within this share of the best one's perplexity
    helios_ppl_rise: float = 0.05

    def as_env(self) -> dict[str, str]:
        """The environment a child service needs to see this same configuration."""
        env = {
            "OFFRAMP_HOME": str(self.home),
            "OFFRAMP_MODELS_DIR": str(self.models_dir),
            "OFFRAMP_DATABASE_URL": self.database_url,
            "OFFRAMP_MODELS": ",".join(self.models),
            "OFFRAMP_LOG_LEVEL": self.log_level,
            "OFFRAMP_QUEUE_LIMIT": str(self.queue_limit),
            "OFFRAMP_MAX_BATCH": str(self.max_batch),
            "OFFRAMP_BATCH_TIMEOUT_MS": str(self.batch_timeout_ms),
            "OFFRAMP_DEFAULT_SLO_MS": str(self.default_slo_ms),
            "OFFRAMP_HEARTBEAT_MS": str(self.heartbeat_ms),
            "OFFRAMP_WORKER_CREDIT": str(self.worker_credit),
            "OFFRAMP_MONITOR_WINDOW": str(self.monitor_window),
            "OFFRAMP_REQUEST_TIMEOUT_S": str(self.request_timeout_s),
            "OFFRAMP_DEVICE": self.device,
            "OFFRAMP_ORT_THREADS": str(self.ort_threads),
            "OFFRAMP_ACCURACY_LOSS": str(self.accuracy_loss),
            "OFFRAMP_RAMP_BUDGET": str(self.ramp_budget),
            "OFFRAMP_ADAPT": "1" if self.adapt else "0",
            "OFFRAMP_NATS_PROCS": str(self.nats_procs),
            "OFFRAMP_ORT_SPIN": self.ort_spin,
            "OFFRAMP_FEEDBACK_BACKLOG": str(self.feedback_backlog),
            "OFFRAMP_INLINE_MS": str(self.inline_ms),
            "OFFRAMP_TUNER_NATIVE": "1" if self.tuner_native else "0",
            "OFFRAMP_RAMP_FEATURE_RATE": str(self.ramp_feature_rate),
            "OFFRAMP_RAMP_FEATURE_MAX_PER_S": str(self.ramp_feature_max_per_s),
            "OFFRAMP_RAMP_FEATURE_BOOST": str(self.ramp_feature_boost),
            "OFFRAMP_REFIT": "1" if self.refit else "0",
            "OFFRAMP_EXIT_GUARD": "1" if self.exit_guard else "0",
            "OFFRAMP_GC_FREEZE": "1" if self.gc_freeze else "0",
            "OFFRAMP_SHADOW_RATE": str(self.shadow_rate),
            "OFFRAMP_PROFILE_WINDOW_S": str(self.profile_window_s),
            "OFFRAMP_PLAN_INTERVAL_S": str(self.plan_interval_s),
            "OFFRAMP_PLAN_SLACK": str(self.plan_slack),
            "OFFRAMP_PLAN_ALPHA": str(self.plan_alpha),
            "OFFRAMP_METRICS_BIND": self.metrics_bind,
            "OFFRAMP_ROUTER_POLICY": self.router_policy,
            "OFFRAMP_VARIANT_OVERHEAD_MS": str(self.variant_overhead_ms),
            "OFFRAMP_VARIANT_HEADROOM": str(self.variant_headroom),
            "OFFRAMP_KV_BUDGET_MB": str(self.kv_budget_mb),
            "OFFRAMP_LLM_SLOT_TOKENS": str(self.llm_slot_tokens),
            "OFFRAMP_LLM_THRESHOLD": str(self.llm_threshold),
            "OFFRAMP_LLM_HEADS": self.llm_heads,
            "OFFRAMP_LLM_DEPTH": str(self.llm_depth),
            "OFFRAMP_HELIOS_RI": str(self.helios_ri),
            "OFFRAMP_HELIOS_EVAL_PROMPTS": str(self.helios_eval_prompts),
            "OFFRAMP_HELIOS_PPL_RISE": str(self.helios_ppl_rise),
        }
        if self.nats_url:
            env["OFFRAMP_NATS_URL"] = self.nats_url
        if self.metrics_port is not None:
            env["OFFRAMP_METRICS_PORT"] = str(self.metrics_port)
        if self.nats_credentials:
            env["OFFRAMP_NATS_CREDENTIALS"] = str(self.nats_credentials)
        return env


# (variable, default, meaning) — rendered into the README's configuration table.
DOCUMENTED = [
    ("OFFRAMP_HOME", "~/.offramp", "state folder: store file, model artifacts, NATS data, logs"),
    ("OFFRAMP_MODELS_DIR", "$OFFRAMP_HOME/models", "prepared model artifacts"),
    ("OFFRAMP_DATABASE_URL", "sqlite:///$OFFRAMP_HOME/offramp.db", "SQL store (PostgreSQL URL for clusters)"),
    ("OFFRAMP_NATS_URL", "(unset: `offramp up` starts its own)", "NATS server to use"),
    ("OFFRAMP_NATS_CREDENTIALS", "$OFFRAMP_HOME/nats/credentials.json", "each role's NATS user and password (`offramp up` writes them; see Security)"),
    ("OFFRAMP_MODELS", "efficientnet-lite0", "models `offramp up` serves (comma list)"),
    ("OFFRAMP_LOG_LEVEL", "INFO", "log level of every service"),
    ("OFFRAMP_QUEUE_LIMIT", "1024", "requests queued per model before `overloaded`"),
    ("OFFRAMP_MAX_BATCH", "16", "largest batch the router dispatches"),
    ("OFFRAMP_BATCH_TIMEOUT_MS", "0", "how long a partial batch may wait for more requests"),
    ("OFFRAMP_DEFAULT_SLO_MS", "1000", "SLO of a request that names none"),
    ("OFFRAMP_HEARTBEAT_MS", "200", "worker heartbeat period (dead after 3 missed)"),
    ("OFFRAMP_WORKER_CREDIT", "2", "batches a worker may hold at once (running + queued)"),
    ("OFFRAMP_MONITOR_WINDOW", "16", "samples per monitor window"),
    ("OFFRAMP_REQUEST_TIMEOUT_S", "5", "client-side timeout of CLI requests"),
    ("OFFRAMP_DEVICE", "auto", "auto | cpu | cuda: ONNX Runtime execution provider"),
    ("OFFRAMP_ORT_THREADS", "0", "ONNX Runtime intra-op threads (0 = runtime default)"),
    ("OFFRAMP_ORT_SPIN", "off", "off | auto | on: a worker's intra-op threads spin-wait between operators in runs without active ramps (auto: on when `offramp up` runs one worker on the host, else off); runs with active ramps never spin"),
    ("OFFRAMP_FEEDBACK_BACKLOG", "8", "batches whose answers all left early that a worker may set aside, cutting their run short for a request that waits, and re-run for the monitor's feedback when idle (0: every run goes to the end)"),
    ("OFFRAMP_INLINE_MS", "5", "a batch whose profiled compute is below this many ms runs on the worker's event loop (no thread hand-off; its early answers leave at once, but a run with only feedback left cannot give way); 0: every batch runs in a thread"),
    ("OFFRAMP_ACCURACY_LOSS", "0.01", "accuracy constraint: largest allowed loss of agreement with the final model"),
    ("OFFRAMP_RAMP_BUDGET", "0.02", "worst-case latency the active ramps may add (their measured serving cost), as a share of the model's"),
    ("OFFRAMP_ADAPT", "0", "1: `offramp up` also runs the tuner (continual exit adaptation)"),
    ("OFFRAMP_SHADOW_RATE", "0.05", "compute mode: share of requests (a seeded hash of the id) whose records are complete feedback; those that exit run on to the final layer as low-priority shadow work"),
    ("OFFRAMP_PROFILE_WINDOW_S", "10", "window of the profiler's batch profiles: survival after each ramp, observed and forecast (ARIMA) per window"),
    ("OFFRAMP_PLAN_INTERVAL_S", "120", "the optimizer re-plans at least this often (also on drift and when the pool changes)"),
    ("OFFRAMP_PLAN_SLACK", "0.2", "share of the SLO a deployment plan keeps free; also the longest a stage holds a partial batch"),
    ("OFFRAMP_PLAN_ALPHA", "1", "a deployment plan may cost at most this many times vanilla serving (device-seconds per answer)"),
    ("OFFRAMP_ROUTER_POLICY", "fixed", "how routers pick each batch's variant for a model with variant profiles (a supernet): `fixed` (the model as prepared), `slackfit`, `maxacc`, `maxbatch`, `infaas` (the cheapest), or `variant=KEY` (one subnet, Clipper+)"),
    ("OFFRAMP_VARIANT_OVERHEAD_MS", "5", "variant policies: milliseconds of a request's slack kept for the hops around a batch's compute"),
    ("OFFRAMP_KV_BUDGET_MB", "256", "an LLM worker's KV cache budget: the streams it serves at once are this over one stream's KV (OFFRAMP_LLM_SLOT_TOKENS tokens at every layer)"),
    ("OFFRAMP_LLM_SLOT_TOKENS", "1024", "tokens (prompt and output) one generation stream may hold"),
    ("OFFRAMP_LLM_THRESHOLD", "0.9", "an LLM exit head answers a token when its top probability reaches this"),
    ("OFFRAMP_LLM_HEADS", "(none)", "the exit heads an LLM worker evaluates: `all`, `last` (its deepest), or layers such as `24,27`; each costs a vocabulary projection"),
    ("OFFRAMP_TUNER_NATIVE", "1", "0: the tuner climbs in Python instead of its compiled climb (same decisions; for comparison)"),
    ("OFFRAMP_NATS_PROCS", "0", "GOMAXPROCS of the NATS server `offramp up` starts (0 = 1 on machines of up to 4 cores, else Go's default)"),
    ("OFFRAMP_METRICS_PORT", "(unset: off; `offramp up`: a free port per service)", "port of a service's Prometheus `/metrics`; `offramp up` gives its services consecutive ports from it and lists them in `offramp status`"),
    ("OFFRAMP_METRICS_BIND", "127.0.0.1", "address the metrics port listens on (0.0.0.0 in containers)"),
]


ORT_SPIN_SETTINGS = ("auto", "on", "off")  # see services.runtime.stage.spin_for
DEVICES = ("auto", "cpu", "cuda")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class ConfigError(ValueError):
    """An ``OFFRAMP_*`` variable holds a value the services cannot use."""


def load() -> Config:
    try:
        return _load()
    except ConfigError:
        raise
    except ValueError as exc:  # e.g. int("abc"): say which setting is wrong
        raise ConfigError(f"bad OFFRAMP_* setting: {exc}") from None


def _load() -> Config:
    home = Path(_env("OFFRAMP_HOME", str(Path.home() / ".offramp"))).expanduser()
    models_dir = Path(_env("OFFRAMP_MODELS_DIR", str(home / "models"))).expanduser()
    return Config(
        home=home,
        models_dir=models_dir,
        database_url=_env("OFFRAMP_DATABASE_URL", f"sqlite:///{home / 'offramp.db'}"),
        nats_url=os.environ.get("OFFRAMP_NATS_URL") or None,
        models=tuple(m.strip() for m in _env("OFFRAMP_MODELS", "efficientnet-lite0").split(",") if m.strip()),
        log_level=_choice("OFFRAMP_LOG_LEVEL", "INFO", LOG_LEVELS).upper(),
        queue_limit=_at_least("OFFRAMP_QUEUE_LIMIT", "1024", 1),
        max_batch=_at_least("OFFRAMP_MAX_BATCH", "16", 1),
        batch_timeout_ms=_non_negative_float("OFFRAMP_BATCH_TIMEOUT_MS", "0"),
        default_slo_ms=_positive_float("OFFRAMP_DEFAULT_SLO_MS", "1000"),
        heartbeat_ms=_positive_float("OFFRAMP_HEARTBEAT_MS", "200"),
        worker_credit=_at_least("OFFRAMP_WORKER_CREDIT", "2", 1),
        monitor_window=_at_least("OFFRAMP_MONITOR_WINDOW", "16", 1),
        request_timeout_s=_positive_float("OFFRAMP_REQUEST_TIMEOUT_S", "5"),
        device=_choice("OFFRAMP_DEVICE", "auto", DEVICES),
        ort_threads=_non_negative("OFFRAMP_ORT_THREADS", "0"),
        accuracy_loss=_below_one("OFFRAMP_ACCURACY_LOSS", "0.01"),
        ramp_budget=_non_negative_float("OFFRAMP_RAMP_BUDGET", "0.02"),
        adapt=_env("OFFRAMP_ADAPT", "0").lower() in ("1", "true", "yes", "on"),
        nats_procs=_non_negative("OFFRAMP_NATS_PROCS", "0"),
        ort_spin=_choice("OFFRAMP_ORT_SPIN", "off", ORT_SPIN_SETTINGS),
        feedback_backlog=_non_negative("OFFRAMP_FEEDBACK_BACKLOG", "8"),
        inline_ms=_non_negative_float("OFFRAMP_INLINE_MS", "5"),
        tuner_native=_env("OFFRAMP_TUNER_NATIVE", "1") != "0",
        ramp_feature_rate=_fraction("OFFRAMP_RAMP_FEATURE_RATE", "0.25"),
        ramp_feature_max_per_s=_non_negative_float("OFFRAMP_RAMP_FEATURE_MAX_PER_S", "200"),
        ramp_feature_boost=_at_least_one("OFFRAMP_RAMP_FEATURE_BOOST", "2"),
        refit=_env("OFFRAMP_REFIT", "1") != "0",
        exit_guard=_env("OFFRAMP_EXIT_GUARD", "1") != "0",
        gc_freeze=_env("OFFRAMP_GC_FREEZE", "1") != "0",
        shadow_rate=_fraction("OFFRAMP_SHADOW_RATE", "0.05"),
        profile_window_s=_positive_float("OFFRAMP_PROFILE_WINDOW_S", "10"),
        plan_interval_s=_positive_float("OFFRAMP_PLAN_INTERVAL_S", "120"),
        plan_slack=_below_one("OFFRAMP_PLAN_SLACK", "0.2"),
        plan_alpha=_positive_float("OFFRAMP_PLAN_ALPHA", "1"),
        metrics_port=_port("OFFRAMP_METRICS_PORT"),
        metrics_bind=_env("OFFRAMP_METRICS_BIND", "127.0.0.1"),
        nats_credentials=Path(os.environ["OFFRAMP_NATS_CREDENTIALS"]).expanduser()
        if os.environ.get("OFFRAMP_NATS_CREDENTIALS") else None,
        router_policy=_router_policy(_env("OFFRAMP_ROUTER_POLICY", "fixed")),
        variant_overhead_ms=_non_negative_float("OFFRAMP_VARIANT_OVERHEAD_MS", "5"),
        variant_headroom=_at_least_one("OFFRAMP_VARIANT_HEADROOM", "1.5"),
        kv_budget_mb=_positive_float("OFFRAMP_KV_BUDGET_MB", "256"),
        llm_slot_tokens=int(_positive_float("OFFRAMP_LLM_SLOT_TOKENS", "1024")),
        llm_threshold=_fraction("OFFRAMP_LLM_THRESHOLD", "0.9"),
        llm_heads=_env("OFFRAMP_LLM_HEADS", "").strip(),
        llm_depth=_non_negative("OFFRAMP_LLM_DEPTH", "0"),
        helios_ri=_at_least("OFFRAMP_HELIOS_RI", "150", 1),
        helios_eval_prompts=_at_least("OFFRAMP_HELIOS_EVAL_PROMPTS", "5", 1),
        helios_ppl_rise=_non_negative_float("OFFRAMP_HELIOS_PPL_RISE", "0.05"),
    )


ROUTER_POLICIES = ("fixed", "slackfit", "maxacc", "maxbatch", "infaas")


def _router_policy(value: str) -> str:
    v = value.strip()
    if v.lower() in ROUTER_POLICIES:
        return v.lower()
    if v.startswith("variant=") and len(v) > len("variant="):
        return v
    raise ConfigError(f"OFFRAMP_ROUTER_POLICY={value!r}: expected one of "
                      f"{', '.join(ROUTER_POLICIES)}, or variant=KEY")


def _choice(name: str, default: str, allowed: tuple[str, ...]) -> str:
    value = _env(name, default).lower()
    if value not in allowed:
        raise ConfigError(f"{name}={value!r}: use one of {', '.join(allowed)}")
    return value


def _at_least(name: str, default: str, low: int) -> int:
    text = _env(name, default)
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r}: not an integer") from None
    if value < low:
        raise ConfigError(f"{name}={value}: must be >= {low}")
    return value


def _non_negative(name: str, default: str) -> int:
    return _at_least(name, default, 0)


def _non_negative_float(name: str, default: str) -> float:
    text = _env(name, default)
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r}: not a number") from None
    if not value >= 0 or value == float("inf"):
        raise ConfigError(f"{name}={value}: must be a finite number >= 0")
    return value


def _at_least_one(name: str, default: str) -> float:
    value = _non_negative_float(name, default)
    if value < 1:
        raise ConfigError(f"{name}={value}: must be >= 1")
    return value


def _positive_float(name: str, default: str) -> float:
    value = _non_negative_float(name, default)
    if value == 0:
        raise ConfigError(f"{name}=0: must be > 0")
    return value


def _below_one(name: str, default: str) -> float:
    value = _non_negative_float(name, default)
    if value >= 1:
        raise ConfigError(f"{name}={value}: must lie in [0, 1)")
    return value


def _port(name: str) -> int | None:
    """A port number, or None when the variable is unset or empty."""
    text = _env(name, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) > 65535:
        raise ConfigError(f"{name}={text!r}: not a port number (0-65535)")
    return int(text)


def _fraction(name: str, default: str) -> float:
    value = _non_negative_float(name, default)
    if value > 1:
        raise ConfigError(f"{name}={value}: must be a fraction in [0, 1]")
    return value
