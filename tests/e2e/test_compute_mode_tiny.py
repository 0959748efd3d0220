"""End to end, compute mode (E3) on the tiny model split in two: under load every request is
answered once, by the ramp or final layer the full model run says; exited samples leave the
batch; the selected samples come back as feedback; the profiler's batch profile and the
request history agree on where samples left."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from schemas.messages import ExitConfig
from services.loadgen.drive import drive
from tests.e2e.conftest import wait_for

pytestmark = pytest.mark.e2e
MODEL = "tiny"
STACK_ARGS = ["--split", "tiny=2"]
STACK_ENV = {"OFFRAMP_SHADOW_RATE": "0.25", "OFFRAMP_PROFILE_WINDOW_S": "2"}
N = 300
THRESHOLD = 0.2  # on these inputs: about a third answer at the final layer


def _reference(models_dir: Path, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from services.runtime.manifest import Manifest
    from services.runtime.stage import StageRuntime
    from services.worker.stage_exec import execute

    d = models_dir / MODEL
    manifest = Manifest.load(d)
    rt = StageRuntime(d, manifest, 0, manifest.num_blocks)
    out = execute(rt, manifest.ramps, 0, manifest.num_blocks, {"x": x},
                  np.full(len(x), -1, np.int32),
                  ExitConfig(MODEL, 1, "latency", {0: 0.0, 1: 0.0, 2: 0.0}, [0, 1, 2]))
    return np.stack(out.ramp_pred), out.output.argmax(axis=1)


def test_compute_mode_answers_every_request_once_as_the_full_model_would(stack, models_dir):
    done = stack.cli("exit-config", MODEL, "--mode", "compute", "--threshold", str(THRESHOLD),
                     "--active", "0,1,2")
    assert done.returncode == 0 and "compute mode" in done.stdout, done.stdout + done.stderr
    version = int(done.stdout.split(" v", 1)[1].split()[0])
    x = np.random.default_rng(0).standard_normal((N, 16)).astype(np.float32)
    ramp_pred, final = _reference(models_dir, x)

    async def run():
        nc = await stack.connect("client", "e2e-compute")
        # a few warm-up rounds until every worker has the compute-mode config
        for _ in range(50):
            (o,) = await drive(nc, MODEL, [{"x": x[0]}], concurrency=1, slo_ms=5000)
            if o.ok and o.config_version == version:
                break
            await asyncio.sleep(0.2)
        outs = await drive(nc, MODEL, [{"x": row} for row in x], concurrency=16, slo_ms=5000)
        await nc.close()
        return outs

    outs = asyncio.run(run())
    assert len(outs) == N and all(o.ok for o in outs), Counter(o.code for o in outs)
    exits: Counter = Counter()
    for o in outs:
        assert o.config_version == version
        exits[o.exit] += 1
        assert o.label == (final[o.index] if o.exit < 0 else ramp_pred[o.exit][o.index]), o
    assert exits[-1] > 0 and exits[0] > 0 and len(exits) >= 3, exits
    ids = {o.request_id for o in outs}
    assert len(ids) == N  # once each
    # request history: one ok row per request, with the exit the client got
    rows = wait_for(lambda: stack.sql(
        "SELECT request_id, exit FROM requests WHERE model = ? AND config_version = ? "
        "AND status = 'ok'", MODEL, version) if len(stack.sql(
            "SELECT 1 FROM requests WHERE model = ? AND config_version = ?", MODEL,
            version)) >= N else None, timeout=30)
    assert rows and len({r[0] for r in rows}) >= N
    # the profiler's batch profile of those windows: survival after ramps 0..2
    profiles = wait_for(lambda: stack.sql(
        "SELECT ramp, samples, observed FROM batch_profiles WHERE model = ? AND "
        "config_version = ? AND observed IS NOT NULL", MODEL, version), timeout=40)
    assert profiles and {p[0] for p in profiles} == {0, 1, 2}
    assert all(0.0 <= p[2] <= 1.0 for p in profiles)
    # feedback: the monitor saw only the selected samples (about a quarter), all complete
    seen = wait_for(lambda: stack.sql(
        "SELECT coalesce(sum(samples), 0) FROM exit_profiles WHERE model = ? AND ramp = -1 "
        "AND config_version = ?", MODEL, version)[0][0] or None, timeout=30)
    assert seen is not None and 0.1 * N <= seen <= 0.45 * N, seen
