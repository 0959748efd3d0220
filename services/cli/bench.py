"""``offramp bench overhead|apparate|chaos|e3|superserve|decode|helios``: measurements that print a table and write JSON."""

from __future__ import annotations

import argparse
import functools
import signal
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

from services.cli.options import loss_share, non_negative_float, non_negative_int, positive_int

BENCHES = ("overhead", "apparate", "chaos", "e3", "superserve", "decode", "helios")

# The options each bench reads: `bench X --help` lists these, and an option X does not read is
# refused instead of silently ignored (a flag meant for another bench would look applied).
_APPARATE = {"trace", "arrivals", "budget", "delay_ms", "head_delay_ms", "tune_window",
             "slack_windows", "feedback_backlog", "grid_rounds", "segments", "ceiling", "live",
             "workload", "repeat", "scene_frames"}
_E3 = {"accuracy", "adapt", "shadow_rate", "warm_s", "devices", "device_profile", "gpu_curve",
       "trace_seed", "serve_trace_seed", "batches", "mixes"}
_HELIOS = {"models", "judge", "budget_mb", "drift_every", "ri", "eval_prompts", "think_ms",
           "no_judge", "trace_prompts"}
_GENERATION = {"threshold", "max_tokens", "prompt_tokens", "heads", "traces"}
OPTIONS = {
    "overhead": {"model", "trivial_model", "requests", "duration", "concurrency"},
    "apparate": {"model", "requests", "plot", "seed", "constraint"} | _APPARATE,
    "chaos": {"model", "seed", "slo_ms", "scenarios", "quick", "resend_after", "burst",
              "keep_state"},
    "e3": {"model", "requests", "seed", "constraint", "slo_ms", "sim", "workers", "seconds"} | _E3,
    "superserve": {"model", "plot", "seed", "slo_ms", "sim", "workers", "seconds", "profile",
                   "rate", "faults", "policies", "caps"},
    "decode": {"model", "batch", "rounds", "depth", "bounds"} | _GENERATION,
    "helios": {"requests", "concurrency", "plot", "seed", "sim", "policies"} | _GENERATION
              | _HELIOS,
}
COMMON = {"json", "help"}


class BenchHelp(argparse.Action):
    """``bench WHICH --help``: WHICH's options only (all seven benches share one parser)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        which = getattr(namespace, "which", None)
        if which in OPTIONS:
            keep = OPTIONS[which] | COMMON
            for action in parser._actions:
                if action.option_strings and action.dest not in keep:
                    action.help = argparse.SUPPRESS
            parser.usage = f"%(prog)s {which} [options]"
        else:
            parser.epilog = "`offramp bench WHICH --help` lists the options WHICH reads."
        parser.print_help()
        parser.exit()


def foreign_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The options given (away from their defaults) that ``args.which`` does not read."""
    mine = OPTIONS[args.which] | COMMON
    return [action.option_strings[0] for action in parser._actions
            if action.option_strings and action.dest not in mine
            and getattr(args, action.dest, None) != action.default]


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks: print a table, write JSON",
                           add_help=False)
    bench.add_argument("which", choices=BENCHES)
    bench.add_argument("-h", "--help", action=BenchHelp,
                       help="show the options of WHICH and exit")
    bench.add_argument("--json", metavar="OUT",
                       help="output file (default $OFFRAMP_HOME/bench/WHICH-<UTC time>.json)")
    bench.add_argument("--model", help="the model served (default: overhead, apparate "
                       "efficientnet-lite0; chaos tiny; e3 --sim and --accuracy chain-cnn, e3 "
                       "live minilm-topics; superserve live supernet-cnn, --sim: whose exit "
                       "depths join the variant tables; decode smollm2-135m)")
    bench.add_argument("--trivial-model", default="tiny")
    bench.add_argument("--requests", type=positive_int,
                       help="overhead: requests per light-load run (default 300); apparate "
                       "--live: samples of the stream per policy (default 2000); e3, helios: below")
    bench.add_argument("--duration", type=float, default=8.0, help="seconds of sustained load")
    bench.add_argument("--concurrency", type=int,
                       help="overhead: requests in flight (default 64); helios: clients")
    for more in (apparate_arguments, chaos_arguments, e3_arguments, superserve_arguments,
                 decode_arguments, helios_arguments):
        more(bench)
    bench.set_defaults(fn=functools.partial(run, parser=bench))


def apparate_arguments(bench: argparse.ArgumentParser) -> None:
    """apparate: the replay bench (--trace) or the live one (--live)."""
    bench.add_argument("--trace", help="apparate: replay trace (.npz) from `offramp trace record`")
    bench.add_argument("--plot", help="apparate, superserve: plot (.svg; apparate: .png too)")
    bench.add_argument("--arrivals", help="apparate: arrival spec overriding the trace's, e.g. "
                       "poisson:10 (default: the trace's arrival_s, else Poisson light load at "
                       "20%% of the full model's capacity)")
    bench.add_argument("--seed", type=non_negative_int, default=0,
                       help="apparate: seed of --arrivals; chaos: of the fuzzed messages; e3, "
                       "superserve, helios: of the stream's draws and arrivals")
    bench.add_argument("--constraint", type=loss_share, default=0.01, help="tolerated loss")
    bench.add_argument("--budget", type=non_negative_float, default=0.02, help="ramp budget")
    bench.add_argument("--delay-ms", type=float, default=None,
                       help="apparate replay: how late a decided config reaches the worker "
                       "(default 100, the live round trip; 0: at once)")
    bench.add_argument("--head-delay-ms", type=float, default=None,
                       help="apparate replay: how late refitted heads reach the worker after "
                       "the feedback that set off their round (default 400, as live)")
    bench.add_argument("--tune-window", type=int, help="apparate: controller tuning window (samples)")
    bench.add_argument("--slack-windows", type=int, help="apparate: clean windows per savings tune")
    bench.add_argument("--feedback-backlog", type=int, default=None,
                       help="apparate replay: runs whose sample answered early that the worker may set "
                       "aside for a sample that arrives (default 8, as OFFRAMP_FEEDBACK_BACKLOG; 0: every "
                       "run goes to the end)")
    bench.add_argument("--grid-rounds", type=int, default=8,
                       help="apparate: tune rounds compared with grid search (0: skip)")
    bench.add_argument("--segments", type=int, default=1,
                       help="apparate replay: also report each policy over K consecutive equal "
                       "parts of the stream (e.g. 2: before and after the middle sample)")
    bench.add_argument("--ceiling", action="store_true",
                       help="apparate replay: the best fixed config in hindsight (median- and "
                       "mean-optimal, at the constraint and the tuner's headroom): what tuning "
                       "these heads could reach; with features, also over heads refitted in "
                       "hindsight: what learning them could")
    bench.add_argument("--live", action="store_true",
                       help="apparate: run the policies live on the embedded stack (with --model and "
                       "--workload) instead of replaying a trace")
    bench.add_argument("--workload", choices=["video", "video-unseen", "text"],
                       help="apparate --live: the generated stream (video frames or drifting texts)")
    bench.add_argument("--repeat", type=int, default=1,
                       help="apparate --live: run the whole vanilla/static/offramp sequence this many "
                       "times and report medians (the machine drifts between sequential runs)")
    bench.add_argument("--scene-frames", metavar="MIN:MAX",
                       help="apparate --live, video: scene lengths in frames (default 16:120; a fixed "
                       "camera's run far longer, e.g. 600:1800)")


def chaos_arguments(bench: argparse.ArgumentParser) -> None:
    """chaos: failures and hostile input under load, on a private stack."""
    bench.add_argument("--scenarios", help="chaos: comma list of worker-kill, router-kill, "
                       "monitor-kill, nats-restart, burst, fuzz, attacks (default: all)")
    bench.add_argument("--quick", action="store_true",
                       help="chaos: shorter loads and a 5,000-request burst instead of 20,000")
    bench.add_argument("--resend-after", type=float, metavar="S",
                       help="chaos: the client resends a request with no reply after S "
                       "seconds, once, same id, new reply subject (default: SLO + 1 s)")
    bench.add_argument("--slo-ms", type=float, metavar="MS",
                       help="every request's SLO (chaos: default 1000; e3: 10x the batch-16 "
                       "full model; superserve: a multiple of the slowest variant's batch time)")
    bench.add_argument("--burst", type=int, metavar="N",
                       help="chaos: requests of the burst scenario (default 20000, --quick 5000)")
    bench.add_argument("--keep-state", action="store_true",
                       help="chaos: keep the private stack's state folder (logs, store)")


def decode_arguments(bench: argparse.ArgumentParser) -> None:
    bench.add_argument("--threshold", type=float, default=0.9,
                       help="decode, helios: an exit head answers at this top probability")
    bench.add_argument("--batch", type=int, default=4, help="decode: streams decoded together")
    bench.add_argument("--max-tokens", type=int, default=64,
                       help="decode, helios: tokens per stream")
    bench.add_argument("--prompt-tokens", type=int, default=32,
                       help="decode, helios: prompt length")
    bench.add_argument("--heads", help="decode: the exit heads evaluated (layers, e.g. 24,27; "
                       "default all): each costs a vocabulary projection; helios live: the "
                       "heads the alone and helios stacks use (OFFRAMP_LLM_HEADS, default all; `last`: each "
                       "candidate's deepest)")
    bench.add_argument("--rounds", type=int, default=4,
                       help="decode: batches, each decoded exit-free and with exits")
    bench.add_argument("--depth", type=int, default=0,
                       help="decode: the exit run loads only this many layers (an exit head's "
                       "layer: it answers every token reaching it); agreement is judged by "
                       "the full model")
    bench.add_argument("--bounds", action="store_true",
                       help="decode: replay the model's recorded trace (bench helios --sim "
                       "records it) through exit rules: the most its heads can save")


def helios_arguments(bench: argparse.ArgumentParser) -> None:
    """``offramp bench helios``: with --sim HELIOS replayed on recorded exit traces
    (services/bench/helios.py), without it served live, each policy on a private stack
    (services/bench/helios_live.py). It also reads --threshold, --max-tokens (answer
    tokens), --prompt-tokens, --heads, --requests (--sim 600, live 120), --seed (the
    stream's draws), --plot (default: the JSON's name, .svg) and, live, --concurrency
    (clients, default 4) and --policies (alone, alone-noexit, helios or full names such as
    alone:smollm2-135m; default all)."""
    bench.add_argument("--models", metavar="A,B",
                       help="helios: the candidates, prepared generative models (default "
                       "smollm2-135m); --sim records their traces first when missing; the "
                       "stream holds --requests requests (--sim default 600, live 120)")
    bench.add_argument("--traces", metavar="DIR",
                       help="helios: trace folder (default $OFFRAMP_HOME/traces/helios)")
    bench.add_argument("--judge", metavar="MODEL",
                       help="helios: a prepared model of the same tokenizer whose log-probs "
                       "score every candidate's tokens (--sim default: each candidate itself; "
                       "live default: the first candidate)")
    bench.add_argument("--budget-mb", type=float, metavar="M",
                       help="helios: memory for weights and KV cache (default: the largest "
                       "candidate's weights + OFFRAMP_KV_BUDGET_MB)")
    bench.add_argument("--drift-every", type=int, metavar="K",
                       help="helios: requests between changes of the stream's text kind "
                       "(--sim default 100, live: a quarter of --requests)")
    bench.add_argument("--ri", type=int, metavar="N",
                       help="helios: re-assessment interval, requests (--sim default 150; "
                       "live default 40, three assessments in the default stream)")
    bench.add_argument("--eval-prompts", type=int, metavar="N",
                       help="helios live: requests each candidate serves fully loaded at the "
                       "start of an assessment (default 5)")
    bench.add_argument("--think-ms", type=float, metavar="MS",
                       help="helios live: --concurrency clients (default 4) send closed-loop; "
                       "this is a client's pause between the end of its stream and its next "
                       "request (default 0)")
    bench.add_argument("--no-judge", action="store_true",
                       help="helios live: skip judging the answers (perplexity and agreement "
                       "by the judge, fully loaded, after the stacks stop)")
    bench.add_argument("--trace-prompts", type=int, metavar="N",
                       help="helios: held-out prompts of each text kind a recorded trace "
                       "holds (default 8); the stream draws from them")


def superserve_arguments(bench: argparse.ArgumentParser) -> None:
    """``offramp bench superserve``: variant policies on bursty traces (services/bench/superserve.py)."""
    bench.add_argument("--profile", metavar="FILE",
                       help="superserve --sim: a measured variant profile beside the modeled "
                       "A40 class: a prepared supernet's manifest.json (e.g. "
                       "~/.offramp/models/supernet-cnn/manifest.json)")
    bench.add_argument("--rate", type=float, metavar="R",
                       help="superserve live: mean offered rate, req/s (default 0.8 x the "
                       "most accurate variant's profiled capacity, at most 500)")
    bench.add_argument("--faults", action="store_true",
                       help="superserve live: also a bursty trace (2 x --seconds) during "
                       "which each worker is killed in turn and comes back; with --plot, "
                       "attainment and accuracy per second")
    bench.add_argument("--caps", metavar="R,...|budget",
                       help="superserve live on an early-exit model: the ramps served as depth "
                       "caps (default: the cheapest trained ramp and two spread over the "
                       "model's cost; budget: the initial deployment's, within "
                       "OFFRAMP_RAMP_BUDGET)")
    bench.add_argument("--policies", metavar="P,...",
                       help="superserve live: the policies to run (slackfit, maxacc, maxbatch, "
                       "infaas, clipper+, variant=KEY for Clipper+ on any frontier subnet; "
                       "default all); helios live: alone, alone-noexit, helios or full names "
                       "(alone:MODEL; default all)")


def e3_arguments(bench: argparse.ArgumentParser) -> None:
    """``offramp bench e3``: vanilla vs naive early exit vs E3 (services/bench/e3.py)."""
    bench.add_argument("--sim", action="store_true",
                       help="e3: simulate at --devices (without it: live on this machine, "
                       "--workers worker processes per policy, default 2); helios: replay "
                       "recorded traces (without it: live, a private stack per policy)")
    bench.add_argument("--accuracy", action="store_true",
                       help="e3: replay compute mode's accuracy loop (the tuner on the shadow "
                       "sample) over seeds, mixes and shadow rates")
    bench.add_argument("--workers", type=int, metavar="N",
                       help="e3 live: worker processes per policy (default 2); "
                       "superserve --sim: workers (default 8)")
    bench.add_argument("--seconds", type=float, metavar="S",
                       help="e3 live: measured seconds per phase (default 40); "
                       "superserve --sim: seconds per trace (default 30)")
    bench.add_argument("--adapt", action="store_true",
                       help="e3 live: the tuner adapts the compute-mode runs' thresholds")
    bench.add_argument("--shadow-rate", type=float, metavar="R",
                       help="e3 live: share of requests kept as compute-mode feedback "
                       "(default OFFRAMP_SHADOW_RATE, 0.05); e3 --accuracy: the one rate "
                       "to replay (default 0.05, 0.1 and 0.2)")
    bench.add_argument("--warm-s", type=float, metavar="S",
                       help="e3 live: seconds of the stream before a phase is measured (default 20)")
    bench.add_argument("--devices", metavar="N,...",
                       help="e3: device counts (default 16,48; the first is the headline)")
    bench.add_argument("--device-profile", metavar="FILE",
                       help="e3: a device class (JSON, see services/bench/e3_inputs.py) "
                       "instead of the A40 class modeled from ../shared/data")
    bench.add_argument("--gpu-curve", type=int, metavar="ID",
                       help="e3 --sim: the OFA-ResNet50 subnet (0-5) of ../shared/data whose A40 "
                       "batch curve models the GPU class (default: the subnet nearest the model "
                       "in multiply-accumulates per sample)")
    bench.add_argument("--trace-seed", type=int, metavar="N",
                       help="e3 --sim: the workload seed of the recorded trace the easy and "
                       "hard pools and the exit config come from (default 1)")
    bench.add_argument("--serve-trace-seed", type=int, metavar="N",
                       help="e3 --accuracy: serve streams of the trace of workload seed N, "
                       "inputs the starting thresholds were never tuned on (default: the "
                       "tuning trace itself)")
    bench.add_argument("--batches", metavar="B,...", help="e3: batch sizes (default 1,4,8,16)")
    bench.add_argument("--mixes", metavar="EASY/HARD,...",
                       help="e3: easy/hard mixes (default 80/20,50/50,20/80; the first is "
                       "the headline); e3 also reads --requests (at least this many a run, "
                       "default 20000), --seed (arrivals and mixes), --slo-ms (default 10x the "
                       "batch-16 full model) and --constraint")


def default_json_path(which: str) -> Path:
    """Where a bench writes its JSON when ``--json`` is not given: one file per run in the
    state folder, so a quick look still leaves its figures behind."""
    from services.common import config

    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    out = config.load().home / "bench" / f"{which}-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if foreign := foreign_options(parser, args):
        parser.error(f"bench {args.which} does not read {', '.join(foreign)} (`offramp bench "
                     f"{args.which} --help` lists its options)")
    # SIGTERM unwinds like Ctrl-C: the benches' `finally` blocks stop the private stacks
    # they started (a killed bench would leave them serving)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    if not args.json:
        args.json = str(default_json_path(args.which))
        print(f"results go to {args.json} (--json OUT to choose)", file=sys.stderr)
    if args.which == "chaos":
        from services.bench.chaos import run_chaos
        args.model = args.model or "tiny"
        return run_chaos(args)
    if args.which == "e3":
        from services.bench.e3 import run_e3
        return run_e3(args)
    if args.which == "decode" and args.bounds:
        from services.bench.decode_bounds import run_bounds
        return run_bounds(args)
    if args.which == "decode":
        from services.bench.decode import run_decode
        return run_decode(args)
    if args.which == "helios":
        from services.bench.helios import run_helios
        return run_helios(args)
    if args.which == "superserve":
        from services.bench.superserve import run_superserve
        return run_superserve(args)
    args.model = args.model or "efficientnet-lite0"
    if args.which == "overhead":
        from services.bench.overhead import run_overhead
        args.requests = 300 if args.requests is None else args.requests
        args.concurrency = 64 if args.concurrency is None else args.concurrency
        return run_overhead(args)
    if args.which == "apparate":
        from services.bench.apparate import run
        return run(args)
    raise SystemExit(f"unknown benchmark {args.which!r}")
