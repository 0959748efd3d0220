"""Who may use which subject: the bus permissions of every role that connects to NATS.

``offramp up`` (and ``offramp credentials --server-config`` for a server the user runs)
turns this table into the server's ``authorization`` block, so a connection can publish
and subscribe only where its role's service actually does. Everything not listed is
denied. ``schemas/README.md`` documents the same table for people writing clients.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas import subjects

P = subjects.PREFIX
STREAM = subjects.TELEMETRY_STREAM
INBOX_ROOT = "_INBOX"
REPLIES = f"{INBOX_ROOT}.>"  # every requester's inbox: where answers are published

# JetStream API subjects for the telemetry stream only: create (if missing) and read info
# of that stream; no role may delete, purge or edit it, or touch any other stream.
STREAM_KEEP = (f"$JS.API.STREAM.CREATE.{STREAM}", f"$JS.API.STREAM.INFO.{STREAM}")


def inbox_prefix(user: str) -> str:
    """The inbox a connection of ``user`` must use: its subscribe permission covers only
    this prefix, so one role's replies are never readable by another."""
    return f"{INBOX_ROOT}.{user}"


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]  # the role's own inbox is always added
    # May answer the requests it receives (NATS allow_responses), without a publish grant
    # on every inbox: for roles that only answer while the request is in hand.
    responds: bool = False


ROLES: dict[str, Permissions] = {
    # Applications: send requests, read their own replies; nothing else.
    "client": Permissions(
        publish=(f"{P}.infer.>", subjects.MODELS, f"{P}.generate.>"),
        subscribe=()),
    # The `offramp` CLI's control commands: status, exit configs, and what a client may do.
    "admin": Permissions(
        publish=(f"{P}.infer.>", subjects.MODELS, f"{P}.generate.>", f"{P}.status.*",
                 f"{P}.config.*"),
        subscribe=()),
    "router": Permissions(
        publish=(REPLIES, f"{P}.work.*", f"{P}.llm.*", f"{P}.telemetry.requests.*",
                 *STREAM_KEEP),
        subscribe=(subjects.INFER_ALL, subjects.GENERATE_ALL, subjects.MODELS,
                   subjects.STATUS_ROUTER, subjects.HEARTBEAT, f"{P}.results.*")),
    # Workers answer clients directly (the router passes each request's inbox along).
    "worker": Permissions(
        publish=(REPLIES, f"{P}.stage.*.*", f"{P}.results.*", subjects.HEARTBEAT,
                 f"{P}.telemetry.samples.*", f"{P}.telemetry.requests.*", f"{P}.features.*",
                 f"{P}.telemetry.generation.*"),
        subscribe=(f"{P}.work.*", f"{P}.llm.*", f"{P}.stage.*.*", f"{P}.config.*",
                   f"{P}.plan.*", f"{P}.helios.decision.*")),
    "monitor": Permissions(
        publish=(*STREAM_KEEP,
                 f"$JS.API.CONSUMER.CREATE.{STREAM}.>",
                 f"$JS.API.CONSUMER.DURABLE.CREATE.{STREAM}.{subjects.MONITOR_DURABLE}",
                 f"$JS.API.CONSUMER.INFO.{STREAM}.{subjects.MONITOR_DURABLE}",
                 f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{subjects.MONITOR_DURABLE}",
                 f"$JS.ACK.{STREAM}.>"),
        subscribe=(subjects.STATUS_MONITOR,), responds=True),
    # Debugging and taps: reads every offramp subject, publishes nothing (no JetStream
    # either: a tap of the stored telemetry is a consumer the operator adds as admin of
    # the server, not of offramp).
    "observer": Permissions(publish=(), subscribe=(f"{P}.>",)),
    # `offramp bench overhead`: a client that also times a bare relay -> echo path (the
    # transport floor) on subjects of its own.
    "bench": Permissions(publish=(f"{P}.infer.>", subjects.MODELS, f"{P}.bench.>", REPLIES),
                         subscribe=(f"{P}.bench.>",)),
    # Deployment plans to pool workers; heartbeats tell it how fast each worker runs.
    # HELIOS: decisions to LLM workers, on the tuner's breach alerts.
    "optimizer": Permissions(publish=(f"{P}.plan.*", f"{P}.helios.decision.*"),
                             subscribe=(subjects.HEARTBEAT, f"{P}.helios.breach.*")),
    "tuner": Permissions(
        publish=(f"{P}.config.*", f"{P}.helios.breach.*"),
        subscribe=(f"{P}.telemetry.samples.*", f"{P}.config.*", f"{P}.features.*",
                   f"{P}.telemetry.generation.*", f"{P}.helios.decision.*")),
}

# The profiler reads and writes the store only: it has no bus role.
