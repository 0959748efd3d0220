"""The adaptive loop live (`offramp up --adapt`) on EfficientNet-Lite0 and a video-like
stream: the tuner deploys versioned exit configs with their reasons, workers apply them,
and a tuner killed with SIGKILL resumes from the store with the same config version."""

from __future__ import annotations

import asyncio
import os
import signal

from services.loadgen.drive import drive
from tests.e2e.conftest import Stack, wait_for

MODEL = "efficientnet-lite0"


STACK_ARGS = ["--adapt"]
# A ramp's serving cost on a small CPU can exceed the default 2% budget: allow a few so the
# loop has ramps to tune and adjust.
STACK_ENV = {"OFFRAMP_RAMP_BUDGET": "0.25"}


def _send(stack: Stack, n: int, seed: int) -> list:
    from services.zoo.registry import sample_inputs

    frames = sample_inputs(MODEL, n, seed=seed)["image"]

    async def run():
        nc = await stack.connect("client", "e2e-adapt")
        outs = await drive(nc, MODEL, [{"image": f} for f in frames], concurrency=4, slo_ms=20000)
        await nc.close()
        return outs

    return asyncio.run(run())


def _tuned(stack: Stack) -> list:
    return stack.sql("select version, reason from exit_configs where model=? and reason like "
                     "'tuner %' order by version", MODEL)


def test_tuner_deploys_configs_and_resumes_after_sigkill(stack):
    assert "tuner" in stack.pids
    outs = _send(stack, 700, seed=0)
    assert all(o.ok for o in outs), {o.code for o in outs}
    # Ramp adjustment runs every 128 samples and tuning once 256 samples are in.
    assert wait_for(lambda: _tuned(stack), timeout=60), stack.sql(
        "select version, reason from exit_configs")
    latest = stack.sql("select max(version) from exit_configs where model=?", MODEL)[0][0]
    assert wait_for(lambda: stack.sql("select config_version from tuner_state where model=?",
                                      MODEL) == [(latest,)], timeout=30)
    # Workers apply the tuner's configs: later answers carry its version.
    later = _send(stack, 64, seed=1)
    assert max(o.config_version for o in later if o.ok) >= _tuned(stack)[0][0]

    os.kill(stack.pids["tuner"], signal.SIGKILL)  # the supervisor restarts it
    log = stack.home / "logs" / "tuner.log"
    assert wait_for(lambda: log.exists() and "tuner resumed" in log.read_text(), timeout=60), (
        log.read_text() if log.exists() else "no tuner log")
    # Resumed, not reset: no new config regressing to the defaults.
    assert stack.sql("select max(version) from exit_configs where model=?", MODEL)[0][0] >= latest
    defaults = stack.sql("select count(*) from exit_configs where model=? and version > ? and "
                         "reason like 'initial deployment%'", MODEL, latest)[0][0]
    assert defaults == 0
