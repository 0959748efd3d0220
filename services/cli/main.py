"""``offramp`` command line: up | serve | prepare | infer | generate | status | demo | bench |
trace | db | exit-config | credentials, one module each in this package.

Subcommand modules import what they run inside ``run``: every service starts as
``offramp serve X`` and must not pay for torch, ONNX or the zoo at start-up."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from services.cli import (
    bench,
    credentials,
    db,
    demo,
    exit_config,
    generate,
    infer,
    prepare,
    serve,
    status,
    trace,
    up,
)
from services.common import config as config_mod
from services.common.bus import AuthorizationError, BusUnreachable
from services.common.credentials import CredentialsError
from services.common.memory import keep_large_buffers
from services.launcher.home_lock import StackRunning
from services.runtime.input_files import InputFileError
from services.runtime.manifest import ModelNotPrepared

COMMANDS = (up, serve, prepare, infer, generate, status, demo, bench, trace, db, exit_config,
            credentials)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="offramp", description="offramp serves models with "
                                "early exits over NATS: `offramp up` starts a stack, `offramp "
                                "COMMAND --help` says more (README.md: quickstart, commands)")
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    keep_large_buffers()  # every command moves or builds large buffers (services/common/memory.py)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        return int(args.fn(args) or 0)
    except (config_mod.ConfigError, ModelNotPrepared, InputFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (AuthorizationError, CredentialsError, StackRunning) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except BusUnreachable as exc:
        print(f"error: {exc}; is the stack up? (`offramp up`, or OFFRAMP_NATS_URL for "
              "another one)", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # the reader went away (`offramp db query ... | head`): stop quietly, as a shell
        # tool would, and keep the interpreter's final flush from raising again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
