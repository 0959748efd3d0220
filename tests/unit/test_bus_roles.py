"""Bus roles and credentials: what each role may do, the server block that enforces it, and
where services find their login."""

from __future__ import annotations

import json
import stat
from dataclasses import replace

import bcrypt
import pytest

from schemas import subjects
from schemas.roles import ROLES, inbox_prefix
from services.common import config as config_mod
from services.common.credentials import (
    CredentialsError,
    Login,
    home_file,
    login_for,
    read,
    server_url,
    server_url_file,
    url_user,
    with_login,
    write,
)
from services.launcher.nats_auth import authorization_block, ensure_logins


def _matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: ``*`` one token, ``>`` the rest."""
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(p) == len(s)


def _may(role: str, action: str, subject: str) -> bool:
    perms = ROLES[role]
    grants = perms.publish if action == "publish" else (*perms.subscribe,
                                                          f"{inbox_prefix(role)}.>")
    return any(_matches(g, subject) for g in grants)


ATTACKS = [("publish", subjects.exit_config("m")), ("publish", subjects.HEARTBEAT),
           ("subscribe", subjects.work("m-s0-abcdef")), ("subscribe", subjects.INFER_ALL),
           ("publish", subjects.telemetry_requests("m")),
           ("publish", f"$JS.API.STREAM.DELETE.{subjects.TELEMETRY_STREAM}")]


@pytest.mark.parametrize(("action", "subject"), ATTACKS)
def test_a_client_may_do_none_of_the_attacks(action, subject):
    assert not _may("client", action, subject)


def test_a_client_requests_and_reads_only_its_own_inbox():
    assert _may("client", "publish", subjects.infer("efficientnet-lite0"))
    assert _may("client", "publish", subjects.MODELS)
    assert _may("client", "subscribe", "_INBOX.client.abc.1")
    assert not _may("client", "subscribe", "_INBOX.router.abc.1")
    assert not _may("client", "publish", "_INBOX.client.abc.1")  # cannot forge answers


def test_no_role_may_delete_or_edit_the_stream():
    for role in ROLES:
        for api in ("DELETE", "PURGE", "UPDATE"):
            assert not _may(role, "publish", f"$JS.API.STREAM.{api}.{subjects.TELEMETRY_STREAM}")


def test_each_service_role_may_do_what_its_service_does():
    m = "tiny"
    assert _may("router", "subscribe", subjects.infer(m))
    assert _may("router", "publish", subjects.work(f"{m}-s0-abcdef"))
    assert _may("worker", "publish", subjects.stage(m, 1))
    assert _may("worker", "publish", subjects.results("router-0011aabb"))
    assert _may("worker", "publish", "_INBOX.client.x.7")  # answers clients directly
    assert _may("tuner", "publish", subjects.exit_config(m))
    assert _may("admin", "publish", subjects.exit_config(m))
    assert _may("monitor", "publish",
                f"$JS.API.CONSUMER.MSG.NEXT.{subjects.TELEMETRY_STREAM}.{subjects.MONITOR_DURABLE}")
    assert not ROLES["observer"].publish


def test_the_server_block_holds_hashes_that_verify_and_denies_empty_grants(tmp_path):
    logins = ensure_logins(tmp_path / "c.json")
    block = authorization_block(logins)
    assert block.startswith("authorization ")
    users = {u["user"]: u for u in json.loads(block.split(" ", 1)[1])["users"]}
    assert set(users) == set(ROLES)
    for role, login in logins.items():
        hashed = users[role]["password"]
        assert login.password not in block
        assert bcrypt.checkpw(login.password.encode(), hashed.encode())
    assert users["observer"]["permissions"]["publish"] == {"deny": [">"]}
    assert users["monitor"]["permissions"]["allow_responses"] is True
    assert "_INBOX.client.>" in users["client"]["permissions"]["subscribe"]["allow"]


def test_logins_are_kept_completed_and_private(tmp_path):
    path = tmp_path / "nats" / "credentials.json"
    write(path, {"client": Login("client", "kept")})
    logins = ensure_logins(path)
    assert logins["client"].password == "kept" and set(logins) == set(ROLES)
    assert read(path) == logins
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("{not json")
    with pytest.raises(CredentialsError, match="unreadable"):
        ensure_logins(path)  # never overwrite a file it cannot read


def test_where_a_service_finds_its_login(tmp_path, monkeypatch):
    monkeypatch.delenv("OFFRAMP_NATS_CREDENTIALS", raising=False)
    monkeypatch.delenv("OFFRAMP_NATS_URL", raising=False)
    cfg = replace(config_mod.load(), home=tmp_path)
    assert login_for(cfg, "router") is None  # an open server: connect without a login
    write(home_file(tmp_path), {"router": Login("router", "pw")})
    assert login_for(cfg, "router") == Login("router", "pw")
    assert login_for(cfg, "tuner") is None
    own = tmp_path / "mine.json"
    write(own, {"worker": Login("w1", "secret")})
    cfg = replace(cfg, nats_credentials=own)
    assert login_for(cfg, "worker") == Login("w1", "secret")
    with pytest.raises(CredentialsError, match="no credentials for role 'router'"):
        login_for(cfg, "router")
    with pytest.raises(CredentialsError, match="no credentials file"):
        login_for(replace(cfg, nats_credentials=tmp_path / "missing.json"), "worker")


def test_urls_carry_and_reveal_the_login(tmp_path, monkeypatch):
    url = with_login("nats://127.0.0.1:4222", Login("client", "abc-_9"))
    assert url == "nats://client:abc-_9@127.0.0.1:4222" and url_user(url) == "client"
    assert url_user("nats://127.0.0.1:4222") is None
    monkeypatch.delenv("OFFRAMP_NATS_URL", raising=False)
    cfg = replace(config_mod.load(), home=tmp_path, nats_url=None)
    assert server_url(cfg) == "nats://127.0.0.1:4222"
    server_url_file(tmp_path).parent.mkdir(parents=True)
    server_url_file(tmp_path).write_text("nats://127.0.0.1:5555\n")
    assert server_url(cfg) == "nats://127.0.0.1:5555"  # the server `up` started
    assert server_url(replace(cfg, nats_url="nats://h:1")) == "nats://h:1"


def test_the_contract_tables_every_role_as_enforced():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "schemas" / "README.md").read_text()
    for role, perms in ROLES.items():
        pub = ", ".join(f"`{x}`" for x in perms.publish) or "nothing"
        if perms.responds:
            pub += " (and replies to requests it receives)"
        sub = ", ".join(f"`{x}`" for x in (*perms.subscribe, f"{inbox_prefix(role)}.>"))
        assert f"| `{role}` | {pub} | {sub} |" in text, role


def test_an_application_gets_a_client_login_and_an_inbox_of_its_own(tmp_path):
    from services.launcher.nats_auth import ensure_app_login

    path = tmp_path / "c.json"
    app = ensure_app_login(path, "shop-1")
    assert app.user == "client-shop-1" and ensure_app_login(path, "shop-1") == app  # kept
    users = {u["user"]: u for u in json.loads(
        authorization_block(read(path)).split(" ", 1)[1])["users"]}
    mine = users["client-shop-1"]["permissions"]
    assert mine["publish"] == users["client"]["permissions"]["publish"]
    assert mine["subscribe"]["allow"] == ["_INBOX.client-shop-1.>"]  # not _INBOX.client.>
    with pytest.raises(CredentialsError, match="application name"):
        ensure_app_login(path, "a.b")  # a subject token: no dots or wildcards
