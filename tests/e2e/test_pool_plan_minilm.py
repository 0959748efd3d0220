"""End to end, E3 pool mode on a real text model: `offramp up --workers 2 --plan auto` serves
minilm-topics in compute mode under load while the plan changes at least twice. Every
request is answered exactly once (an answer or an error code), some at a ramp and some at
the final layer, and there is a store row per plan."""

from __future__ import annotations

import asyncio
import time
import uuid

import numpy as np
import pytest

from schemas.codec import pack, unpack
from tests.e2e.conftest import wait_for

pytestmark = pytest.mark.e2e
MODEL = "minilm-topics"
STACK_ARGS = ["--workers", "2", "--plan", "auto"]
STACK_ENV = {"OFFRAMP_PROFILE_WINDOW_S": "2", "OFFRAMP_PLAN_INTERVAL_S": "4",
             "OFFRAMP_ORT_THREADS": "1"}
RATE = 25.0
SECONDS = 16.0
SLO_MS = 10000.0


def _texts(models_dir, n: int) -> list[dict[str, np.ndarray]]:
    from services.bench.e3_inputs import model_inputs
    from services.runtime.manifest import Manifest

    chunks, _ = model_inputs(Manifest.load(models_dir / MODEL), n, 3)
    out = []
    for c in chunks:
        rows = len(next(iter(c.values())))
        out += [{k: np.ascontiguousarray(v[i]) for k, v in c.items()} for i in range(rows)]
    return out[:n]


def test_minilm_in_compute_mode_while_plans_change(stack, models_dir):
    done = stack.cli("exit-config", MODEL, "--threshold", "0.3", "--active", "all")
    assert done.returncode == 0 and "compute mode" in done.stdout, done.stdout + done.stderr
    n = int(RATE * SECONDS)
    xs = _texts(models_dir, n)
    before = stack.sql("SELECT count(*) FROM deployment_plans WHERE model = ?", MODEL)[0][0]
    tag = uuid.uuid4().hex[:6]

    async def load() -> dict[int, list[dict]]:
        nc = await stack.connect("client", "e2e-pool-minilm")
        replies: dict[int, list[dict]] = {}

        async def on_reply(msg) -> None:
            replies.setdefault(int(msg.subject.rsplit(".", 1)[1]), []).append(unpack(msg.data))

        await nc.subscribe(f"_INBOX.client.pm{tag}.>", cb=on_reply)
        await nc.flush()
        start = time.monotonic()
        for i, x in enumerate(xs):
            await asyncio.sleep(max(0.0, start + i / RATE - time.monotonic()))
            await nc.publish(f"offramp.infer.{MODEL}", pack({"v": 1, "id": f"pm{tag}-{i}",
                                                           "inputs": x, "slo_ms": SLO_MS}),
                             reply=f"_INBOX.client.pm{tag}.{i}")
        await nc.flush()
        await asyncio.sleep(SLO_MS / 1e3 + 6)
        await nc.close()
        return replies

    replies = asyncio.run(load())
    assert sorted(replies) == list(range(n)), f"{n - len(replies)} requests got no reply"
    assert [i for i, got in replies.items() if len(got) > 1] == [], \
        "a request got two replies\n" + stack.warnings()
    ok = [r[0] for r in replies.values() if "error" not in r[0]]
    assert len(ok) > 0.8 * n
    assert any(r["early"] for r in ok) and any(not r["early"] for r in ok)
    plans = stack.sql("SELECT version, reason FROM deployment_plans WHERE model = ? "
                      "ORDER BY version", MODEL)
    assert len(plans) - before >= 2, plans
    assert len({v for v, _ in plans}) == len(plans)  # a row per version
    rows = wait_for(lambda: stack.sql(
        "SELECT count(DISTINCT request_id) FROM requests WHERE request_id LIKE ?",
        f"pm{tag}-%")[0][0] >= n, timeout=60)
    assert rows
