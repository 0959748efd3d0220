"""`offramp trace record` refuses bad scene lengths (a prepared model)."""



def test_trace_record_rejects_bad_scene_frames(models_dir, capsys):
    from services.cli import trace as trace_cli

    rc = trace_cli.main(["record", "--model", "tiny", "--workload", "video", "--n", "4",
                         "--scene-frames", "9:3", "--out", "unused.npz",
                         "--models-dir", str(models_dir)])
    assert rc == 2 and "scene frames must be MIN:MAX" in capsys.readouterr().err
