"""`offramp db query` reads the store on every backend without a database client, and
writes nothing; `offramp exit-config MODEL` without options shows the config in force, and a
change that names no ramps keeps the active set in force."""

import json

import pytest

from services.cli.main import main
from services.exits.depth_caps import lever_caps
from tests.integration.test_store_repository import MANIFEST


@pytest.fixture
def configs(store, url, monkeypatch, tmp_path):
    monkeypatch.setenv("OFFRAMP_HOME", str(tmp_path))
    monkeypatch.setenv("OFFRAMP_DATABASE_URL", url)
    store.save_exit_config("m", {0: 0.1, 1: 0.2}, [0, 1], "latency", "first")
    store.save_exit_config("m", {0: 0.3, 1: 0.2}, [0], "latency", "second: 10:30, 5% off")
    return store


def query(capsys, *argv):
    rc = main(["db", "query", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_rows_come_back_as_a_table_csv_or_json(configs, capsys):
    rc, out, _ = query(capsys, "SELECT version, reason FROM exit_configs ORDER BY version")
    lines = out.splitlines()
    assert rc == 0 and lines[0].split() == ["version", "reason"] and lines[-1] == "(2 rows)"
    assert lines[3].startswith("2 ") and lines[3].endswith("second: 10:30, 5% off")
    rc, out, _ = query(capsys, "SELECT version, mode FROM exit_configs ORDER BY version",
                       "--format", "csv")
    assert rc == 0 and out.splitlines() == ["version,mode", "1,latency", "2,latency"]
    rc, out, _ = query(capsys, "SELECT version, created_at FROM exit_configs", "--format", "json")
    rows = [json.loads(line) for line in out.splitlines()]
    assert rc == 0 and sorted(r["version"] for r in rows) == [1, 2]
    assert all(isinstance(r["created_at"], str) for r in rows)  # times as text


def test_a_query_that_would_write_or_is_wrong_changes_nothing(configs, capsys):
    rc, _, err = query(capsys, "DELETE FROM exit_configs")
    assert rc == 2 and err.startswith("error: ") and "read" in err.lower()
    assert configs.latest_exit_config("m").version == 2
    rc, _, err = query(capsys, "SELEC 1")
    assert rc == 2 and "syntax" in err.lower()
    rc, _, err = query(capsys, "  ")
    assert rc == 2 and "needs SQL" in err
    rc, _, err = query(capsys, "SELECT * FROM nosuch")
    assert rc == 2 and "nosuch" in err and "README" in err


def test_no_store_yet_is_named_and_not_created(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OFFRAMP_HOME", str(tmp_path))
    rc, _, err = query(capsys, "SELECT 1", "--url", f"sqlite:///{tmp_path / 'none.db'}")
    assert rc == 2 and "no store at" in err and "offramp up" in err
    none = f"sqlite:///{tmp_path / 'none.db'}"
    assert main(["db", "current", "--url", none]) == 0
    assert main(["db", "downgrade", "--url", none]) == 2
    assert capsys.readouterr().out.count("no store at") == 2
    assert not (tmp_path / "none.db").exists()


def test_exit_config_before_any_store_names_it_and_creates_none(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OFFRAMP_HOME", str(tmp_path))
    monkeypatch.delenv("OFFRAMP_DATABASE_URL", raising=False)
    for argv in (["exit-config", "m"], ["exit-config", "m", "--threshold", "0.2"]):
        assert main(argv) == 2
        assert f"no store at {tmp_path / 'offramp.db'} yet" in capsys.readouterr().out
    assert not (tmp_path / "offramp.db").exists()


def test_exit_config_without_options_shows_and_stores_nothing(configs, capsys):
    assert main(["exit-config", "m"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("exit config v2 for m (latency mode)") and "second" in out
    assert "active=[0]" in out and configs.latest_exit_config("m").version == 2
    assert main(["exit-config", "nosuch"]) == 2
    assert "'nosuch' has no exit config" in capsys.readouterr().out


def test_exit_config_changes_keep_the_active_set_unless_told(store, url, monkeypatch, tmp_path,
                                                             capsys):
    monkeypatch.setenv("OFFRAMP_HOME", str(tmp_path))
    monkeypatch.setenv("OFFRAMP_DATABASE_URL", url)

    async def no_server(*_args, **_kwargs):
        raise RuntimeError("no server in this test")

    monkeypatch.setattr("services.common.bus.connect", no_server)
    store.register_model(MANIFEST, str(tmp_path))
    ramps = [r["index"] for r in store.ramps("tiny")]
    assert len(ramps) >= 2
    store.save_exit_config("tiny", dict.fromkeys(ramps, 0.0), [ramps[1]], "latency", "initial")

    def latest():
        return store.latest_exit_config("tiny")

    assert main(["exit-config", "tiny", "--threshold", "0.4"]) == 0
    assert "not broadcast" in capsys.readouterr().out
    assert latest().active == [ramps[1]] and latest().thresholds[ramps[1]] == 0.4
    assert latest().thresholds[ramps[0]] == 0.0  # an inactive ramp's threshold is kept
    assert main(["exit-config", "tiny", "--mode", "compute"]) == 0
    assert latest().active == [ramps[1]] and latest().mode == "compute"
    assert main(["exit-config", "tiny", "--active", "all", "--threshold", "0.2"]) == 0
    assert latest().active == ramps and set(latest().thresholds.values()) == {0.2}
    assert main(["exit-config", "tiny", "--active", "none", "--threshold", "0.3"]) == 0
    assert latest().active == [] and "no ramp is active" not in capsys.readouterr().out
    assert main(["exit-config", "tiny", "--threshold", "0.3"]) == 0  # vanilla stays vanilla
    assert latest().active == [] and "no ramp is active" in capsys.readouterr().out
    version = latest().version
    assert main(["exit-config", "tiny", "--active", "x,1"]) == 2
    assert "use all, none, caps or a comma list" in capsys.readouterr().out
    assert main(["exit-config", "tiny", "--active", "99"]) == 2
    assert "unknown ramp(s) [99]" in capsys.readouterr().out
    assert main(["exit-config", "tiny", "--threshold", "1.5"]) == 2  # even with none active
    assert "must be in [0, 1]" in capsys.readouterr().out
    assert main(["exit-config", "tiny", "--active", "99"]) == 2
    assert "unknown ramp(s) [99]" in capsys.readouterr().out
    for bad in ("x", "3=abc", "a=0.2"):
        assert main(["exit-config", "tiny", "--set", bad]) == 2
        assert "use RAMP=THRESHOLD" in capsys.readouterr().out
    assert main(["exit-config", "tiny", "--reason", "why not"]) == 2
    assert "pass the change too" in capsys.readouterr().out
    assert latest().version == version  # refused: nothing stored
    assert main(["exit-config", "tiny", "--active", str(ramps[1]), "--set", f"{ramps[0]}=0.1"]) == 0
    assert f"ramp(s) [{ramps[0]}] are not active" in capsys.readouterr().out
    assert main(["exit-config", "tiny", "--active", "caps", "--mode", "compute"]) == 0
    assert latest().active == lever_caps(MANIFEST) != [] and latest().mode == "compute"


def test_a_reader_that_goes_away_ends_the_query_quietly(tmp_path):
    """`offramp db query ... | head -1`: no traceback when head stops reading."""
    import subprocess
    import sys

    db = f"sqlite:///{tmp_path / 'o.db'}"
    assert main(["db", "upgrade", "--url", db]) == 0
    sql = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200000) "
           "SELECT x FROM c")
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "db", "query", sql,
                             "--url", db, "--format", "csv"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"x\n"
    proc.stdout.close()  # the reader goes away with most rows unread
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 141
    assert "Traceback" not in err and "BrokenPipe" not in err
