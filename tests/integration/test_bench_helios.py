"""``offramp bench helios --sim`` on two tiny candidates: ``tiny-llm`` (6 layers, seed 0) and a
variant made by the same preparation code with 8 layers and seed 1 (``tiny-llm-b``, heads
after layers 3 and 5). The recorder's trace is checked against Hugging Face on the spot; the
bench runs end to end through ``python -m services.cli``, recording both traces first,
then reuses them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from services.bench import helios_traces
from services.cli.main import main
from services.prepare.llm_models import prepare_tiny
from services.runtime.llm_model import load
from services.zoo import tiny_llm

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("tiny-llm", "tiny-llm-b")
POLICIES = ["alone:tiny-llm", "alone:tiny-llm-b", "helios", "helios-no-switch",
            "helios-no-greedy"]


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """An OFFRAMP_HOME with both tiny candidates prepared."""
    home = tmp_path_factory.mktemp("helios-home")
    prepare_tiny(home / "models", log=lambda _: None)
    with pytest.MonkeyPatch.context() as mp:  # the same recipe, deeper and seeded otherwise
        shallow = tiny_llm.config
        mp.setattr(tiny_llm, "NAME", MODELS[1])
        mp.setattr(tiny_llm, "SEED", 1)
        mp.setattr(tiny_llm, "config", lambda vocab, layers=6: shallow(vocab, 8))
        prepare_tiny(home / "models", log=lambda _: None)
    return home


def test_a_trace_holds_what_the_model_and_its_heads_say(home: Path):
    torch.set_num_threads(1)
    a, b = load(home / "models" / MODELS[0]), load(home / "models" / MODELS[1])
    assert (a.model.config.num_hidden_layers, b.model.config.num_hidden_layers) == (6, 8)
    prompts = [("prose", "The quick brown fox jumps over the lazy dog again."),
               ("code", "def add(x, y):\n    return x + y\n")]
    d = helios_traces.record(a, prompts, 5, 6, batches=(1, 2), repeats=1, log=lambda _: None)
    assert d["format"] == helios_traces.FORMAT and d["version"] == helios_traces.VERSION
    assert (d["n_layers"], d["head_layers"], d["judge"]) == (6, [2, 4], "tiny-llm")
    ids = a.tokenizer.encode(prompts[0][1])[:6]
    ref = a.model.generate(torch.tensor([ids]), max_new_tokens=5, min_new_tokens=5,
                           do_sample=False)[0, 6:].tolist()
    p = d["prompts"][0]
    assert p["full"]["token"] == ref and p["kind"] == "prose" and p["prompt_tokens"] == 6
    assert p["full"]["judge_logprob"] == p["full"]["logprob"]  # its own judge
    for h in p["heads"].values():
        assert len(h["token"]) == 5 and all(0 < c <= 1 for c in h["confidence"])
    assert d["memory"]["kv_bytes_per_token_layer"] == 2 * 2 * 16 * 4  # 2 KV heads of 16, fp32
    assert len(d["timing"]["step_ms"]) == 2 and d["timing"]["prefill_ms"] > 0
    assert d["memory"]["layer_load_ms"] > 0  # read back from the saved base, measured
    again = helios_traces.record(a, prompts[:1], 5, 6, batches=(1,), repeats=1,
                                 log=lambda _: None)  # the loader left the model whole
    assert again["prompts"][0]["full"]["token"] == ref
    judged = helios_traces.record(a, prompts[:1], 5, 6, judge=b, batches=(1,), repeats=1,
                                  log=lambda _: None)
    assert judged["judge"] == "tiny-llm-b"
    assert judged["prompts"][0]["full"]["token"] == ref
    assert judged["prompts"][0]["full"]["judge_logprob"] != p["full"]["logprob"]
    path = helios_traces.save(d, home / "scratch" / "a.json.gz")
    t = helios_traces.load(path)
    assert t.head_layers == (2, 4) and t.prompts[1].kind == "code" and t.new_tokens == 5
    assert t.layer_load_ms == d["memory"]["layer_load_ms"]


def run_args(out: Path, requests: int) -> list[str]:
    return ["bench", "helios", "--sim", "--json", str(out), "--models", ",".join(MODELS),
            "--threshold", "0.008", "--budget-mb", "2", "--requests", str(requests),
            "--drift-every", "10", "--ri", "30", "--max-tokens", "8", "--prompt-tokens", "8",
            "--trace-prompts", "3", "--seed", "1"]


def test_bench_helios_sim_end_to_end(home: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch, capsys):
    out = tmp_path / "helios.json"
    env = {**os.environ, "OFFRAMP_HOME": str(home), "OFFRAMP_ORT_THREADS": "1"}
    env.pop("OFFRAMP_MODELS_DIR", None)
    proc = subprocess.run([sys.executable, "-m", "services.cli", *run_args(out, 60)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "recording the trace of tiny-llm-b" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["mode"] == "replay simulation from recorded traces"
    assert list(doc["policies"]) == POLICIES and doc["models"] == list(MODELS)
    assert doc["traces"]["tiny-llm-b"]["n_layers"] == 8 and len(doc["stream_kinds"]) == 60
    assert {doc["stream_kinds"][i] for i in (0, 10)} == {"prose", "code"}  # it drifts
    for name, p in doc["policies"].items():
        assert p["tokens"] == 60 * 8 and len(p["timeline"]) == 60, name
        assert p["tokens_per_s"] > 0 and p["tpot_ms"] > 0 and p["ttft_ms"] > 0
        assert p["perplexity"] > 1 and 0 <= p["token_agreement"] <= 1
        assert p["largest_batch"] >= 1 and p["memory_at_equal_batch_bytes"] > 0
    full = {m: doc["traces"][m]["n_layers"] for m in MODELS}
    assert all(s["depth"] == full[s["candidate"]]
               for s in doc["policies"]["helios-no-greedy"]["timeline"])
    assert {s["candidate"] for s in doc["policies"]["helios"]["timeline"][:6]} == set(MODELS)
    assert out.with_suffix(".svg").read_text().startswith("<svg")
    assert sorted(p.name for p in (home / "traces" / "helios").iterdir()) == \
        sorted(f"{m}.json.gz" for m in MODELS)
    # again, in process: the traces are reused, nothing is recorded
    monkeypatch.setenv("OFFRAMP_HOME", str(home))
    assert main(run_args(tmp_path / "again.json", 20)) == 0
    assert "recording" not in capsys.readouterr().out
    assert len(json.loads((tmp_path / "again.json").read_text())["stream_kinds"]) == 20
    # the exit-rule bounds replay the same trace; a model without one is told how to record it
    bounds = tmp_path / "bounds.json"
    assert main(["bench", "decode", "--bounds", "--model", "tiny-llm", "--json", str(bounds)]) == 0
    rules = json.loads(bounds.read_text())["rules"]
    assert rules[0]["rule"] == "oracle, all heads" and rules[0]["agreement"] == 1.0
    assert all(1.0 <= r["bound"] and 0 <= r["agreement"] <= 1 for r in rules)
    assert main(["bench", "decode", "--bounds", "--model", "nope", "--json", str(bounds)]) == 2
    assert "bench helios --sim --models nope" in capsys.readouterr().out


def test_the_live_mode_refuses_a_candidate_that_is_not_prepared(tmp_path: Path):
    with pytest.raises(SystemExit, match="nope is not prepared"):
        main(["bench", "helios", "--json", str(tmp_path / "x.json"), "--models", "nope"])
    assert not (tmp_path / "x.json").exists()
