"""A mistyped model or a bad input file gets one `error:` line and exit code 2 from the
CLI, never a traceback; a prepared model outside the zoo still gets a sample input
(runs `offramp` in process; no stack needed: each fails before it connects)."""

import numpy as np
import pytest

from services.cli.infer import built_in_sample
from services.cli.main import main
from services.runtime.input_files import InputFileError
from services.runtime.manifest import BlockSpec, Manifest, TensorSpec


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("OFFRAMP_HOME", str(tmp_path))
    monkeypatch.setenv("OFFRAMP_MODELS_DIR", str(tmp_path / "models"))
    return tmp_path


def prepared(models_dir, name: str, inputs: list[TensorSpec]) -> None:
    """A manifest alone: enough for what reads only the model's inputs."""
    m = Manifest(name, "", "classifier", inputs, [TensorSpec("logits", "<f4", [10])], 10,
                 [BlockSpec(0, "block_0.onnx", "0" * 64, [t.name for t in inputs], [10])],
                 [], 1000, 1.0)
    (models_dir / name).mkdir(parents=True)
    m.save(models_dir / name)


@pytest.mark.parametrize("argv, said", [
    (["infer", "nosuch"], "nosuch is neither a zoo model (chain-cnn, efficientnet-lite0"),
    (["infer", "efficientnet-lite0", "--input", "gone.npy"], "input file gone.npy does not exist"),
    (["infer", "nosuch", "--input", "one.npy"], "pass --input-name NAME"),
    (["infer", "efficientnet-lite0", "--input", "notes.npz"], "notes.npz is not a readable"),
    (["trace", "record", "--model", "nosuch", "--workload", "video", "--out", "t.npz"],
     "nosuch is not prepared under"),
    (["bench", "superserve", "--sim", "--model", "nosuch", "--json", "s.json"],
     "(run `offramp prepare nosuch`)"),
    (["bench", "decode", "--model", "nosuch", "--json", "d.json"],
     "(run `offramp prepare nosuch`)"),
])
def test_user_mistakes_get_one_error_line(home, monkeypatch, capsys, argv, said):
    monkeypatch.chdir(home)
    np.save(home / "one.npy", np.zeros((3, 8, 8), np.float32))
    (home / "notes.npz").write_text("not arrays")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and said in err and "Traceback" not in err


def test_trace_record_names_a_missing_inputs_file(home, monkeypatch, capsys):
    prepared(home / "models", "mine", [TensorSpec("image", "<f4", [3, 32, 32])])
    assert main(["trace", "record", "--model", "mine", "--inputs", str(home / "gone.npz"),
                 "--out", str(home / "t.npz")]) == 2
    assert "input file" in capsys.readouterr().err


def test_a_prepared_model_outside_the_zoo_gets_a_frame_or_a_clear_refusal(home):
    models = home / "models"
    prepared(models, "cold-copy", [TensorSpec("image", "<f4", [3, 32, 32])])
    sample = built_in_sample(models, "cold-copy", seed=3)
    assert list(sample) == ["image"] and sample["image"].shape == (3, 32, 32)
    assert sample["image"].dtype == np.float32
    (models / "gen").mkdir()
    (models / "gen" / "manifest.json").write_text('{"kind": "llm", "name": "gen"}')
    with pytest.raises(InputFileError, match="gen is a generative model: offramp generate gen"):
        built_in_sample(models, "gen", seed=0)
    prepared(models, "tabular", [TensorSpec("x", "<f4", [7])])
    with pytest.raises(InputFileError, match=r"no built-in sample fits tabular's inputs "
                                             r"\(x \[7\] <f4\): pass --input"):
        built_in_sample(models, "tabular", seed=0)


def test_up_refuses_cuts_no_worker_could_serve_before_starting_any(home):
    from services.cli.up import check_cuts, parse_cuts

    with pytest.raises(SystemExit, match="block indices as cuts, got 'm=abc'"):
        parse_cuts(["m=abc"])
    models = home / "models"
    prepared(models, "m", [TensorSpec("x", "<f4", [7])])  # one block
    m = Manifest.load(models / "m")
    m.blocks = [m.blocks[0]] * 4
    m.save(models / "m")
    check_cuts(parse_cuts(["m=1,3"]), ("m",), models)  # fine: 1..3 of 4 blocks
    for split, said in [("m=4", r"from 1 to 3 \(m has 4 blocks\)"), ("m=2,2", "distinct"),
                        ("m=0", "from 1 to 3"), ("other=1", "other is not served")]:
        with pytest.raises(SystemExit, match=said):
            check_cuts(parse_cuts([split]), ("m",), models)


@pytest.mark.parametrize("argv, said", [
    (["infer", "m", "--seed", "-1"], "argument --seed: must be >= 0"),
    (["bench", "overhead", "--requests", "0"], "argument --requests: must be >= 1"),
    (["bench", "apparate", "--trace", "t.npz", "--constraint", "5"],
     "argument --constraint: is a share of answers in [0, 1)"),
    (["bench", "apparate", "--trace", "t.npz", "--budget", "-1"], "argument --budget: must be"),
    (["bench", "apparate", "--trace", "t.npz", "--seed", "x"], "argument --seed: not an integer"),
])
def test_impossible_numbers_are_refused_before_any_work(home, capsys, argv, said):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and said in capsys.readouterr().err


def test_up_refuses_a_stage_without_workers(home):
    with pytest.raises(SystemExit, match="--replicas must be at least 1"):
        main(["up", "--replicas", "0"])
