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


def test_repeats_lets_through_the_first_a_change_and_a_reminder():
    from services.common.logs import Repeats

    r = Repeats(every_s=30.0)
    assert r.due("refused", 0.0) and r.take_hidden() == 0
    assert not any(r.due("refused", t) for t in (0.25, 0.5, 29.0))
    assert r.due("timeout", 29.5)             # another error: at once
    assert r.take_hidden() == 3               # ... and what was held back before it
    assert not r.due("timeout", 40.0)
    assert r.due("timeout", 59.5) and r.take_hidden() == 1  # a reminder while it lasts
