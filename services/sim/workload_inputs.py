"""The inputs of a named workload for a prepared model, in chunks: what ``offramp trace
record``, ``offramp bench apparate --live`` and the demo stream (``video``: frames with
scene cuts; ``text``: the drifting topic stream of held-out quotes)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from services.workloads.frames import (
    SCENE_FRAMES,
    image_input,
    iter_video_frames,
    parse_scene_frames,
)
from services.workloads.streams import make_stream
from services.zoo import minilm_topics as mt

CHUNK = 32  # samples per chunk: one recorded batch
WORKLOADS = ("video", "video-unseen", "text")


def video_inputs(n: int, seed: int, inputs: list, scenes: tuple[int, int],
                 photo_set: str = "bootstrap") -> Iterator[dict[str, np.ndarray]]:
    name, size, dtype = image_input(inputs)  # raises before the first frame, not lazily

    def frames() -> Iterator[dict[str, np.ndarray]]:
        for block, _ in iter_video_frames(n, seed=seed, size=size, chunk=CHUNK,
                                          min_scene=scenes[0], max_scene=scenes[1],
                                          dtype=dtype, photo_set=photo_set):
            yield {name: block}

    return frames()


def text_inputs(n: int, seed: int, input_names: list[str]) -> Iterator[dict[str, np.ndarray]]:
    if set(input_names) != {"input_ids", "attention_mask"}:
        raise ValueError(f"the text workload feeds input_ids/attention_mask, the model takes "
                         f"{input_names}: use --inputs")

    # Held-out quotes only: the head and the ramps trained on the rest, and a stream of
    # training texts would show the ramps' memory of them rather than how they generalise.
    stream = make_stream("text", n, seed, corpus=mt.splits()[1])
    samples = list(stream.items())
    for s in range(0, n, CHUNK):
        yield mt.encode_texts([x.text for x in samples[s: s + CHUNK]])


def workload_chunks(manifest, workload: str, n: int, seed: int, scene_frames: str | None
                    ) -> tuple[Iterator[dict[str, np.ndarray]], dict[str, object]]:
    """Chunks of ``n`` samples of a named workload for ``manifest``'s model (``video``:
    frames with scene cuts every ``scene_frames`` MIN:MAX frames; ``video-unseen``: the same
    over scenes no zoo ramp trained on; ``text``: the drifting topic stream) and what
    describes it in a trace's meta. Bad names raise ValueError."""
    if workload in ("video", "video-unseen"):
        scenes = parse_scene_frames(scene_frames) if scene_frames else SCENE_FRAMES
        photo_set = "unseen" if workload == "video-unseen" else "bootstrap"
        return (video_inputs(n, seed, manifest.inputs, scenes, photo_set),
                {"workload": workload, "scene_frames": list(scenes), "photos": photo_set})
    if workload == "text":
        return (text_inputs(n, seed, [t.name for t in manifest.inputs]),
                {"workload": workload, "texts": "held-out quotes"})
    raise ValueError(f"unknown workload {workload!r}; known: {', '.join(WORKLOADS)}")
