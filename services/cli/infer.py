"""``offramp infer MODEL``: send one request through the wire contract and print the reply."""

from __future__ import annotations

import argparse
import asyncio
import json

from services.common import config as config_mod


def register(sub: argparse._SubParsersAction) -> None:
    inf = sub.add_parser("infer", help="send one request (a real client of the wire contract)")
    inf.add_argument("model")
    inf.add_argument("--input", help=".npy (one sample) or .npz (one array per input name)")
    inf.add_argument("--input-name")
    inf.add_argument("--text", help="a text for minilm-topics (tokenised client-side)")
    inf.add_argument("--seed", type=int, default=0, help="sample input seed when --input is absent")
    inf.add_argument("--slo-ms", type=float)
    inf.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from services.common import bus
    from services.common.client import InferError, infer

    cfg = config_mod.load()
    labels: list[str] | None = None
    if args.input:
        arr = np.load(args.input)
        inputs = dict(arr) if hasattr(arr, "files") else {args.input_name or "x": arr}
        if args.input_name is None and not hasattr(arr, "files"):
            from services.runtime.manifest import Manifest
            inputs = {Manifest.load(cfg.models_dir / args.model).inputs[0].name: arr}
    elif args.text is not None:
        if args.model != "minilm-topics":
            raise SystemExit("--text needs a text model (minilm-topics)")
        from services.zoo.minilm_topics import CATEGORIES, encode_texts
        inputs = {k: v[0] for k, v in encode_texts([args.text]).items()}
        labels = list(CATEGORIES)
    else:
        from services.zoo.registry import sample_inputs
        inputs = {k: v[0] for k, v in sample_inputs(args.model, 1, seed=args.seed).items()}

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
