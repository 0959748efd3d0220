"""``offramp bench``: each bench lists and accepts only the options it reads."""

from __future__ import annotations

import pytest

from services.cli import bench
from services.cli.main import build_parser


def _bench_parser():
    args = build_parser().parse_args(["bench", "overhead"])
    return args.fn.keywords["parser"]


def test_every_option_belongs_to_a_bench_and_every_listed_option_exists():
    dests = {a.dest for a in _bench_parser()._actions if a.option_strings}
    owned = set().union(*bench.OPTIONS.values()) | bench.COMMON
    assert dests - owned == set()       # an option no bench reads
    assert owned - dests == set()       # a listed option the parser lacks
    assert set(bench.OPTIONS) == set(bench.BENCHES)


@pytest.mark.parametrize("argv, foreign", [
    (["bench", "apparate", "--trace", "t.npz", "--faults"], "--faults"),
    (["bench", "overhead", "--adapt", "--workers", "3"], "--workers"),
    (["bench", "decode", "--ri", "10"], "--ri"),
])
def test_an_option_another_bench_reads_is_refused(argv, foreign, capsys):
    args = build_parser().parse_args(argv)
    with pytest.raises(SystemExit) as exc:
        args.fn(args)    # refused before any set-up
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"bench {argv[1]} does not read" in err and foreign in err
    assert f"offramp bench {argv[1]} --help" in err


def test_options_at_their_defaults_and_shared_options_pass():
    p = build_parser()
    for argv in (["bench", "decode", "--seed", "0"],           # the default: harmless
                 ["bench", "e3", "--sim", "--seed", "3", "--slo-ms", "50"],
                 ["bench", "superserve", "--sim", "--workers", "2", "--seconds", "5"],
                 ["bench", "helios", "--sim", "--threshold", "0.8", "--plot", "x.svg"]):
        args = p.parse_args(argv)
        assert bench.foreign_options(args.fn.keywords["parser"], args) == []


def test_help_of_one_bench_lists_its_options_only(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["bench", "e3", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--adapt" in out and "--shadow-rate" in out and "--json" in out
    assert "--ceiling" not in out and "--faults" not in out and "--ri" not in out


def test_help_without_a_bench_points_to_the_bench_help(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--help"])
    assert "offramp bench WHICH --help" in capsys.readouterr().out
