"""Service log lines carry their time, even when the CLI configured logging first."""

import logging
import re

from services.common import logs


def test_setup_stamps_lines_of_a_handler_configured_before_it(monkeypatch):
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    logging.basicConfig(level=logging.WARNING)  # what services.cli.main does first
    log = logs.setup("worker.m.0")
    record = log.makeRecord(log.name, logging.WARNING, __file__, 1, "worker lost %s",
                            (logs.kv(worker="w1"),), None)
    line = root.handlers[0].format(record)
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING offramp\.worker\.m\.0 "
                    r"worker lost worker=w1$", line), line
