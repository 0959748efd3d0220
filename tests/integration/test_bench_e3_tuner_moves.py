"""The live E3 bench counts each phase's tuner decisions from the store's exit configs
(services.bench.e3_live.tuner_moves): only the tuner's, only since the phase began."""

from __future__ import annotations

import time
from types import SimpleNamespace

from services.bench.e3_live import tuner_moves


def test_tuner_moves_count_the_tuners_configs_since_a_time(store, url) -> None:
    store.save_exit_config("m", {0: 0.1}, [0], "compute", "tuner alert/tune: before")
    time.sleep(0.05)
    since = time.time()
    time.sleep(0.05)
    for reason in ("bench e3: naive_ee", "tuner alert/tune: window agreement 0.9 < 0.99",
                   "tuner slack/tune: 8 clean windows", "tuner slack/tune: 8 clean windows"):
        store.save_exit_config("m", {0: 0.2}, [0], "compute", reason)
    store.save_exit_config("other", {0: 0.2}, [0], "compute", "tuner alert/tune: x")
    assert tuner_moves(SimpleNamespace(database_url=url), "m", since) == {"alert": 1,
                                                                          "slack": 2}
