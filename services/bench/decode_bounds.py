"""``offramp bench decode --bounds``: how far parallel decoding can go with a model's exit
heads, replayed on its recorded per-token trace (``offramp bench helios --sim`` records it)
through the rules of ``services.sim.exit_rules``. Replay, no timing: the bound is the layer
count over the mean layers a token needs, as if heads were free."""

from __future__ import annotations

import json
from pathlib import Path

from services.sim.exit_rules import replay, standard_rules


def trace_path(args, home: Path, model: str) -> Path:
    folder = Path(args.traces) if getattr(args, "traces", None) else home / "traces" / "helios"
    return folder / f"{model}.json.gz"


def run_bounds(args) -> int:
    from services.bench import helios_traces
    from services.common import config as config_mod

    cfg = config_mod.load()
    model = args.model or "smollm2-135m"
    path = trace_path(args, cfg.home, model)
    if not path.is_file():
        print(f"error: no recorded trace of {model} at {path}: record one with "
              f"`offramp bench helios --sim --models {model}`")
        return 2
    trace = helios_traces.load(path)
    tokens = sum(len(p.full_token) for p in trace.prompts)
    print(f"exit-rule bounds of {model} (replay of {path.name}: {len(trace.prompts)} prompts, "
          f"{tokens} generated tokens, heads after layers {list(trace.head_layers)})")
    outcomes = [replay(trace, rule) for rule in standard_rules(trace.head_layers)]
    print(f"\n{'rule':<44} {'layers':>7} {'agreement':>10} {'heads':>6} {'bound':>6}")
    for o in outcomes:
        print(f"{o.rule:<44} {o.mean_layers:>7.2f} {100 * o.agreement:>9.2f}% "
              f"{o.heads_scored:>6.2f} {o.bound:>5.2f}x")
    doc = {"bench": "decode-bounds", "mode": "replay of a recorded trace (no timing)",
           "model": model, "trace": str(path), "prompts": len(trace.prompts), "tokens": tokens,
           "layers": trace.n_layers, "heads": list(trace.head_layers),
           "rules": [o.as_dict() for o in outcomes]}
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"json: {args.json}")
    return 0
