"""``offramp infer MODEL``: send one request through the wire contract and print the reply."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import numpy as np

from services.cli.options import non_negative_int
from services.common import config as config_mod
from services.runtime.input_files import InputFileError, read_arrays
from services.runtime.manifest import Manifest, ModelNotPrepared, manifest_kind


def register(sub: argparse._SubParsersAction) -> None:
    inf = sub.add_parser("infer", help="send one request (a real client of the wire contract)")
    inf.add_argument("model")
    inf.add_argument("--input", help=".npy (one sample) or .npz (one array per input name)")
    inf.add_argument("--input-name", help="the input an .npy fills (default: the model's first)")
    inf.add_argument("--text", help="a text for minilm-topics (tokenised client-side)")
    inf.add_argument("--seed", type=non_negative_int, default=0,
                     help="sample input seed when --input is absent")
    inf.add_argument("--slo-ms", type=float, help="the request's deadline (default "
                     "OFFRAMP_DEFAULT_SLO_MS)")
    inf.set_defaults(fn=run)


def _file_sample(models_dir: Path, model: str, path: Path, input_name: str | None
                 ) -> dict[str, np.ndarray]:
    """One sample from ``--input``: an .npz's arrays by name, or an .npy's one array as
    ``input_name`` (default: the model's first input, when it is prepared here)."""
    arrays = read_arrays(path, input_name or "")
    if "" not in arrays:  # named: an .npz, or --input-name
        return arrays
    try:
        input_name = Manifest.load(models_dir / model).inputs[0].name
    except ModelNotPrepared:
        raise InputFileError(f"{model} is not prepared under {models_dir}, so its input's "
                             "name is unknown here: pass --input-name NAME") from None
    return {input_name: arrays[""]}


def built_in_sample(models_dir: Path, model: str, seed: int) -> dict[str, np.ndarray]:
    """A zoo model's own sample input; for another model prepared here (a supernet, a
    ``--name`` copy, a user's model) a frame or text of the bench workloads, if its
    inputs take one."""
    from services.zoo.registry import ZOO, sample_inputs

    if model in ZOO:
        return {k: v[0] for k, v in sample_inputs(model, 1, seed=seed).items()}
    from services.sim.workload_inputs import workload_chunks

    if manifest_kind(models_dir / model) == "llm":
        raise InputFileError(f"{model} is a generative model: offramp generate {model} PROMPT")
    try:
        manifest = Manifest.load(models_dir / model)
    except ModelNotPrepared:
        raise InputFileError(f"{model} is neither a zoo model ({', '.join(sorted(ZOO))}) nor "
                             f"prepared under {models_dir}, so there is no sample input for "
                             "it: pass --input FILE (.npy: one sample)") from None
    for workload in ("video", "text"):
        try:
            chunks, _ = workload_chunks(manifest, workload, 1, seed, None)
            return {k: v[0] for k, v in next(chunks).items()}
        except ValueError:  # its inputs are not this workload's
            continue
    specs = ", ".join(f"{t.name} {t.shape} {t.dtype}" for t in manifest.inputs)
    raise InputFileError(f"no built-in sample fits {model}'s inputs ({specs}): pass --input "
                         "FILE (.npy: one sample; .npz: one array per input name)")


def run(args: argparse.Namespace) -> int:
    from services.common import bus
    from services.common.client import InferError, infer

    cfg = config_mod.load()
    labels: list[str] | None = None
    if args.input:
        inputs = _file_sample(cfg.models_dir, args.model, Path(args.input), args.input_name)
    elif args.text is not None:
        if args.model != "minilm-topics":
            raise SystemExit("error: --text needs a text model (minilm-topics)")
        from services.zoo.minilm_topics import CATEGORIES, encode_texts
        inputs = {k: v[0] for k, v in encode_texts([args.text]).items()}
        labels = list(CATEGORIES)
    else:
        inputs = built_in_sample(cfg.models_dir, args.model, args.seed)

    async def run() -> int:
        nc = await bus.connect_as(cfg, "client", "offramp-cli")
        try:
            # a router that dies holding the request: resent (same id) once its SLO is past
            slo_s = (args.slo_ms or cfg.default_slo_ms) / 1e3
            reply = await infer(nc, args.model, inputs, args.slo_ms,
                                timeout=max(cfg.request_timeout_s, 2 * slo_s + 2),
                                resend_after_s=slo_s + 1)
        except InferError as exc:
            print(json.dumps({"error": {"code": exc.code, "message": exc.message}}))
            return 1
        finally:
            await nc.close()
        reply.pop("outputs", None)
        if labels is not None:
            reply["label_name"] = labels[reply["label"]]
        print(json.dumps(reply))
        return 0

    return asyncio.run(run())
