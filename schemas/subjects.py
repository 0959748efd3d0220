"""NATS subject names: the one place they are spelled."""

from __future__ import annotations

PREFIX = "offramp"

MODELS = f"{PREFIX}.models"                      # request-reply: model metadata
STATUS_ROUTER = f"{PREFIX}.status.router"        # request-reply: router state
STATUS_MONITOR = f"{PREFIX}.status.monitor"      # request-reply: monitor state
HEARTBEAT = f"{PREFIX}.worker.heartbeat"         # worker -> router/status: liveness + credit
TELEMETRY_STREAM = "OFFRAMP_TELEMETRY"           # JetStream stream capturing telemetry.>
TELEMETRY_ALL = f"{PREFIX}.telemetry.>"

ROUTER_QUEUE = "offramp-router"
MONITOR_DURABLE = "offramp-monitor"


def infer(model: str) -> str:
    """Client requests (request-reply)."""
    return f"{PREFIX}.infer.{model}"


INFER_ALL = f"{PREFIX}.infer.*"


def generate(model: str) -> str:
    """Client generation requests (a stream of replies on the reply subject)."""
    return f"{PREFIX}.generate.{model}"


GENERATE_ALL = f"{PREFIX}.generate.*"


def llm_work(worker_id: str) -> str:
    """Generation requests a router hands to one LLM worker (the router holds its slots)."""
    return f"{PREFIX}.llm.{worker_id}"


def work(worker_id: str) -> str:
    """Batches addressed to one first-stage worker (the router holds its credit)."""
    return f"{PREFIX}.work.{worker_id}"


def stage(model: str, block: int) -> str:
    """Activations for the stage of ``model`` that starts at block ``block`` (queue group
    per stage). Keyed by block, not stage number, so a stage keeps its subject across
    layouts and deployment plans that cut at the same block."""
    return f"{PREFIX}.stage.{model}.{block}"


def stage_queue(model: str, block: int) -> str:
    return f"stage-{model}-{block}"


def plan(model: str) -> str:
    """Versioned deployment plans of ``model``, from the optimizer to pool workers."""
    return f"{PREFIX}.plan.{model}"


def results(router_id: str) -> str:
    """Early and final results flowing back to the router that owns the requests."""
    return f"{PREFIX}.results.{router_id}"


def exit_config(model: str) -> str:
    """Versioned exit configs broadcast to every worker of ``model``."""
    return f"{PREFIX}.config.{model}"


def telemetry_samples(model: str) -> str:
    """Per-batch sample telemetry from last-stage workers (stored in JetStream)."""
    return f"{PREFIX}.telemetry.samples.{model}"


def ramp_features(model: str) -> str:
    """Sampled pooled features at every ramp site, from last-stage workers to the tuner
    (plain publish, not stored: sampled feedback for online ramp refits)."""
    return f"{PREFIX}.features.{model}"


def telemetry_requests(model: str) -> str:
    """Per-request outcomes from the router (stored in JetStream)."""
    return f"{PREFIX}.telemetry.requests.{model}"


def telemetry_generation(model: str) -> str:
    """Per-stream outcomes from LLM workers: candidate, depth, tokens, exits, breaches
    (stored in JetStream)."""
    return f"{PREFIX}.telemetry.generation.{model}"


def helios_decision(model: str) -> str:
    """HELIOS's choice of candidate and loaded depth for ``model``, from the optimizer to its
    LLM workers and the tuner (re-broadcast so late joiners catch up)."""
    return f"{PREFIX}.helios.decision.{model}"


def helios_breach(model: str) -> str:
    """The tuner's Confidence Breach Counter tripped for ``model``: the optimizer decides
    between loading more layers and switching candidate."""
    return f"{PREFIX}.helios.breach.{model}"
