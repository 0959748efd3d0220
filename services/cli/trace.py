"""``offramp trace record``: run a prepared model over a workload and save a replay trace.

    offramp trace record --model efficientnet-lite0 --workload video --n 4000 --seed 0 \\
        --out ~/.offramp/traces/efficientnet-video-4000.npz --arrivals poisson:10

Inputs come from a generated workload (video frames with scene cuts, or a drifting text
stream for text models) or from a file (``.npy`` for a single-input model, ``.npz`` with
one array per input name). ``--arrivals`` stores arrival times in the trace (same
generator and seed derivation as ``services.workloads.streams.make_stream``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from schemas.messages import SCORE_KINDS
from services.runtime.manifest import TensorSpec


def register(sub: argparse._SubParsersAction) -> None:
    tr = sub.add_parser("trace", help="record replay traces: offramp trace record ...")
    add_arguments(tr)
    tr.set_defaults(fn=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="trace_command", required=True)
    rec = sub.add_parser("record", help="run a prepared model with every ramp active over a "
                         "workload and save a replay trace (.npz)")
    rec.add_argument("--model", required=True, help="prepared model name (under the models dir)")
    src = rec.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", choices=["video", "video-unseen", "text"], help="generated input stream")
    src.add_argument("--inputs", help=".npy (single-input model) or .npz (array per input)")
    rec.add_argument("--n", type=int, default=4000, help="samples of the generated workload")
    rec.add_argument("--seed", type=int, default=0, help="workload seed (ramps were trained on "
                     "the model's bootstrap seed; use another for unseen data)")
    rec.add_argument("--scene-frames", default="16:120", metavar="MIN:MAX",
                     help="video workload: scene lengths in frames (each cut changes the "
                     "photo); a fixed camera's scenes last far longer, e.g. 600:1800")
    rec.add_argument("--out", required=True, help="trace file to write (.npz)")
    rec.add_argument("--arrivals", help="arrival process to store, e.g. poisson:10 "
                     "(see services/workloads/arrivals.py)")
    rec.add_argument("--score", default="max_softmax",
                     help=f"exit score kind: {', '.join(SCORE_KINDS)}")
    rec.add_argument("--features", action="store_true",
                     help="also store what every ramp head read (pooled features), the heads "
                     "and, for models of up to 100 classes, the final logits: what replays of "
                     "online ramp refits need (a few MB more per 1,000 samples)")
    rec.add_argument("--models-dir", help="default: $OFFRAMP_MODELS_DIR")
    rec.add_argument("--quiet", action="store_true", help="no progress output")


def _file_inputs(path: Path, inputs: list[TensorSpec], chunk: int
                 ) -> tuple[int, Iterator[dict[str, np.ndarray]]]:
    from services.runtime.input_files import read_inputs

    arrays = read_inputs(path, inputs)
    n = len(next(iter(arrays.values())))

    def chunks() -> Iterator[dict[str, np.ndarray]]:
        for s in range(0, n, chunk):
            yield {k: v[s: s + chunk] for k, v in arrays.items()}

    return n, chunks()


def run(args: argparse.Namespace) -> int:
    from services.common import config as config_mod
    from services.runtime.manifest import Manifest
    from services.sim.trace import record_trace
    from services.sim.workload_inputs import CHUNK, workload_chunks
    from services.workloads.arrivals import stream_arrivals

    models_dir = Path(args.models_dir) if args.models_dir else config_mod.load().models_dir
    model_dir = models_dir / args.model
    manifest = Manifest.load(model_dir)  # ModelNotPrepared names the fix
    meta: dict[str, object] = {"seed": args.seed}
    try:
        if args.inputs:
            n, chunks = _file_inputs(Path(args.inputs), manifest.inputs, CHUNK)
            meta["workload"] = f"file:{args.inputs}"
        else:
            if args.n <= 0:
                raise ValueError("--n must be positive")
            n = args.n
            chunks, about = workload_chunks(manifest, args.workload, n, args.seed,
                                            args.scene_frames)
            meta.update(about)
        arrivals = None
        if args.arrivals:
            arrivals = stream_arrivals(args.arrivals, n, args.seed)
            meta["arrivals"] = args.arrivals
        say = None if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
        trace = record_trace(model_dir, chunks, score=args.score, arrivals=arrivals,
                             features=args.features,
                             progress=say, total=n, meta=meta)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    path = trace.save(args.out)
    share = trace.meta.get("feature_share")
    fed = "" if share is None else f"; features add {share:.1%} to a run that publishes them"
    print(f"{path}: {trace.n_samples} samples x {trace.n_sites} ramps; full model "
          f"{trace.prefix_ms[-1]:.2f} ms; ramp agreement "
          + " ".join(f"{a:.2f}" for a in trace.agreement_by_site()) + fed)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="offramp trace")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
