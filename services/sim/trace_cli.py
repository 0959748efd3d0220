"""``offramp trace record``: run a prepared model over a workload and save a replay trace.

    offramp trace record --model efficientnet-lite0 --workload video --n 4000 --seed 0 \\
        --out ~/.offramp/traces/efficientnet-video-4000.npz --arrivals poisson:10

Inputs come from a generated workload (video frames with scene cuts, or a drifting text
stream for text models) or from a file (``.npy`` for a single-input model, ``.npz`` with
one array per input name). ``--arrivals`` stores arrival times in the trace (same
generator and seed derivation as ``services.models.streams.make_stream``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

CHUNK = 32


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="trace_command", required=True)
    rec = sub.add_parser("record", help="run a prepared model with every ramp active over a "
                         "workload and save a replay trace (.npz)")
    rec.add_argument("--model", required=True, help="prepared model name (under the models dir)")
    src = rec.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", choices=["video", "text"], help="generated input stream")
    src.add_argument("--inputs", help=".npy (single-input model) or .npz (array per input)")
    rec.add_argument("--n", type=int, default=4000, help="samples of the generated workload")
    rec.add_argument("--seed", type=int, default=0, help="workload seed (ramps were trained on "
                     "the model's bootstrap seed; use another for unseen data)")
    rec.add_argument("--scene-frames", default="16:120", metavar="MIN:MAX",
                     help="video workload: scene lengths in frames (each cut changes the "
                     "photo); a fixed camera's scenes last far longer, e.g. 600:1800")
    rec.add_argument("--out", required=True, help="trace file to write (.npz)")
    rec.add_argument("--arrivals", help="arrival process to store, e.g. poisson:10 "
                     "(see services/models/arrivals.py)")
    rec.add_argument("--score", default="max_softmax", help="exit score kind")
    rec.add_argument("--models-dir", help="default: $OFFRAMP_MODELS_DIR")
    rec.add_argument("--quiet", action="store_true", help="no progress output")


def _file_inputs(path: Path, input_names: list[str]) -> tuple[int, Iterator[dict[str, np.ndarray]]]:
    data = np.load(path, allow_pickle=False)
    if hasattr(data, "files"):
        arrays = {k: data[k] for k in data.files}
        missing = [k for k in input_names if k not in arrays]
        if missing:
            raise ValueError(f"{path} lacks model inputs {missing} (has {list(arrays)})")
        arrays = {k: arrays[k] for k in input_names}
    else:
        if len(input_names) != 1:
            raise ValueError(f"the model takes {input_names}: give an .npz with those arrays")
        arrays = {input_names[0]: data}
    n = len(next(iter(arrays.values())))
    if any(len(a) != n for a in arrays.values()):
        raise ValueError(f"{path}: every input array needs the same number of samples")

    def chunks() -> Iterator[dict[str, np.ndarray]]:
        for s in range(0, n, CHUNK):
            yield {k: v[s: s + CHUNK] for k, v in arrays.items()}

    return n, chunks()


def _video_inputs(n: int, seed: int, inputs: list, scenes: tuple[int, int]
                  ) -> Iterator[dict[str, np.ndarray]]:
    from services.models.workloads import image_input, iter_video_frames

    name, size, dtype = image_input(inputs)  # raises before the first frame, not lazily

    def frames() -> Iterator[dict[str, np.ndarray]]:
        for block, _ in iter_video_frames(n, seed=seed, size=size, chunk=CHUNK,
                                          min_scene=scenes[0], max_scene=scenes[1],
                                          dtype=dtype):
            yield {name: block}

    return frames()


def _text_inputs(n: int, seed: int, input_names: list[str]) -> Iterator[dict[str, np.ndarray]]:
    if set(input_names) != {"input_ids", "attention_mask"}:
        raise ValueError(f"the text workload feeds input_ids/attention_mask, the model takes "
                         f"{input_names}: use --inputs")
    from services.models import minilm_topics as mt
    from services.models.streams import make_stream

    # Held-out quotes only: the head and the ramps trained on the rest, and a stream of
    # training texts would show the ramps' memory of them rather than how they generalise.
    stream = make_stream("text", n, seed, corpus=mt.splits()[1])
    samples = list(stream.items())
    for s in range(0, n, CHUNK):
        yield mt.encode_texts([x.text for x in samples[s: s + CHUNK]])


def workload_chunks(manifest, workload: str, n: int, seed: int, scene_frames: str | None
                    ) -> tuple[Iterator[dict[str, np.ndarray]], dict[str, object]]:
    """Chunks of ``n`` samples of a named workload for ``manifest``'s model (``video``:
    frames with scene cuts every ``scene_frames`` MIN:MAX frames; ``text``: the drifting
    topic stream) and what describes it in a trace's meta. Bad names raise ValueError."""
    from services.models.workloads import SCENE_FRAMES, parse_scene_frames

    if workload == "video":
        scenes = parse_scene_frames(scene_frames) if scene_frames else SCENE_FRAMES
        return (_video_inputs(n, seed, manifest.inputs, scenes),
                {"workload": workload, "scene_frames": list(scenes)})
    if workload == "text":
        return (_text_inputs(n, seed, [t.name for t in manifest.inputs]),
                {"workload": workload, "texts": "held-out quotes"})
    raise ValueError(f"unknown workload {workload!r}; known: video, text")


def run(args: argparse.Namespace) -> int:
    from services.common import config as config_mod
    from services.models.arrivals import make_arrivals
    from services.models.manifest import Manifest
    from services.sim.trace import record_trace

    models_dir = Path(args.models_dir) if args.models_dir else config_mod.load().models_dir
    model_dir = models_dir / args.model
    if not (model_dir / "manifest.json").is_file():
        print(f"error: {args.model} is not prepared under {models_dir} "
              f"(run `offramp prepare {args.model}`)", file=sys.stderr)
        return 2
    manifest = Manifest.load(model_dir)
    names = [t.name for t in manifest.inputs]
    meta: dict[str, object] = {"seed": args.seed}
    try:
        if args.inputs:
            n, chunks = _file_inputs(Path(args.inputs), names)
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
            arrivals = make_arrivals(args.arrivals, n=n, seed=(args.seed, 0xA7))
            meta["arrivals"] = args.arrivals
        say = None if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
        trace = record_trace(model_dir, chunks, score=args.score, arrivals=arrivals,
                             progress=say, total=n, meta=meta)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    path = trace.save(args.out)
    agree = (trace.ramp_pred == trace.final_pred).mean(axis=1)
    print(f"{path}: {trace.n_samples} samples x {trace.n_sites} ramps; full model "
          f"{trace.prefix_ms[-1]:.2f} ms; ramp agreement "
          + " ".join(f"{a:.2f}" for a in agree))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="offramp trace")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
