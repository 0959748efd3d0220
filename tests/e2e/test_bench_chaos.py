"""`offramp bench chaos --quick` runs every scenario live on a private stack and writes its
JSON; what holds today holds: one reply per reply subject (two scenarios excepted, see the
duplicates test), no silent loss when a worker or the monitor dies, in a burst or under
fuzzing, every attack refused with serving unchanged, and the stack serving again after its
nats-server is killed.

A router's death loses the requests it still queued; the client's resend (same id, new
reply subject) gets them answered by the other router, and every answer is stored."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.e2e.conftest import REPO

pytestmark = pytest.mark.e2e

SCENARIOS = ("worker-kill", "router-kill", "monitor-kill", "nats-restart", "burst", "fuzz",
             "attacks")
FIGURES = ("requests", "ok", "errors", "silent_losses", "duplicate_replies", "answered_twice",
           "resent", "rows_due", "rows_missing", "rows_mismatched", "extra_rows", "facts")


@pytest.fixture(scope="module")
def chaos(models_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chaos")
    out = tmp / "chaos.json"
    env = {**os.environ, "OFFRAMP_HOME": str(tmp / "home"), "OFFRAMP_MODELS_DIR": str(models_dir)}
    for name in ("OFFRAMP_NATS_URL", "OFFRAMP_DATABASE_URL", "OFFRAMP_NATS_CREDENTIALS"):
        env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, "-m", "services.cli", "bench", "chaos", "--quick", "--model", "tiny",
         "--json", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=400, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "offramp bench chaos" in proc.stdout and "JSON written" in proc.stdout
    return json.loads(out.read_text())


def test_every_scenario_reports_every_figure(chaos):
    assert chaos["mode"] == "live" and chaos["model"] == "tiny" and chaos["quick"] is True
    assert chaos["deployment"]["routers"] == 2
    assert list(chaos["scenarios"]) == list(SCENARIOS)
    for name, r in chaos["scenarios"].items():
        assert "failed" not in r, (name, r)
        assert all(k in r for k in FIGURES), (name, sorted(r))
        assert r["requests"] > 0
        assert r["requests"] == r["ok"] + sum(r["errors"].values()) + r["silent_losses"], name


def test_no_request_gets_two_replies_on_one_subject(chaos):
    s = chaos["scenarios"]
    assert {n: r["duplicate_replies"] for n, r in s.items()} == dict.fromkeys(s, 0), s


def test_no_silent_loss_in_any_scenario(chaos):
    s = chaos["scenarios"]
    # the client resends as the contract says, so even nats-restart loses nothing
    for name in s:
        assert s[name]["silent_losses"] == 0, (name, s[name])
    assert s["worker-kill"]["facts"]["service_back_s"] is not None
    assert s["monitor-kill"]["facts"]["kills"] == 3
    assert s["burst"]["facts"]["burst"] == s["burst"]["requests"]


def test_every_fuzzed_message_is_answered_and_serving_goes_on(chaos):
    fuzz = chaos["scenarios"]["fuzz"]
    assert fuzz["requests"] == 2000 and fuzz["silent_losses"] == 0
    assert set(fuzz["errors"]) <= {"bad_request", "deadline_exceeded"}, fuzz["errors"]
    assert fuzz["facts"]["followup"]["ok"] == fuzz["facts"]["followup"]["requests"] == 200, fuzz
    assert fuzz["facts"]["services_restarted"] == {}, fuzz  # nothing crashed


def test_every_attack_is_refused_and_serving_is_unchanged(chaos):
    attacks = chaos["scenarios"]["attacks"]
    f = attacks["facts"]
    assert f["refused"] == dict.fromkeys(
        ("forged-config", "fake-worker", "router-queue", "forged-telemetry", "stream-delete"),
        True), f["violations"]
    assert f["config_version_after"] == f["config_version_before"]
    assert f["reply_config_versions"] == [f["config_version_before"]]
    assert f["forged_rows"] == 0 and f["stream_kept"] is True
    assert attacks["ok"] == attacks["requests"], attacks
    assert (attacks["rows_missing"], attacks["extra_rows"]) == (0, 0), attacks


def test_the_stack_serves_again_after_its_nats_server_is_killed(chaos):
    f = chaos["scenarios"]["nats-restart"]["facts"]
    assert f["recovered"] is True and f["recovery_s"] > 0, f
    assert f["nats_back_s"] is not None


def test_a_router_killed_with_a_backlog_loses_nothing_the_client_resends(chaos):
    r = chaos["scenarios"]["router-kill"]
    assert r["facts"]["killed"] == "router" and r["facts"]["resend_after_s"] == 2.0
    assert r["facts"]["unanswered_at_kill"] > 0
    assert r["silent_losses"] == 0 and r["duplicate_replies"] == 0, r
    assert (r["rows_missing"], r["rows_mismatched"]) == (0, 0), r
