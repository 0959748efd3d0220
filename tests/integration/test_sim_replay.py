"""`offramp bench apparate --trace` end to end: JSON, SVG, default arrivals."""

from __future__ import annotations

from services.sim.trace import Trace
from tests.unit.test_sim_replay import easy


def test_bench_apparate_writes_json_and_svg(tmp_path, capsys) -> None:
    import json
    import xml.etree.ElementTree as ET

    from services.cli.main import main

    path = easy(n=300).save(tmp_path / "easy.npz")
    out, svg = tmp_path / "out.json", tmp_path / "plot.svg"
    assert main(["bench", "apparate", "--trace", str(path), "--json", str(out), "--plot", str(svg),
                          "--grid-rounds", "2"]) == 0
    doc = json.loads(out.read_text())
    assert doc["mode"] == "replay simulation"
    for name in ("vanilla", "static", "offramp", "hindsight", "oracle"):
        assert {"p25_ms", "p50_ms", "p95_ms", "agreement", "worst_window_agreement"} <= set(
            doc[name])
    assert {"tuning_ms_p50", "adjust_ms_p50", "grid_gap", "machine"} <= set(doc)
    trace = Trace.load(path)  # the stream's own answers, counted as the table prints them
    flips = int((trace.final_pred[1:] != trace.final_pred[:-1]).sum())
    assert doc["answer_changes"]["changes"] == flips
    assert doc["answer_changes"]["pairs"] == 299
    out_text = capsys.readouterr().out
    assert "replay simulation" in out_text
    assert f"stream: the full model's answer changes between consecutive samples {flips} " \
        "times in 299" in out_text
    assert ET.parse(svg).getroot().tag.endswith("svg")
    assert main(["bench", "apparate", "--trace", str(tmp_path / "nope.npz"), "--json", str(out)]) == 2
    assert doc["feedback_backlog"] == 8 and doc["timing_passes"] == 3
    # as live, unless told otherwise: a config's round trip, and a refit round's heads
    assert (doc["decision_delay_ms"], doc["head_delay_ms"]) == (100.0, 400.0)
    assert main(["bench", "apparate", "--trace", str(path), "--json", str(out),
                 "--grid-rounds", "0", "--delay-ms", "0", "--head-delay-ms", "20"]) == 0
    doc = json.loads(out.read_text())
    assert (doc["decision_delay_ms"], doc["head_delay_ms"]) == (0.0, 20.0)
    assert "decisions reach it 0 ms late, refitted heads 20 ms" in capsys.readouterr().out
    for bad, says in ((["--delay-ms", "-5"], "--delay-ms must be >= 0"),
                      (["--head-delay-ms", "nan"], "--head-delay-ms must be >= 0"),
                      (["--delay-ms", "50", "--live", "--workload", "video"], "live decisions")):
        assert main(["bench", "apparate", "--trace", str(path), "--json", str(out), *bad]) == 2
        assert says in capsys.readouterr().err
    for live in ([], ["--live", "--workload", "video"]):  # checked before anything starts
        assert main(["bench", "apparate", "--trace", str(path), "--json", str(out),
                              "--feedback-backlog", "-1", *live]) == 2
        assert "--feedback-backlog must be >= 0" in capsys.readouterr().err


def test_bench_without_json_writes_into_the_state_folder(tmp_path, monkeypatch, capsys) -> None:
    import json

    from services.cli.main import main

    monkeypatch.setenv("OFFRAMP_HOME", str(tmp_path / "home"))
    path = easy(n=200).save(tmp_path / "easy.npz")
    assert main(["bench", "apparate", "--trace", str(path), "--grid-rounds", "0"]) == 0
    written = list((tmp_path / "home" / "bench").glob("apparate-*.json"))
    assert len(written) == 1
    assert json.loads(written[0].read_text())["mode"] == "replay simulation"
    assert f"results go to {written[0]}" in capsys.readouterr().err


def test_bench_apparate_defaults_to_light_load_without_arrivals(tmp_path, capsys) -> None:
    import json

    from services.cli.main import main

    tr = easy(n=200)
    bare = Trace(tr.ramp_pred, tr.ramp_score, tr.final_pred, tr.prefix_ms, tr.ramp_cost_ms, None)
    path = bare.save(tmp_path / "bare.npz")
    out = tmp_path / "out.json"
    assert main(["bench", "apparate", "--trace", str(path), "--json", str(out), "--grid-rounds", "0",
                 "--segments", "2"]) == 0
    doc = json.loads(out.read_text())
    assert doc["arrivals"] == "poisson:20"  # 20% of a 10 ms model's 100 req/s
    got = capsys.readouterr()
    assert "no arrival_s" in got.err and "offramp by part of the stream" in got.out
    parts = doc["segments"]["offramp"]
    assert [(p["from"], p["to"]) for p in parts] == [(0, 100), (100, 200)]
    assert "vanilla" not in doc["segments"] and set(doc["segments"]) >= {"static", "oracle"}
    full = [p["p50_change"] for p in doc["segments"]["oracle"]]
    assert all(-1.0 < x <= 0.0 for x in full)  # the oracle never serves slower than vanilla
    assert main(["bench", "apparate", "--trace", str(path), "--json", str(out),
                 "--segments", "0"]) == 2
    assert "--segments must be >= 1" in capsys.readouterr().err


def test_bench_apparate_ceiling(tmp_path, capsys) -> None:
    import json

    from services.cli.main import main

    path = easy(n=300).save(tmp_path / "easy.npz")
    out = tmp_path / "out.json"
    assert main(["bench", "apparate", "--trace", str(path), "--json", str(out), "--grid-rounds", "0",
                 "--ceiling"]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["ceiling"]) == {"p50@constraint", "mean@constraint", "p50@headroom",
                                   "mean@headroom"}
    for key, c in doc["ceiling"].items():
        assert 1 - c["agreement"] <= c["constraint"] + 1e-12
        assert c["constraint"] == (0.01 if key.endswith("@constraint") else 0.005)
        assert c["p50_change"] <= 0.0 or not c["active"]
        assert c["held_out"]["constraint"] == c["constraint"]  # chosen on one half, judged on the other
    tight, loose = doc["ceiling"]["p50@headroom"], doc["ceiling"]["p50@constraint"]
    assert loose["p50_ms"] <= tight["p50_ms"] + 1e-9  # more tolerance never hurts the best
    text = capsys.readouterr().out
    assert "best fixed config in hindsight" in text and "held out: active" in text
    assert "learned_ceiling" not in doc and "refitted in hindsight" not in text  # no features


def test_bench_apparate_ceiling_over_heads_refitted_in_hindsight(tmp_path, capsys) -> None:
    import json

    from services.cli.main import main
    from tests.unit.test_sim_refit_replay import shifted_trace

    path = shifted_trace().save(tmp_path / "shifted.npz")
    out = tmp_path / "out.json"
    assert main(["bench", "apparate", "--trace", str(path), "--json", str(out), "--grid-rounds",
                 "0", "--ceiling"]) == 0
    doc = json.loads(out.read_text())
    learned = doc["learned_ceiling"]
    assert learned["causal"]["learner"] == {"window": 256, "delay": 4, "every": 8}
    recorded = doc["ceiling"]["mean@constraint"]
    for name in ("causal", "crossfit"):
        assert len(learned[name]["agreement_by_site"]) == 2
        best = learned[name]["mean@constraint"]
        assert 1 - best["agreement"] <= 0.01 + 1e-12
        assert best["mean_change"] < recorded["mean_change"] - 0.1  # the stale heads' ceiling
    text = capsys.readouterr().out
    assert "refitted in hindsight: causal = an ideal online learner" in text


def test_ceilings_of_a_one_sample_trace_have_no_held_out_part() -> None:
    from services.bench.apparate import ceilings

    got = ceilings(easy(n=1), 0.01, 0.02)
    assert set(got) == {"p50@constraint", "mean@constraint", "p50@headroom", "mean@headroom"}
    assert all("held_out" not in c for c in got.values())
