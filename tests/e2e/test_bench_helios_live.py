"""`offramp bench helios` live on `tiny-llm`: the candidate alone (fully loaded, exit heads)
and HELIOS each get a private stack and serve the same drifting stream; the JSON holds both
policies' figures, HELIOS's decisions (an evaluation of each candidate, then the greedy
depth), the worker's switches and the judge's perplexity. HELIOS's repository also holds a
twin of the model, which it evaluates and the worker switches to. Threshold 0: after the
evaluation every token leaves at the first head (layer 2), so HELIOS loads 2 layers;
clients pause between requests so that the decisions (monitor, profiler and HELIOS polls:
about 2 s) land inside the stream."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from services.prepare.llm_models import prepare_tiny
from tests.e2e.conftest import REPO

pytestmark = pytest.mark.e2e
MODEL = "tiny-llm"
REQUESTS = 20  # about 13 s of stream: the depth decision (polls of about 2 s) lands well inside it


def _bench(tmp_path, models: str, policies: str, twin: str | None = None) -> dict:
    """`offramp bench helios` live on a fresh home with tiny-llm prepared (and ``twin``, a
    copy of it under that name): its JSON."""
    from tests.conftest import llm_twin

    folder = tmp_path / "models"
    prepare_tiny(folder, log=lambda _: None)
    if twin:
        llm_twin(folder, twin)
    out = tmp_path / "live.json"
    env = {**os.environ, "OFFRAMP_HOME": str(tmp_path / "home"),
           "OFFRAMP_MODELS_DIR": str(folder)}
    for name in ("OFFRAMP_NATS_URL", "OFFRAMP_DATABASE_URL", "OFFRAMP_LLM_DEPTH"):
        env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, "-m", "services.cli", "bench", "helios", "--json", str(out),
         "--models", models, "--policies", policies, "--requests", str(REQUESTS),
         "--max-tokens", "6", "--prompt-tokens", "8", "--threshold", "0", "--ri", "100",
         "--eval-prompts", "2", "--concurrency", "1", "--think-ms", "600"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_live_bench_serves_the_candidate_alone_and_helios_with_a_second_candidate(tmp_path):
    # one stack run per policy: HELIOS's repository holds a twin of the model (same weights,
    # so a switch must not change the tokens), which it evaluates and the worker switches to
    doc = _bench(tmp_path, f"{MODEL},tiny-twin", f"alone:{MODEL},helios", twin="tiny-twin")
    assert doc["mode"] == "live" and doc["requests"] == REQUESTS
    assert set(doc["stream_kinds"]) == {"prose", "code"}
    pols = doc["policies"]
    assert list(pols) == [f"alone:{MODEL}", "helios"]
    for name, p in pols.items():
        assert (p["ok"], p["failed"], p["errors"]) == (REQUESTS, 0, []), (name, p["errors"])
        assert p["tokens"] > 0 and p["tokens_per_s"] > 0 and len(p["rows"]) == REQUESTS
        assert p["perplexity"] > 1 and 0 <= p["token_agreement"] <= 1
        assert p["memory_bytes_median"] > 0 and p["largest_batch"] == 1
    alone = pols[f"alone:{MODEL}"]
    assert not alone["adapt"] and "decisions" not in alone and alone["depths"] == {"6": REQUESTS}
    helios = pols["helios"]
    kinds = [(d["kind"], d["candidate"], d["depth"], d["assessment"])
             for d in helios["decisions"]]
    assert kinds[:2] == [("evaluate", MODEL, 6, 1), ("evaluate", "tiny-twin", 6, 1)], kinds
    assert all(d["worker_followed"] for d in helios["decisions"][:2])
    later = [d for d in helios["decisions"][2:] if d["depth"] == 2]
    assert later and later[0]["kind"] in ("unload", "switch", "load") and later[0]["worker_followed"], kinds
    assert helios["depths"].get("6", 0) >= 2 and helios["depths"].get("2", 0) > 0, helios["depths"]
    assert helios["slots_by_depth"]["2"] > helios["slots_by_depth"]["6"]
    assert helios["candidates"].get("tiny-twin", 0) >= 2, helios["candidates"]
    (first, *_) = helios["switches"]
    assert (first["from"], first["to"]) == (MODEL, "tiny-twin") and first["read_ms"] > 0
    assert (tmp_path / "live.svg").is_file()
