"""The CLI reports a bad OFFRAMP_* setting without a traceback (runs `offramp`)."""

from services.cli.main import main


def test_cli_reports_a_bad_setting_without_a_traceback(monkeypatch, capsys):
    monkeypatch.setenv("OFFRAMP_ORT_SPIN", "sometimes")
    assert main(["status"]) == 2
    assert "error: OFFRAMP_ORT_SPIN='sometimes'" in capsys.readouterr().err
