"""`offramp up` serving a supernet by variant: SlackFit picks each batch's subnet from the
store's profiles, the worker runs it in place, every request is answered once with the
subnet it used, and the store keeps that subnet per request."""

from __future__ import annotations

import asyncio
import collections

import numpy as np
import pytest

from services.loadgen.drive import drive_open
from services.runtime.manifest import Manifest
from services.workloads import arrivals as arr
from services.zoo import chain_cnn
from tests.conftest import SUPERNET_TINY
from tests.e2e.conftest import wait_for

pytestmark = pytest.mark.e2e
MODEL = SUPERNET_TINY
STACK_ENV = {"OFFRAMP_ROUTER_POLICY": "slackfit", "OFFRAMP_WORKER_CREDIT": "1"}
N = 240


async def _bursty_load(stack) -> list:
    nc = await stack.connect("client", "e2e-slackfit")
    images = chain_cnn.sample_inputs(N, 3)["image"]
    times = arr.make_arrivals("bursty:30:variant=90,cv2=8", n=N, seed=5)
    try:
        return await drive_open(nc, MODEL, [{"image": x} for x in images], times,
                                slo_ms=5000.0, timeout=30.0)
    finally:
        await nc.close()


def test_slackfit_serves_subnets_by_variant_under_a_bursty_trace(supernet_dir, stack):
    manifest = Manifest.load(supernet_dir / MODEL)
    served = {r["subnet"] for r in manifest.meta["subnets"] if r["pareto"]}
    outs = asyncio.run(_bursty_load(stack))
    assert len(outs) == N and len({o.request_id for o in outs}) == N
    assert all(o.ok or o.code in ("deadline_exceeded", "overloaded") for o in outs)
    ok = [o for o in outs if o.ok]
    assert len(ok) >= 0.9 * N, collections.Counter(o.code for o in outs)
    assert all(o.variant in served for o in ok)          # each reply names its subnet
    def stored():
        r = stack.sql("SELECT request_id, status, variant FROM requests WHERE model = ?", MODEL)
        return r if len(r) >= N else None

    rows = wait_for(stored, timeout=30.0)
    assert rows is not None and len(rows) == N            # one row per request, none twice
    by_id = {rid: (status, variant) for rid, status, variant in rows}
    assert all(by_id[o.request_id] == ("ok", o.variant) for o in ok)
    profiles = stack.sql("SELECT variant FROM subnet_profiles WHERE model = ? AND pareto",
                         MODEL)
    assert {v for (v,) in profiles} == served
    assert np.isfinite([o.latency_ms for o in ok]).all()
