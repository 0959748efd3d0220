"""``offramp generate MODEL PROMPT``: stream a generation through the wire contract, printing
the text as it comes and a summary (usage, timings, the layers tokens ran) at the end."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from services.common import config as config_mod


def register(sub: argparse._SubParsersAction) -> None:
    gen = sub.add_parser("generate", help="stream tokens from a generative model "
                         "(offramp.generate.<model>)")
    gen.add_argument("model", help="e.g. smollm2-135m")
    gen.add_argument("prompt")
    gen.add_argument("--max-tokens", type=int, default=64, help="tokens to generate at most")
    gen.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    gen.add_argument("--ttft-slo-ms", type=float, help="deadline of the first token")
    gen.add_argument("--json", action="store_true", help="print every message as JSON instead")
    gen.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    from services.common import bus
    from services.common.client import InferError, generate

    cfg = config_mod.load()

    async def go() -> int:
        nc = await bus.connect_as(cfg, "client", "offramp-cli")
        try:
            async for msg in generate(nc, args.model, args.prompt, max_tokens=args.max_tokens,
                                      stop=tuple(args.stop), chat=args.chat,
                                      ttft_slo_ms=args.ttft_slo_ms):
                if args.json:
                    print(json.dumps(msg), flush=True)
                elif msg.get("done"):
                    print(file=sys.stderr)
                    print(json.dumps({k: msg[k] for k in ("finish", "candidate", "depth",
                                                          "usage", "timings", "exits")}),
                          file=sys.stderr)
                else:
                    print(msg["text"], end="", flush=True)
        except InferError as exc:
            print(json.dumps({"error": {"code": exc.code, "message": exc.message}}))
            return 1
        finally:
            await nc.close()
        return 0

    return asyncio.run(go())
