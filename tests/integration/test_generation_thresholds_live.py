"""The tuner's generation role end to end on the store: token-level feedback below the
agreement target raises a head's threshold in a new stored exit config (generation mode),
broadcast to the model's LLM workers, which score that head at it from the next round on;
a restarted role starts from the stored config."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from types import SimpleNamespace

from schemas import subjects
from schemas.helios import GenerationRecord, GenerationTelemetry
from schemas.messages import GENERATION, ExitConfig, decode_map
from services.common import config as config_mod
from services.store import Store, migrate
from services.tuner.generation_role import GenerationTuning


class FakeBus:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, data: bytes) -> None:
        self.sent.append((subject, data))


def _telemetry(feedback: list[tuple[int, float, int]]) -> GenerationTelemetry:
    rec = GenerationRecord("r1", 0.0, "chat", 30, None, 5, len(feedback), 10.0, 5.0, 50.0,
                           -1.0, {27: len(feedback)}, feedback=feedback)
    return GenerationTelemetry("chat", "chat-llm-1", [rec])


def test_feedback_below_target_raises_a_head_and_the_config_reaches_workers(url: str):
    migrate.upgrade(url)
    cfg = dataclasses.replace(config_mod.load(), accuracy_loss=0.1, llm_threshold=0.9)
    bus = FakeBus()
    with Store(url) as store:
        role = GenerationTuning(bus, cfg, store, logging.getLogger("t"))
        # head 27: 70 of 100 agree (target 0.9); those at >= 0.93 all do
        feedback = [(27, 0.97, 1)] * 60 + [(27, 0.93, 1)] * 10 + [(27, 0.92, 0)] * 30
        asyncio.run(role.observe(_telemetry(feedback)))
        latest = store.latest_exit_config("chat")
        assert latest.mode == GENERATION and latest.thresholds == {27: 0.93}
        assert "head 27: 0.900 -> 0.930 (agreement 0.7000 over 100" in latest.reason
        (subject, data), = bus.sent
        assert subject == subjects.exit_config("chat")
        config = ExitConfig.decode(decode_map(data))
        assert (config.version, config.thresholds) == (latest.version, {27: 0.93})
        again = GenerationTuning(FakeBus(), cfg, store, logging.getLogger("t"))
        again.resume("chat")  # restarted: the stored config, broadcast with no stream ending
        assert again.deployed["chat"].thresholds == {27: 0.93}

        async def one_round() -> None:
            stop = asyncio.Event()
            task = asyncio.ensure_future(again.keep_broadcasting(stop))
            await asyncio.sleep(0.05)
            stop.set()
            await task

        asyncio.run(one_round())
        (subject, data), = again.nc.sent
        assert ExitConfig.decode(decode_map(data)).thresholds == {27: 0.93}
    _worker_adopts(config)


def _worker_adopts(config: ExitConfig) -> None:
    import services.worker.llm_service as svc
    from services.runtime.llm_heads import ExitHeads
    from services.runtime.llm_model import LoadedLlm
    from services.zoo import tiny_llm

    tok = tiny_llm.tokenizer()
    llm = LoadedLlm(SimpleNamespace(name="chat"), tiny_llm.model(len(tok)), tok,
                    ExitHeads(64, [2, 4]))
    cfg = dataclasses.replace(config_mod.load(), llm_heads="all", llm_threshold=0.9)
    w = svc.LlmWorker(SimpleNamespace(), cfg, "chat", llm, logging.getLogger("t"))
    assert w.thresholds == {2: 0.9, 4: 0.9}
    w.on_config(SimpleNamespace(data=ExitConfig("chat", 3, GENERATION, {4: 0.97}, [4]).encode()))
    assert w.thresholds == {2: 0.9, 4: 0.97} and w.config_version == 3
    w.on_config(SimpleNamespace(data=ExitConfig("chat", 2, GENERATION, {4: 0.5}, [4]).encode()))
    w.on_config(SimpleNamespace(data=ExitConfig("chat", 9, "latency", {4: 0.5}, [4]).encode()))
    assert w.thresholds == {2: 0.9, 4: 0.97}  # older, or not a generation config: ignored
