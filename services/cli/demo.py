"""``offramp demo``: the vanilla model and offramp's adaptive loop side by side on the same
stream (``services.loadgen.demo``)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="start the stack, stream real images through vanilla "
                          "and through offramp's adaptive loop, print both side by side")
    demo.add_argument("--model", default="efficientnet-lite0")
    demo.add_argument("--requests", type=int, default=2000, help="frames per run")
    demo.add_argument("--concurrency", type=int,
                      help="closed loop: this many requests in flight instead of open-loop "
                      "arrivals (with 1, each frame waits for the previous one's remaining "
                      "layers, which no early exit saves)")
    demo.add_argument("--arrivals", metavar="SPEC",
                      help="open loop: send frames at these arrival times, e.g. poisson:20 "
                      "(requests/s; see services/workloads/arrivals.py); default: Poisson at "
                      "light load (a vanilla worker 20%% busy), where latency mode's early "
                      "answers pay")
    demo.add_argument("--scene-frames", metavar="MIN:MAX",
                      help="video models: scene lengths in frames (default 600:1800, a fixed "
                      "camera; 16:120 cuts far more often)")
    demo.add_argument("--seed", type=int, default=1,
                      help="which stream: its photos, scene cuts and arrival times (default 1; "
                      "`offramp bench apparate --seed S` streams the same frames)")
    demo.add_argument("--json", help="write the summary here too")
    demo.set_defaults(fn=run_demo)



def run_demo(args: argparse.Namespace) -> int:
    from services.loadgen import demo

    return demo.run(args)
