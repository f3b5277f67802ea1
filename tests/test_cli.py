"""The command line end to end on generated data: train, resume, evaluate,
translate, export (tensorflow backend)."""

import json
import os
import re
import subprocess
import sys

import keras
import pytest

if keras.backend.backend() != "tensorflow":
    pytest.skip("the CLI uses the tensorflow backend", allow_module_level=True)

from keras_transformer.cli import main  # noqa: E402
from keras_transformer.data.synthetic import write_synthetic_corpus  # noqa: E402


@pytest.mark.slow
def test_train_resume_evaluate_translate_export(tmp_path, capsys):
    data = tmp_path / "data"
    write_synthetic_corpus(str(data), n_train=400, n_val=40, seed=2)
    run = str(tmp_path / "run")
    train_args = [
        "train", "--train-src", str(data / "train.en"), "--train-tgt", str(data / "train.de"),
        "--val-src", str(data / "val.en"), "--val-tgt", str(data / "val.de"),
        "--output-dir", run, "--preset", "tiny", "--num-layers", "1", "--sequence-length", "24",
        "--src-vocab-size", "150", "--tgt-vocab-size", "180", "--tokens-per-batch", "1024",
        "--warmup-steps", "20", "--epochs", "1",
    ]
    main(train_args)
    with open(os.path.join(run, "log.csv")) as f:
        assert len(f.read().strip().splitlines()) == 2  # header + epoch 1
    # Starting again with more epochs continues from epoch 1 (BackupAndRestore).
    main(train_args[:-1] + ["2"])
    with open(os.path.join(run, "log.csv")) as f:
        epochs = [line.split(",")[0] for line in f.read().strip().splitlines()[1:]]
    assert epochs == ["0", "1"]
    # Resuming with other model sizes is refused before anything is touched.
    with open(os.path.join(run, "config.json")) as f:
        saved_config = f.read()
    with pytest.raises(SystemExit) as info:
        main(train_args[:-1] + ["3", "--d-model", "64"])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert "d_model 128 -> 64" in err and "--output-dir" in err
    with open(os.path.join(run, "config.json")) as f:
        assert f.read() == saved_config
    # So is resuming it with its files swapped (it trained en->de weights and
    # tokenizers on de->en pairs, a new-user trial).
    swapped = [{"train.en": "train.de", "train.de": "train.en"}.get(os.path.basename(a), None) for a in train_args]
    with pytest.raises(SystemExit) as info:
        main([str(data / name) if name else a for a, name in zip(train_args, swapped)])
    assert info.value.code == 1 and "languages en->de -> de->en" in capsys.readouterr().err
    # The folder alone resumes it with its own settings (validation files included).
    main(["train", "--output-dir", run])
    captured = capsys.readouterr()
    assert f"Settings from {os.path.join(run, 'config.json')}" in captured.err
    assert "Nothing trained" in captured.out and "Settings changed" not in captured.out
    with open(os.path.join(run, "config.json")) as f:
        assert json.load(f)["training"] == json.loads(saved_config)["training"]
    for name in ("config.json", "best.keras", "model.keras", "source.model", "target.model"):
        assert os.path.exists(os.path.join(run, name)), name
    capsys.readouterr()

    main(["evaluate", "--run", run, "--src", str(data / "val.en"), "--ref", str(data / "val.de"),
          "--beam-size", "2"])
    out = capsys.readouterr().out
    scores = json.loads(out[out.index("{"):])
    for key in ("bleu", "bleu_lowercase", "chrf"):
        assert 0.0 <= scores[key] <= 100.0

    main(["translate", "--run", run, "--beam-size", "1", "A dog runs.", "The cat sleeps."])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2

    plot = tmp_path / "attention.png"
    main(["translate", "--run", run, "--beam-size", "1", "--plot-attention", str(plot), "A dog runs."])
    assert capsys.readouterr().out.strip().splitlines() == lines[:1]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A blank first sentence plotted an end token attending to an end token (a new-user trial).
    for blank in (" ", "\u200b"):
        with pytest.raises(SystemExit):
            main(["translate", "--run", run, "--beam-size", "1", "--plot-attention", str(tmp_path / "b.png"),
                  blank, "A dog runs."])
        assert "--plot-attention plots the first sentence, and it is blank" in capsys.readouterr().err
    assert not (tmp_path / "b.png").exists()

    saved = str(tmp_path / "saved")
    main(["export", "--run", run, "--output", saved, "--beam-size", "1"])
    capsys.readouterr()
    main(["translate", "--saved-model", saved, "A dog runs.", "The cat sleeps."])
    captured = capsys.readouterr()
    assert captured.out.strip().splitlines() == lines and "source limit" not in captured.err
    assert "each translated as its own sentence" not in captured.err
    # An unquoted sentence is three sentences, and the user is told how to quote it.
    main(["translate", "--saved-model", saved, "A", "dog", "runs."])
    captured = capsys.readouterr()
    assert len(captured.out.strip().splitlines()) == 3
    assert "3 arguments, each translated as its own sentence" in captured.err
    assert "keras-transformer translate ... 'A dog runs.'" in captured.err
    # A source over the model's 24 positions is cut, and the user is told.
    long = " ".join(["A dog runs."] * 12)
    for source in (["--run", run, "--beam-size", "1"], ["--saved-model", saved]):
        main(["translate", *source, long, "A dog runs."])
        captured = capsys.readouterr()
        assert len(captured.out.strip().splitlines()) == 2
        assert "1 of 2 sentences are longer than the model's source limit of 23 subword pieces" in captured.err

    # A second export into the folder needs --overwrite, and then replaces it.
    with pytest.raises(SystemExit) as info:
        main(["export", "--run", run, "--output", saved, "--beam-size", "2"])
    assert info.value.code == 1 and "--overwrite" in capsys.readouterr().err
    main(["export", "--run", run, "--output", saved, "--beam-size", "2", "--overwrite", "--parallel-searches", "2"])
    flags = "--tensorflow_inter_op_parallelism=2 --tensorflow_intra_op_parallelism=1"
    assert ("Serve it with the environment -e TF_ENABLE_ONEDNN_OPTS=0 and the TF Serving flags "
            f"{flags}") in capsys.readouterr().out
    with open(os.path.join(saved, "keras_transformer.json")) as f:
        metadata = json.load(f)
    assert metadata["decoding"]["beam_size"] == 2 and metadata["decoding"]["parallel_searches"] == 2
    assert metadata["tf_serving_flags"] == flags.split()
    assert metadata["tf_serving_env"] == {"TF_ENABLE_ONEDNN_OPTS": "0"}
    assert metadata["languages"] == {"source": "en", "target": "de"}  # from train.en -> train.de
    # Files of the other direction are refused by their names, before any translation.
    for swapped in (["--src", str(data / "val.de"), "--ref", str(data / "val.en")],
                    ["--src", str(data / "val.en"), "--ref", str(data / "val.en")]):
        for source in (["--run", run], ["--saved-model", saved]):
            with pytest.raises(SystemExit) as info:
                main(["evaluate", *source, *swapped])
            err = capsys.readouterr().err
            assert info.value.code == 1 and "translates en->de: pass the en file as --src" in err, err
    main(["evaluate", "--saved-model", saved, "--src", str(data / "val.de"), "--ref", str(data / "val.en"),
          "--limit", "2", "--no-language-check"])
    assert json.loads(capsys.readouterr().out)["num_segments"] == 2
    # An ensemble of two directions is refused as such, before the files are held against each member.
    reverse = data / "reverse"
    reverse.mkdir()
    (reverse / "saved_model.pb").write_bytes(b"")
    (reverse / "keras_transformer.json").write_text(json.dumps({"languages": {"source": "de", "target": "en"}}))
    with pytest.raises(SystemExit):
        main(["evaluate", "--ensemble", run, "--ensemble", str(reverse), "--src", str(data / "val.en"),
              "--ref", str(data / "val.de")])
    assert "the models of an ensemble translate in one direction" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["attention.png", "data", "run", "saved"]


def test_missing_run_folder_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["translate", "--run", str(tmp_path / "nope"), "A dog."])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert "nope" in err and "not a training run folder" in err
    # A SavedModel folder given as --run: the flag it belongs to.
    (tmp_path / "exported").mkdir()
    (tmp_path / "exported" / "saved_model.pb").write_bytes(b"")
    with pytest.raises(SystemExit):
        main(["translate", "--run", str(tmp_path / "exported"), "A dog."])
    err = capsys.readouterr().err
    assert f"--saved-model {tmp_path / 'exported'} instead of --run" in err, err
    # The folder above a run (the demo's runs/demo) names the run inside it.
    (tmp_path / "demo" / "run").mkdir(parents=True)
    (tmp_path / "demo" / "run" / "config.json").write_text("{}")
    with pytest.raises(SystemExit):
        main(["translate", "--run", str(tmp_path / "demo"), "A dog."])
    assert f"It holds the run folder(s) {tmp_path / 'demo' / 'run'}" in capsys.readouterr().err
    # A damaged config.json: JSON's own message named no file (a new-user trial).
    (tmp_path / "demo" / "run" / "config.json").write_text("{not json")
    for command in (["translate", "--run", str(tmp_path / "demo" / "run"), "A dog."],
                    ["average", "--run", str(tmp_path / "demo" / "run"), "--last", "2"]):
        with pytest.raises(SystemExit):
            main(command)
        assert f"{tmp_path / 'demo' / 'run' / 'config.json'} is damaged: it is not valid JSON" in capsys.readouterr().err


@pytest.mark.parametrize("command, preset, want", [
    ("translate", None, "0"), ("evaluate", None, "0"), ("translate", "1", "1"), ("train", None, None)])
def test_decoding_commands_start_tensorflow_without_onednn(tmp_path, command, preset, want):
    """translate and evaluate set decoding's environment (oneDNN off: faster
    searches, the same translations) before TensorFlow is imported, and keep
    a value the user set; train keeps TensorFlow's default."""
    missing = str(tmp_path / "none")  # each command then fails after parsing its arguments
    arguments = {"translate": ["--saved-model", missing, "A dog."],
                 "evaluate": ["--saved-model", missing, "--src", missing, "--ref", missing],
                 "train": ["--train-src", missing, "--train-tgt", missing, "--output-dir", missing]}
    code = (
        "import os, sys\n"
        f"sys.argv = ['keras-transformer', {command!r}] + {arguments[command]!r}\n"
        "import keras_transformer.cli as cli\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
        "print('ENV', os.environ.get('TF_ENABLE_ONEDNN_OPTS'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    if preset is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = preset
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert f"ENV {want}" in out.stdout, out.stdout + out.stderr
    assert "error:" in out.stderr and "arguments are required" not in out.stderr


def test_missing_saved_model_folder_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["translate", "--saved-model", str(tmp_path / "nope"), "A dog."])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("keras-transformer translate: error:")
    assert "nope" in err and "not a SavedModel folder" in err
    # A run folder given as --saved-model: the flag it belongs to, in each command.
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")
    for argv in (["translate", "A dog."], ["evaluate", "--src", __file__, "--ref", __file__],
                 ["export", "--format", "ctranslate2", "--output", str(tmp_path / "ct2")]):
        with pytest.raises(SystemExit):
            main([*argv, "--saved-model", str(tmp_path / "run")])
        err = capsys.readouterr().err
        assert f"--run {tmp_path / 'run'} instead of --saved-model" in err, (argv, err)


@pytest.mark.parametrize("argv", [
    ["translate", "--run", "r", "--batch-size", "0", "A dog."],
    ["evaluate", "--run", "r", "--src", "s", "--ref", "t", "--limit", "0"],
    ["train", "--train-src", "s", "--train-tgt", "t", "--epochs", "0"],
    ["train", "--train-src", "s", "--train-tgt", "t", "--batch-size", "-3"],
    ["demo", "--epochs", "0"],
])
def test_counts_below_one_are_refused_by_name(argv, capsys):
    """A zero batch size, limit or epoch count names its flag (was `range()
    arg 3 must not be zero`, or a run that trained nothing and said so
    only at the next command)."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    flag = next(a for a in argv if a in ("--batch-size", "--limit", "--epochs"))
    err = capsys.readouterr().err
    assert f"argument {flag}: must be at least 1" in err, err


def test_demo_refuses_to_resume_a_run_on_a_corpus_of_another_size(tmp_path, capsys):
    """`demo --train-pairs 300` over a demo run trained on another number of
    pairs regenerated the corpus and went on training the old run on it,
    without a word; it now stops before writing anything."""
    out = tmp_path / "demo"
    (out / "run").mkdir(parents=True)
    (out / "run" / "config.json").write_text("{}")
    (out / "data").mkdir()
    (out / "data" / "train.en").write_text("a\nb\nc\n")
    with pytest.raises(SystemExit) as info:
        main(["demo", "--output-dir", str(out), "--train-pairs", "300"])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert "trained on 3 generated pairs, and --train-pairs is 300: pass --train-pairs 3" in err, err
    assert (out / "data" / "train.en").read_text() == "a\nb\nc\n"


def test_demo_scores_and_exports_the_checkpoint_translate_run_reads(tmp_path, capsys):
    """The demo scored and exported its last epoch while `translate --run`
    and `evaluate --run`, which its closing line suggests, read the best
    checkpoint: two models under one name (a new-user trial). Here the
    best checkpoint is made an older one (epoch 1's weights, which the run
    keeps in `epochs/`) and the demo run again."""
    out = tmp_path / "demo"
    run, data = out / "run", out / "data"
    main(["demo", "--output-dir", str(out), "--epochs", "2", "--train-pairs", "300"])
    best = keras.saving.load_model(run / "best.keras")
    best.load_weights(run / "epochs" / "epoch-001.weights.h5")
    best.save(run / "best.keras")  # best: epoch 1; last: epoch 2
    capsys.readouterr()
    main(["demo", "--output-dir", str(out), "--epochs", "2", "--train-pairs", "300"])
    printed = float(re.search(r"BLEU ([0-9.]+)", capsys.readouterr().out).group(1))
    scores, hypotheses = {}, {}
    for name, which in (("best", ["--run", str(run)]), ("last", ["--run", str(run), "--checkpoint", "last"]),
                        ("export", ["--saved-model", str(out / "saved_model")])):
        output = tmp_path / f"{name}.txt"
        main(["evaluate", *which, "--src", str(data / "val.en"), "--ref", str(data / "val.de"),
              "--output", str(output)])
        scores[name] = json.loads(capsys.readouterr().out)["bleu"]
        hypotheses[name] = output.read_text(encoding="utf-8")
    assert hypotheses["last"] != hypotheses["best"]  # the two checkpoints translate differently
    assert hypotheses["export"] == hypotheses["best"]
    assert round(scores["best"], 1) == printed


def test_zero_batch_size_and_epochs_in_python_are_value_errors(tmp_path):
    from keras_transformer.training import TrainingConfig, train
    from keras_transformer.translator import translate_lines

    with pytest.raises(ValueError, match="`batch_size` must be a positive int; got 0"):
        translate_lines(lambda batch: batch, ["a"], batch_size=0)
    # Items that are not str say which one; any iterable of str is taken.
    with pytest.raises(TypeError, match="item 1 is NoneType"):
        translate_lines(lambda batch: batch, ["a", None])
    with pytest.raises(TypeError, match=r"item 0 is bytes .*Decode bytes first"):
        translate_lines(lambda batch: batch, [b"a"])
    # A lone surrogate failed in the string tensor's conversion, naming no item.
    with pytest.raises(ValueError, match=r"item 1 \('A dog \\ud800'\) is not valid Unicode text: .* character 6"):
        translate_lines(lambda batch: batch, ["a", "A dog \ud800"])
    assert translate_lines(lambda batch: batch, (s for s in ["bb", "a"])) == ["bb", "a"]
    with pytest.raises(ValueError, match="`epochs` must be a positive integer; got 0"):
        train(TrainingConfig(train_src="s", train_tgt="t", epochs=0,
                             output_dir=str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()


def test_n_best_keeps_each_text_once_at_its_best_score():
    """Hypotheses that detokenize to the same text (other subword
    segmentations) are kept once, at the first (best) score, so a sentence
    can get fewer than n; `distinct=False` keeps the search's n best."""
    import tensorflow as tf

    from keras_transformer.translator import translate_n_best

    rows = {b"a": ([b"x", b"y", b"x", b"z"], [-1.0, -2.0, -3.0, -4.0]),
            b"bb": ([b"x", b"x", b"x", b"x"], [-0.5, -0.625, -0.75, -0.875])}

    def serve_n_best(batch):
        found = [rows[s] for s in batch.numpy()]
        return {"translations": tf.constant([t for t, _ in found]), "scores": tf.constant([s for _, s in found])}

    assert translate_n_best(serve_n_best, ["a", "bb"], 3) == [
        [("x", -1.0), ("y", -2.0), ("z", -4.0)], [("x", -0.5)]]
    assert translate_n_best(serve_n_best, ["a", "bb"], 2) == [[("x", -1.0), ("y", -2.0)], [("x", -0.5)]]
    assert translate_n_best(serve_n_best, ["a", "bb"], 3, distinct=False) == [
        [("x", -1.0), ("y", -2.0), ("x", -3.0)], [("x", -0.5), ("x", -0.625), ("x", -0.75)]]
    with pytest.raises(ValueError, match="fewer than the 5 asked for"):
        translate_n_best(serve_n_best, ["a"], 5)


def test_a_run_that_failed_before_training_does_not_block_the_retry(tmp_path):
    """A folder with only the config.json of a run that stopped before its
    tokenizers were trained takes new settings; one with tokenizers or
    weights refuses them (they would not fit)."""
    from keras_transformer.training import TrainingConfig, _check_resumable

    run = tmp_path / "run"
    run.mkdir()
    old = TrainingConfig(train_src="s", train_tgt="t", src_vocab_size=8000)
    new = TrainingConfig(train_src="s", train_tgt="t", src_vocab_size=200)
    (run / "config.json").write_text(json.dumps(
        {"training": {"src_vocab_size": 8000}, "model": old.model_config()}))
    _check_resumable(str(run), new, new.model_config())  # nothing trained yet: fine
    (run / "source.model").write_text("")
    with pytest.raises(ValueError, match="src_vocab_size 8000 -> 200"):
        _check_resumable(str(run), new, new.model_config())


def test_norm_first_reaches_the_model_and_is_fixed_for_a_run(tmp_path):
    """`norm_first` (pre-LN) goes from `TrainingConfig` into the model; a run
    folder refuses to resume with the other block layout (the weights would
    not fit: pre-LN adds a final LayerNorm per stack), and a folder written
    before the setting existed resumes as the post-LN it is."""
    import dataclasses

    from keras_transformer import build_transformer
    from keras_transformer.training import TrainingConfig, _check_resumable

    pre = TrainingConfig(train_src="s", train_tgt="t", norm_first=True, preset="tiny")
    post = TrainingConfig(train_src="s", train_tgt="t", preset="tiny")
    assert pre.model_config()["norm_first"] is True and post.model_config()["norm_first"] is False
    model = build_transformer(50, 50, **pre.model_config())
    assert model.norm_first and model.encoder_final_norm is not None and model.decoder_final_norm is not None
    run = tmp_path / "run"
    run.mkdir()
    (run / "source.model").write_text("")
    (run / "config.json").write_text(json.dumps({"training": dataclasses.asdict(post), "model": post.model_config()}))
    with pytest.raises(ValueError, match="norm_first False -> True"):
        _check_resumable(str(run), pre, pre.model_config())
    before = {k: v for k, v in post.model_config().items() if k != "norm_first"}
    (run / "config.json").write_text(json.dumps({"training": dataclasses.asdict(post), "model": before}))
    _check_resumable(str(run), post, post.model_config())
    with pytest.raises(ValueError, match="norm_first False -> True"):
        _check_resumable(str(run), pre, pre.model_config())


def test_num_decoder_layers_reaches_the_model_and_is_fixed_for_a_run(tmp_path, capsys):
    """`num_decoder_layers` (`--num-decoder-layers`) gives the decoder its own
    depth; unset, it has the encoder's. A run folder refuses to resume with
    another decoder depth, and the command line refuses a depth below 1
    before the run folder is made."""
    import dataclasses

    from keras_transformer import build_transformer
    from keras_transformer.training import TrainingConfig, _check_resumable

    shallow = TrainingConfig(train_src="s", train_tgt="t", preset="tiny", num_layers=3, num_decoder_layers=1)
    same = TrainingConfig(train_src="s", train_tgt="t", preset="tiny", num_layers=3)
    model = build_transformer(50, 50, **shallow.model_config())
    assert (len(model.encoder_layers), len(model.decoder_layers)) == (3, 1)
    model = build_transformer(50, 50, **same.model_config())
    assert (len(model.encoder_layers), len(model.decoder_layers)) == (3, 3)
    run = tmp_path / "run"
    run.mkdir()
    (run / "source.model").write_text("")
    (run / "config.json").write_text(json.dumps({"training": dataclasses.asdict(same), "model": same.model_config()}))
    with pytest.raises(ValueError, match="num_decoder_layers None -> 1"):
        _check_resumable(str(run), shallow, shallow.model_config())
    _check_resumable(str(run), same, same.model_config())
    for name in ("train.en", "train.de"):
        (tmp_path / name).write_text("a b c\nd e f\n")
    fresh = tmp_path / "fresh"
    err = _train_error(["--train-src", str(tmp_path / "train.en"), "--train-tgt", str(tmp_path / "train.de"),
                        "--output-dir", str(fresh), "--num-decoder-layers", "0"], capsys)
    assert "num_decoder_layers" in err and "got 0" in err
    assert not fresh.exists()


def test_missing_training_file_is_refused_before_the_run_folder_is_made(tmp_path, capsys):
    run = tmp_path / "run"
    err = _train_error(["--train-src", str(tmp_path / "missing.en"), "--train-tgt",
                        str(tmp_path / "missing.de"), "--output-dir", str(run)], capsys)
    assert "missing.en is not a file" in err
    assert not run.exists()


def test_truncated_model_file_is_reported_as_corrupt_not_missing(tmp_path):
    from keras_transformer.training import load_run

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    (run / "best.keras").write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(ValueError, match="exists but cannot be read") as info:
        load_run(str(run))
    # It said "File not found" of a file that is there, and to use --checkpoint
    # last when last was the one asked for (a new-user trial).
    assert "File not found" not in str(info.value) and "not a complete .keras (zip) file" in str(info.value)
    assert "--checkpoint last or averaged" in str(info.value)
    (run / "model.keras").write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(ValueError, match="--checkpoint best or averaged"):
        load_run(str(run), "last")


def _train_error(args, capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", *args])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err


def test_train_input_mistakes_are_one_line_errors_before_any_work(tmp_path, capsys):
    data = tmp_path / "data"
    write_synthetic_corpus(str(data), n_train=50, n_val=10, seed=3)
    files = ["--train-src", str(data / "train.en"), "--train-tgt", str(data / "train.de")]
    run = tmp_path / "run"
    err = _train_error(files + ["--val-src", str(data / "val.en"), "--output-dir", str(run)], capsys)
    assert "--val-src and --val-tgt" in err
    assert not run.exists()  # no tokenizer trained, no folder made
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    err = _train_error(files + ["--output-dir", str(a_file)], capsys)
    assert "a_file" in err
    binary = tmp_path / "binary.dat"
    binary.write_bytes(b"ok\n\xd0\xff\xfe\n")
    err = _train_error(["--train-src", str(binary), "--train-tgt", str(binary),
                        "--output-dir", str(run)], capsys)
    assert "binary.dat is not UTF-8 text" in err
    # A .gz name on a file that is not gzip, and a cut-off gzip file: the
    # error names the file (gzip's own names none).
    fake = tmp_path / "fake.gz"
    fake.write_text("no gzip here\n")
    err = _train_error(["--train-src", str(fake), "--train-tgt", str(fake), "--output-dir", str(run)], capsys)
    assert f"{fake} ends with .gz but is not a complete gzip file" in err
    import gzip

    cut = tmp_path / "cut.gz"
    cut.write_bytes(gzip.compress(b"one\ntwo\n" * 100)[:-12])
    err = _train_error(["--train-src", str(cut), "--train-tgt", str(cut), "--output-dir", str(run)], capsys)
    assert f"{cut} ends with .gz but is not a complete gzip file" in err
    err = _train_error(files + ["--output-dir", str(fake)], capsys)
    assert f"--output-dir {fake} is a file" in err


@pytest.mark.parametrize("flags, message", [
    (["--num-heads", "3"], "num_heads=3 must divide d_model=128"),
    (["--sequence-length", "1"], "`sequence_length` must be an int >= 2"),
    (["--max-length", "1"], "`sequence_length` must be an int >= 2"),  # the flag's old name
    (["--tokens-per-batch", "8"], "`tokens_per_batch` (8) must be at least `sequence_length`"),
    (["--warmup-steps", "0"], "warmup_steps"),
    (["--label-smoothing", "1.0"], "`label_smoothing` must be in [0, 1)"),
    (["--subword-alpha", "0"], "`subword_alpha` must be a number in (0, 1]"),
    (["--bidirectional-epochs", "-1"], "`bidirectional_epochs` must be an integer of at least 0"),
    (["--bidirectional-epochs", "2"], "needs one vocabulary for both sides: add --shared-vocab"),
    (["--epochs", "3", "--cooldown-epochs", "4"], "`cooldown_epochs` must be an integer from 0 to epochs=3"),
    (["--cooldown-epochs", "-1"], "`cooldown_epochs` must be an integer from 0"),
])
def test_settings_the_model_or_data_would_refuse_are_refused_before_the_folder(
    tmp_path, capsys, flags, message
):
    """These used to fail after the tokenizers were trained and saved, and
    the folder then refused any other settings: locked."""
    data = tmp_path / "data"
    write_synthetic_corpus(str(data), n_train=50, n_val=10, seed=3)
    run = tmp_path / "run"
    err = _train_error(["--train-src", str(data / "train.en"), "--train-tgt", str(data / "train.de"),
                        "--output-dir", str(run), "--preset", "tiny"] + flags, capsys)
    assert message in err, err
    assert not run.exists()


def test_resuming_keeps_best_keras_unless_beaten(tmp_path, capsys):
    """`best.keras` is replaced on resume only by a better epoch: Keras's
    ModelCheckpoint forgets its best on a restart, so the first epoch after
    a resume always replaced it (even with a worse validation loss)."""
    from keras_transformer.training import TrainingConfig, train

    data = tmp_path / "data"
    write_synthetic_corpus(str(data), n_train=200, n_val=20, seed=4)
    run = tmp_path / "run"
    config = dict(
        train_src=str(data / "train.en"), train_tgt=str(data / "train.de"),
        val_src=str(data / "val.en"), val_tgt=str(data / "val.de"), output_dir=str(run),
        preset="tiny", num_layers=1, sequence_length=24, src_vocab_size=120, tgt_vocab_size=140,
        tokens_per_batch=1024, warmup_steps=20,
    )
    train(TrainingConfig(epochs=1, **config), verbose=0)
    best = (run / "best.keras").read_bytes()
    # Make epoch 1's logged validation loss one that no epoch can beat.
    record = json.loads((run / "epochs.jsonl").read_text())
    record["val_loss"] = 0.0
    (run / "epochs.jsonl").write_text(json.dumps(record) + "\n")
    last = (run / "model.keras").read_bytes()
    train(TrainingConfig(epochs=2, **config), verbose=0)
    assert len((run / "epochs.jsonl").read_text().splitlines()) == 2
    assert (run / "model.keras").read_bytes() != last  # epoch 2 ran and was saved
    assert (run / "best.keras").read_bytes() == best
    # Fewer epochs than the run has: nothing trains, and it says so.
    last = (run / "model.keras").read_bytes()
    train(TrainingConfig(epochs=1, **config), verbose=2)
    assert f"{run} has trained 2 epochs and --epochs is 1; nothing more to train" in capsys.readouterr().out
    assert len((run / "epochs.jsonl").read_text().splitlines()) == 2
    assert (run / "model.keras").read_bytes() == last


def test_a_diverged_train_exits_1_and_keeps_the_last_good_epoch(tmp_path, capsys):
    """A learning rate that makes the loss NaN: `train` said "Trained",
    exited 0 and wrote NaN weights into model.keras, best.keras and the
    checkpoints, so that resuming started from NaN. Now it exits 1 with
    one line saying what to change, and the run folder keeps epoch 1."""
    from keras_transformer.training import TrainingConfig, train

    data = tmp_path / "data"
    write_synthetic_corpus(str(data), n_train=200, n_val=20, seed=4)
    run = tmp_path / "run"
    files = dict(train_src=str(data / "train.en"), train_tgt=str(data / "train.de"),
                 val_src=str(data / "val.en"), val_tgt=str(data / "val.de"), output_dir=str(run))
    train(TrainingConfig(epochs=1, preset="tiny", num_layers=1, sequence_length=24, src_vocab_size=120,
                         tgt_vocab_size=140, tokens_per_batch=1024, warmup_steps=20, **files), verbose=0)
    kept = {name: (run / name).read_bytes() for name in ("model.keras", "best.keras", "epochs.jsonl", "log.csv")}
    argv = ["train", *[f"--{key.replace('_', '-')}={value}" for key, value in files.items()],
            "--preset=tiny", "--num-layers=1", "--sequence-length=24", "--src-vocab-size=120",
            "--tgt-vocab-size=140", "--tokens-per-batch=1024", "--warmup-steps=20", "--epochs=2",
            "--lr-scale=1e30"]
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 1
    assert re.match(r"keras-transformer train: error: training diverged at step \d+ of epoch 2: "
                    "the training loss is not finite", err[-1]), err[-1]
    assert "Lower the learning rate" in err[-1]
    for name, before in kept.items():
        assert (run / name).read_bytes() == before, name


def test_evaluate_checks_its_files_before_loading_a_model(tmp_path, capsys):
    """The run folder does not exist either: the missing --src is reported
    first, so a typo does not cost a model load."""
    with pytest.raises(SystemExit) as info:
        main(["evaluate", "--run", str(tmp_path / "no-run"), "--src", str(tmp_path / "typo.en"),
              "--ref", str(tmp_path / "typo.de")])
    assert info.value.code == 1
    assert "typo.en is not a file" in capsys.readouterr().err
    # An --output that cannot be written is refused before the load too.
    # So is the --src or --ref file itself, which the translations overwrote (a new-user trial).
    src, ref = tmp_path / "val.en", tmp_path / "val.de"
    src.write_text("A dog.\n")
    ref.write_text("Ein Hund.\n")
    for output, says in ((tmp_path / "no-folder" / "out.txt", "no-folder does not exist; create it"),
                         (tmp_path, "is a folder; name a file"),
                         (ref, "is the --ref file: writing the translations there would replace it"),
                         (tmp_path / "." / "val.en", "is the --src file")):
        with pytest.raises(SystemExit) as info:
            main(["evaluate", "--run", str(tmp_path / "no-run"), "--src", str(src), "--ref", str(ref),
                  "--output", str(output)])
        assert info.value.code == 1
        assert says in capsys.readouterr().err
    assert ref.read_text() == "Ein Hund.\n"
    # A second --ref replaced the first without a word (a new-user trial).
    with pytest.raises(SystemExit) as info:
        main(["evaluate", "--run", str(tmp_path / "no-run"), "--src", str(src), "--ref", str(src),
              "--ref", str(ref)])
    assert info.value.code == 2
    assert f"--ref given twice ({src} and {ref}): this command reads one REFERENCE file" in capsys.readouterr().err
    # Empty files wrote a blank line to --output before "Cannot score an empty corpus".
    from keras_transformer.cli import evaluate_files

    (tmp_path / "empty.en").write_text("")
    (tmp_path / "empty.de").write_text("")
    with pytest.raises(ValueError, match="hold no line: there is nothing to score"):
        evaluate_files(lambda batch: batch, str(tmp_path / "empty.en"), str(tmp_path / "empty.de"),
                       output=str(tmp_path / "out.txt"))
    assert not (tmp_path / "out.txt").exists()


@pytest.mark.parametrize("extra", [["--beam-size", "1"], ["--length-penalty", "1.0"],
                                   ["--jit-compile"], ["--xla-max-batch-size", "2"], ["--parallel-searches", "2"],
                                   ["--checkpoint", "last"]])
def test_saved_model_refuses_the_run_only_decoding_options(tmp_path, capsys, extra):
    """A SavedModel decodes as it was exported: `--beam-size 1` with
    `--saved-model` used to be accepted and ignored (a beam-4 answer to a
    greedy request). Refused before the model is loaded, naming the flag."""
    for command in (["translate", "--saved-model", str(tmp_path), "A dog."],
                    ["evaluate", "--saved-model", str(tmp_path), "--src", __file__, "--ref", __file__]):
        with pytest.raises(SystemExit) as info:
            main(command + extra)
        assert info.value.code == 1
        err = capsys.readouterr().err
        assert extra[0] in err and "applies to --run and --ensemble only" in err, err


def test_saved_model_pb_given_for_its_folder_names_the_folder(capsys):
    """`--saved-model DIR/saved_model.pb` said "is not a SavedModel folder
    (no saved_model.pb)" of the very file (a new-user trial)."""
    shipped = os.path.join(os.path.dirname(__file__), "..", "saved_models", "multi30k-en-de")
    with pytest.raises(SystemExit) as info:
        main(["translate", "--saved-model", os.path.join(shipped, "saved_model.pb"), "A dog."])
    assert info.value.code == 1
    assert f"is a file of the SavedModel folder {shipped}; pass the folder: --saved-model {shipped}." in (
        capsys.readouterr().err)


def _echo_translate(monkeypatch, stdin_bytes):
    """Run `translate` on stdin with a model that returns its input."""
    import io

    import keras_transformer.cli as cli

    monkeypatch.setattr(cli, "_translate_fn", lambda args: lambda batch: batch)
    # As CPython opens stdin on POSIX: no newline translation, so "\r\n" arrives.
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin_bytes), newline="\n"))
    main(["translate", "--saved-model", "unused"])


def test_translate_reads_stdin_lines_as_the_file_readers_do(monkeypatch, capsys):
    """A "\\r\\n" line ending is stripped (it reached the model as part of the
    sentence and changed the translation); blank lines and inner spaces stay."""
    _echo_translate(monkeypatch, "A dog runs.\r\n\r\n Zwei  Männer \nlast".encode("utf-8"))
    assert capsys.readouterr().out.split("\n") == ["A dog runs.", "", " Zwei  Männer ", "last", ""]


def test_a_file_name_as_text_is_translated_with_a_hint_to_use_stdin(monkeypatch, capsys, tmp_path):
    """A new user passed a file as the text argument: its name was translated,
    silently. It still is (it is text), with a note on stderr."""
    import keras_transformer.cli as cli

    monkeypatch.setattr(cli, "_translate_fn", lambda args: lambda batch: batch)
    path = tmp_path / "test.en"
    path.write_text("A dog.\n")
    main(["translate", "--saved-model", "unused", "A dog.", str(path)])
    captured = capsys.readouterr()
    assert captured.out.split("\n") == ["A dog.", str(path), ""]
    assert "text argument 2" in captured.err and "pass it on stdin" in captured.err
    assert "text argument 1" not in captured.err


def test_the_quote_hint_leaves_out_blank_arguments(monkeypatch, capsys):
    """`translate "A" "dog" ""` suggested `'A dog '`; blank arguments are
    left out of the suggestion, and one word beside a blank gets no hint."""
    import keras_transformer.cli as cli

    monkeypatch.setattr(cli, "_translate_fn", lambda args: lambda batch: batch)
    main(["translate", "--saved-model", "unused", "A", "dog", ""])
    assert "quote it: keras-transformer translate ... 'A dog'\n" in capsys.readouterr().err
    main(["translate", "--saved-model", "unused", "Dog", " "])
    assert "quote it" not in capsys.readouterr().err


def test_non_utf8_stdin_and_arguments_are_clear_errors(monkeypatch, capsys):
    with pytest.raises(SystemExit) as info:
        _echo_translate(monkeypatch, b"Caf\xe9 au lait\n")
    assert info.value.code == 1
    assert "stdin is not UTF-8 text" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["translate", "--saved-model", "unused", "fine", "Caf\udce9"])  # as argv decodes b"\xe9"
    assert info.value.code == 1
    assert "text argument 2 is not UTF-8 text" in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag, message", [
    (["translate", "--run", "r", "--length-penalty", "nan", "A dog."], "--length-penalty",
     "must be a finite number >= 0"),
    (["translate", "--run", "r", "--length-penalty", "-1", "A dog."], "--length-penalty",
     "must be a finite number >= 0"),
    (["evaluate", "--run", "r", "--src", "s", "--ref", "t", "--beam-size", "0"], "--beam-size",
     "must be at least 1"),
    (["export", "--run", "r", "--output", "o", "--batch-size", "3"], None,
     "unrecognized arguments: --batch-size 3"),
])
def test_bad_decoding_flags_are_refused_by_argparse(argv, flag, message, capsys):
    """NaN used to pass (`nan < 0` is false) and translate to garbage; a
    negative penalty failed only when the search was traced; `export
    --batch-size` was accepted and did nothing."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and (flag is None or f"argument {flag}" in err), err


def test_greedy_with_a_length_penalty_is_refused(tmp_path, capsys):
    """Greedy decoding ranks nothing: the penalty was accepted and ignored
    (and written into an export's metadata). Refused before loading."""
    for command in (["translate", "--run", str(tmp_path), "A dog."],
                    ["export", "--run", str(tmp_path), "--output", str(tmp_path / "out")]):
        with pytest.raises(SystemExit) as info:
            main(command + ["--beam-size", "1", "--length-penalty", "0.9"])
        assert info.value.code == 1
        err = capsys.readouterr().err
        assert "--length-penalty has no effect with --beam-size 1" in err, err
    with pytest.raises(SystemExit):
        main(["translate", "--run", str(tmp_path), "--search", "greedy", "--length-penalty", "0.9", "A"])
    assert "--length-penalty has no effect with --search greedy" in capsys.readouterr().err


def test_export_does_not_silently_replace_a_folder(tmp_path, capsys):
    """An existing SavedModel is replaced only with --overwrite, and a
    folder that is not a SavedModel never (refused before loading)."""
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    for extra in ([], ["--overwrite"]):
        with pytest.raises(SystemExit) as info:
            main(["export", "--run", str(tmp_path / "run"), "--output", str(taken)] + extra)
        assert info.value.code == 1
        err = capsys.readouterr().err
        assert str(taken) in err
        assert ("--overwrite" in err) if not extra else ("no saved_model.pb" in err), err
    assert (taken / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("tokens_per_batch", [512, 0])
@pytest.mark.parametrize("jit_compile", [False, True, "auto"])
def test_compiled_training_pads_batches_to_their_bucket(tmp_path, monkeypatch, jit_compile, tokens_per_batch):
    """XLA (and jax) compile once per batch shape: `train` pads each batch
    to its bucket's upper length there, one shape per bucket, also for
    batches of a fixed number of sentences (`tokens_per_batch` 0, which
    before were padded to their longest sentence, 22 or 24 tokens here,
    one compiled step each); uncompiled, those stay plain padded batches."""
    import keras_transformer.training as training

    data = tmp_path / "data"
    write_synthetic_corpus(str(data), n_train=200, n_val=10, seed=3)
    seen = {}

    def fake_make_dataset(*args, **kwargs):
        seen.update(kwargs, args=args)
        raise KeyboardInterrupt  # stop before training

    monkeypatch.setattr(training, "make_dataset", fake_make_dataset)
    config = training.TrainingConfig(
        train_src=str(data / "train.en"), train_tgt=str(data / "train.de"),
        output_dir=str(tmp_path / "run"), preset="tiny", sequence_length=24,
        src_vocab_size=100, tgt_vocab_size=100, tokens_per_batch=tokens_per_batch, batch_size=16,
        jit_compile=jit_compile,
    )
    with pytest.raises(KeyboardInterrupt):
        training.train(config, verbose=0)
    # "auto" is XLA on tensorflow with an accelerator only (Keras's rule); it
    # counted as compiled on a CPU before.
    from keras_transformer.devices import has_accelerator

    compiled = (jit_compile is True or keras.backend.backend() == "jax"
                or (jit_compile == "auto" and has_accelerator()))
    assert seen["pad_to_bucket_boundary"] is compiled
    args = seen.pop("args")
    from keras_transformer.data import make_dataset
    from keras_transformer.data.pipeline import auto_bucket_boundaries

    shapes = {(x["encoder_inputs"].shape[1], y.shape[1]) for x, y in make_dataset(*args, **seen)}
    lengths = {length for pair in shapes for length in pair}
    if compiled:
        bounds = [b - 1 for b in auto_bucket_boundaries(24)]
        assert lengths <= set(bounds), (shapes, bounds)
    elif not tokens_per_batch:
        assert seen["bucket_boundaries"] is None  # plain padded batches


def _scalars(folder):
    """`{tag: {step: value}}` of the TensorBoard event files in `folder`."""
    import tensorflow as tf

    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            if "tfevents" not in name:
                continue
            for event in tf.compat.v1.train.summary_iterator(os.path.join(root, name)):
                for value in event.summary.value:
                    if value.metadata.plugin_data.plugin_name != "scalars":
                        continue  # the model config, written as text
                    number = tf.make_ndarray(value.tensor) if value.HasField("tensor") else value.simple_value
                    tag = os.path.basename(root) + "/" + value.tag
                    found.setdefault(tag, {})[event.step] = float(number)
    return found


def test_a_config_file_value_out_of_range_names_the_file(tmp_path, capsys):
    """A range error of a setting the --config file gave says so (it used to
    read as if a flag were wrong); the same value given as a flag does not
    name the file; nothing is written."""
    config = tmp_path / "settings.yaml"
    config.write_text("train_src: a.txt\ntrain_tgt: b.txt\ndropout_rate: 1.5\nd_model: 0\n")
    with pytest.raises(SystemExit):
        main(["train", "--config", str(config), "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert f"(set by d_model in --config {config})" in err, err
    with pytest.raises(SystemExit):
        main(["train", "--config", str(config), "--d-model", "64", "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert f"got 1.5. (set by dropout_rate in --config {config})" in err, err
    with pytest.raises(SystemExit):
        main(["train", "--config", str(config), "--d-model", "64", "--dropout-rate", "1.25",
              "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert "got 1.25." in err and "--config" not in err, err
    assert not (tmp_path / "run").exists()


def test_the_old_and_new_name_of_one_setting_must_agree(tmp_path, capsys):
    """`--max-length` (the old name of `--sequence-length`) and the new one
    with different values: the last one silently won (a config file's
    `max_length` silently lost). Now an error; the same value is fine."""
    files = ["train", "--train-src", "a.txt", "--train-tgt", "b.txt", "--output-dir", str(tmp_path / "run")]
    with pytest.raises(SystemExit):
        main(files + ["--max-length", "30", "--sequence-length", "40"])
    assert "--max-length 30 and --sequence-length 40 set the same setting (sequence_length)" in capsys.readouterr().err
    config = tmp_path / "settings.yaml"
    config.write_text("max_length: 30\nsequence_length: 40\n")
    with pytest.raises(SystemExit):
        main(files + ["--config", str(config)])
    assert "max_length 30 and sequence_length 40 (its new name)" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # agreeing names pass on to the next check: the missing file
        main(files + ["--max-length", "30", "--sequence-length", "30"])
    assert "a.txt is not a file" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_config_files_booleans_can_be_switched_either_way_by_flags(tmp_path, monkeypatch):
    """"Flags given beside --config win": for booleans there was no flag to
    turn a file's true off (only --norm-first, --shared-vocab, --lowercase,
    --jit-compile and --no-tensorboard existed)."""
    import keras_transformer.training as training

    seen = []
    monkeypatch.setattr(training, "train", lambda config, verbose=1: seen.append(config))
    names = ("norm_first", "shared_vocab", "lowercase", "jit_compile", "tensorboard")
    config = tmp_path / "settings.yaml"
    files = ["train", "--train-src", "a.txt", "--train-tgt", "b.txt", "--config", str(config)]
    for value in (True, False):
        config.write_text("".join(f"{name}: {str(value).lower()}\n" for name in names))
        main(files)
        flags = ["--" + ("" if not value else "no-") + name.replace("_", "-") for name in names]
        main(files + flags)
        assert [getattr(seen[-2], name) for name in names] == [value] * 5
        assert [getattr(seen[-1], name) for name in names] == [not value] * 5


def test_a_config_files_lists_can_be_extended_or_emptied_by_flags(tmp_path, monkeypatch):
    """A --config file's `extra_train` and `user_defined_symbols` were lists
    that flags could only append to: a run without the file's synthetic
    pairs or tag needed another file."""
    import keras_transformer.training as training

    seen = []
    monkeypatch.setattr(training, "train", lambda config, verbose=1: seen.append(config))
    config = tmp_path / "settings.json"
    config.write_text(json.dumps({"extra_train": [["x.en", "x.de"]], "user_defined_symbols": ["<BT>"]}))
    files = ["train", "--train-src", "a.txt", "--train-tgt", "b.txt", "--config", str(config)]
    main(files)
    assert (seen[-1].extra_train, seen[-1].user_defined_symbols) == ([["x.en", "x.de"]], ["<BT>"])
    main(files + ["--extra-train", "y.en", "y.de", "--user-defined-symbols", "<FT>"])
    assert (seen[-1].extra_train, seen[-1].user_defined_symbols) == (
        [["x.en", "x.de"], ["y.en", "y.de"]], ["<BT>", "<FT>"])
    main(files + ["--no-extra-train", "--no-user-defined-symbols"])
    assert (seen[-1].extra_train, seen[-1].user_defined_symbols) == ([], None)  # None: no symbols
    main(files + ["--no-extra-train", "--extra-train", "y.en", "y.de", "--no-user-defined-symbols",
                  "--user-defined-symbols", "<FT>"])
    assert (seen[-1].extra_train, seen[-1].user_defined_symbols) == ([["y.en", "y.de"]], ["<FT>"])


@pytest.mark.slow
def test_config_file_tensorboard_n_best_and_load_translator(tmp_path, capsys):
    """`train --config FILE` (YAML) takes the file's settings with flags on
    top and records them; TensorBoard gets the epoch losses that log.csv
    has and the learning rate; `translate --n-best/--scores/--format jsonl`
    prints the search's hypotheses best first, the first equal to the plain
    translation; `load_translator` gives the same for the run and for its
    SavedModel."""
    import csv

    import keras_transformer as kt
    from keras_transformer.training import TrainingConfig

    data = tmp_path / "data"
    write_synthetic_corpus(str(data), n_train=300, n_val=20, seed=4)
    run = tmp_path / "run"
    config = tmp_path / "settings.yaml"
    config.write_text(
        f"train_src: {data / 'train.en'}\ntrain_tgt: {data / 'train.de'}\n"
        f"val_src: {data / 'val.en'}\nval_tgt: {data / 'val.de'}\n"
        "preset: tiny\nnum_layers: 1\nsequence_length: 24\nsrc_vocab_size: 150\ntgt_vocab_size: 170\n"
        "tokens_per_batch: 1024\nwarmup_steps: 10\nepochs: 5\n"
    )
    main(["train", "--config", str(config), "--output-dir", str(run), "--epochs", "2"])
    with open(run / "config.json") as f:
        recorded = json.load(f)["training"]
    assert recorded["epochs"] == 2 and recorded["preset"] == "tiny" and recorded["tgt_vocab_size"] == 170
    assert TrainingConfig.from_file(str(run / "config.json")) == TrainingConfig(**recorded)
    with open(run / "log.csv") as f:
        rows = list(csv.DictReader(f))
    scalars = _scalars(run / "tensorboard")
    for epoch, row in enumerate(rows):
        assert scalars["train/epoch_loss"][epoch] == pytest.approx(float(row["loss"]), rel=1e-5)
        assert scalars["validation/epoch_loss"][epoch] == pytest.approx(float(row["val_loss"]), rel=1e-5)
    assert set(scalars["train/epoch_learning_rate"]) == {0, 1}
    with pytest.raises(SystemExit):
        main(["train", "--config", str(tmp_path / "missing.yaml")])
    config.write_text("train_src: a\nwarmup: 3\n")
    with pytest.raises(SystemExit):
        main(["train", "--config", str(config)])
    assert "unknown settings ['warmup']" in capsys.readouterr().err

    sentences = ["A dog runs.", "The old woman sees the children."]
    main(["translate", "--run", str(run), "--beam-size", "3", *sentences])
    plain = capsys.readouterr().out.strip().splitlines()
    main(["translate", "--run", str(run), "--beam-size", "3", "--n-best", "2", "--scores", *sentences])
    lines = [line.split("\t") for line in capsys.readouterr().out.strip().splitlines()]
    # Each line: the sentence's line number, the score, the translation;
    # one to two distinct texts a sentence, best first.
    by_sentence = [[(float(score), text) for index, score, text in lines if int(index) == i] for i in (0, 1)]
    assert sum(map(len, by_sentence)) == len(lines) and all(1 <= len(h) <= 2 for h in by_sentence)
    assert [h[0][1] for h in by_sentence] == plain
    for hypotheses in by_sentence:
        assert [s for s, _ in hypotheses] == sorted((s for s, _ in hypotheses), reverse=True)
        assert len({t for _, t in hypotheses}) == len(hypotheses)
    main(["translate", "--run", str(run), "--beam-size", "3", "--n-best", "3", "--format", "jsonl", *sentences])
    records = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [r["source"] for r in records] == sentences
    assert [r["translations"][0] for r in records] == plain
    assert all(1 <= len(r["scores"]) == len(set(r["translations"])) <= 3 for r in records)
    with pytest.raises(SystemExit):
        main(["translate", "--run", str(run), "--beam-size", "3", "--n-best", "4", "A dog."])
    assert "fewer than the 4 asked for" in capsys.readouterr().err

    # evaluate's stdout is the JSON alone (the progress bar goes to stderr).
    main(["evaluate", "--run", str(run), "--beam-size", "1", "--src", str(data / "val.en"),
          "--ref", str(data / "val.de")])
    assert set(json.loads(capsys.readouterr().out)) >= {"bleu", "chrf", "seconds"}
    from_run = kt.load_translator(str(run), beam_size=3)
    assert from_run.translate_lines(sentences) == plain
    exported = tmp_path / "exported"
    main(["export", "--run", str(run), "--output", str(exported), "--beam-size", "3"])
    from_saved_model = kt.load_translator(str(exported))
    assert from_saved_model.translate_lines(sentences) == plain
    # Called on one string, both loaders give one scalar string, on a list a
    # vector: the SavedModel's gave shape (1,) where the run's gave a scalar.
    for loaded in (from_saved_model, from_run):
        one, batch = loaded(sentences[0]), loaded(sentences)
        assert one.shape == () and one.numpy().decode() == plain[0]
        assert batch.shape == (2,) and [t.decode() for t in batch.numpy()] == plain
        with pytest.raises(ValueError, match="a string or a rank-1 batch of strings; got shape \\(1, 2\\)"):
            loaded([sentences])
    assert [h[0][0] for h in from_saved_model.translate_n_best(sentences, 2)] == plain
    with pytest.warns(UserWarning, match=r"1 of 1 sentences are longer than the model's source limit of 23 "):
        from_saved_model.translate_lines([" ".join(sentences * 10)])
    with pytest.raises(ValueError, match="apply to a run only"):
        kt.load_translator(str(exported), beam_size=2)
    # A checkpoint was ignored here, an unknown one too (a new-user trial).
    for checkpoint in ("last", "nope"):
        with pytest.raises(ValueError, match=f"`checkpoint` applies to a run only.*checkpoint='{checkpoint}'"):
            kt.load_translator(str(exported), checkpoint=checkpoint)
    with pytest.raises(ValueError, match="`checkpoint` must be 'best', 'last' or 'averaged'; got 'nope'"):
        kt.load_translator(str(run), checkpoint="nope")
    with pytest.raises(FileNotFoundError, match="neither a SavedModel"):
        kt.load_translator(str(tmp_path))
    # A rerun says what it read (pairs with a blank side, which are left
    # out, apart: they were counted as read) and what it resumes from.
    for side in ("en", "de"):
        (tmp_path / f"val-blank.{side}").write_text((data / f"val.{side}").read_text() + " \n")
    main(["train", "--train-src", str(data / "train.en"), "--train-tgt", str(data / "train.de"),
          "--val-src", str(tmp_path / "val-blank.en"), "--val-tgt", str(tmp_path / "val-blank.de"),
          "--output-dir", str(run), "--preset", "tiny", "--num-layers", "1",
          "--sequence-length", "24", "--src-vocab-size", "150", "--tgt-vocab-size", "170",
          "--tokens-per-batch", "1024", "--warmup-steps", "10", "--epochs", "3"])
    out = capsys.readouterr().out
    assert ("Read 300 training pairs and 20 validation pairs (1 more with a blank side left out); "
            "vocabularies: source") in out
    assert "(asked 150)" in out and f"Resuming {run} after epoch 2" in out
    assert "parameters (preset tiny, tie_embeddings=none)" in out
    assert "Trained 1 epoch in " in out and f"run folder: {run}" in out
    # Again: nothing more to train, and the last line does not claim it trained.
    main(["train", "--config", str(run / "config.json"), "--output-dir", str(run)])
    out = capsys.readouterr().out
    assert "nothing more to train" in out and f"Nothing trained; run folder: {run}" in out
    assert "Trained" not in out


def test_bom_is_stripped_from_files(tmp_path):
    """A UTF-8 file that starts with EF BB BF: the readers drop the mark,
    the tokenizer learns no U+FEFF piece, and a perfect output scores BLEU
    100 against it (99.93 before)."""
    from keras_transformer.data.text_files import read_lines
    from keras_transformer.evaluation import corpus_scores
    from keras_transformer.tokenizers import train_subword_tokenizer

    lines = [f"a small dog number {i} runs in the park" for i in range(60)]
    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode("utf-8") + b"\n")
    assert read_lines(str(path)) == lines
    tokenizer = train_subword_tokenizer(str(path), 60)
    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    assert not any("\ufeff" in piece for piece in pieces)
    assert corpus_scores(lines, read_lines(str(path)))["bleu"] == pytest.approx(100.0)


def test_train_refuses_a_folder_of_other_files_and_warns_about_warmup(tmp_path, capsys):
    data = tmp_path / "data"
    write_synthetic_corpus(str(data), n_train=60, n_val=10, seed=5)
    busy = tmp_path / "my_documents"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    args = ["train", "--train-src", str(data / "train.en"), "--train-tgt", str(data / "train.de"),
            "--preset", "tiny", "--num-layers", "1", "--sequence-length", "24", "--src-vocab-size", "100",
            "--tgt-vocab-size", "100", "--tokens-per-batch", "1024", "--epochs", "1"]
    with pytest.raises(SystemExit) as info:
        main(args + ["--output-dir", str(busy)])
    assert info.value.code == 1 and "no training run in it" in capsys.readouterr().err
    assert sorted(os.listdir(busy)) == ["notes.txt"]
    main(args + ["--output-dir", str(tmp_path / "run"), "--warmup-steps", "1000"])
    out = capsys.readouterr().out
    assert "Warning: warmup_steps=1000 is more than the whole run" in out
    # Said before the first epoch's progress bar, not in the middle of it.
    assert out.index("Warning: warmup_steps") < out.index("/step")
    # Into a file (not a terminal) the progress bar is one line an epoch, not redrawn.
    assert "\r" not in out and out.count("/step") == 1


def test_interrupted_training_says_how_to_resume(tmp_path, monkeypatch, capsys):
    import keras_transformer.training as training

    def interrupted(config, verbose=1):
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "train", interrupted)
    argv = ["train", "--train-src", "a.txt", "--train-tgt", "b.txt", "--output-dir", str(tmp_path / "r")]
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 130 and len(err.strip().splitlines()) == 1
    assert f"Resume with: keras-transformer train --train-src a.txt --train-tgt b.txt --output-dir {tmp_path / 'r'}" in err


def test_version_help_and_no_abbreviations(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip().startswith("keras-transformer ")
    with pytest.raises(SystemExit) as info:
        main(["train", "--train-src", "a", "--train-tgt", "b", "--epoch", "3"])
    assert info.value.code == 2 and "unrecognized arguments: --epoch" in capsys.readouterr().err
    for command, flags in (("evaluate", ["--src", "--ref"]), ("export", ["--run", "--output"]),
                           ("demo", ["--output-dir", "--epochs", "--train-pairs"])):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        for flag in flags:
            line = next(line for line in text.splitlines() if line.strip().startswith(flag))
            described = text.split(line, 1)[1].splitlines()[0].strip() or line.split(None, 2)[-1]
            assert len(described) > 5, (command, flag, text)
    assert "(default: runs/demo)" in text


@pytest.mark.slow
def test_checkpoint_every_n_steps_keeps_the_steps_of_a_killed_epoch(tmp_path, monkeypatch):
    """Killed after 5 steps of its first epoch, a run with
    `--checkpoint-every 3` resumes from the state after step 3: its
    optimizer has made 3 more updates by the end than a run killed the same
    way without it (which starts again from nothing)."""
    import keras_transformer.training as training

    data = tmp_path / "data"
    write_synthetic_corpus(str(data), n_train=200, n_val=10, seed=6)
    steps_taken = {}
    for every in (None, 3):
        run = tmp_path / f"run-{every}"
        args = ["train", "--train-src", str(data / "train.en"), "--train-tgt", str(data / "train.de"),
                "--output-dir", str(run), "--preset", "tiny", "--num-layers", "1", "--sequence-length", "24",
                "--src-vocab-size", "100", "--tgt-vocab-size", "100", "--tokens-per-batch", "512",
                "--warmup-steps", "5", "--epochs", "1", *(["--checkpoint-every", str(every)] if every else [])]
        original = training._Timer.on_train_batch_end

        def killed(self, batch, logs=None):
            original(self, batch, logs)
            if self.steps == 5:
                raise KeyboardInterrupt

        monkeypatch.setattr(training._Timer, "on_train_batch_end", killed)
        with pytest.raises(SystemExit):
            main(args)
        monkeypatch.setattr(training._Timer, "on_train_batch_end", original)
        model, *_ = training.train(training.TrainingConfig(**{
            **json.load(open(run / "config.json"))["training"]}), verbose=0)
        steps_taken[every] = int(model.optimizer.iterations.numpy())
        # The log counts the 3 saved steps of the killed epoch in the epoch that completes it.
        assert sum(json.loads(line)["steps"] for line in open(run / "epochs.jsonl")) == steps_taken[every]
    assert steps_taken[3] - steps_taken[None] == 3, steps_taken


@pytest.mark.slow
def test_sigterm_saves_the_step_it_stopped_after_and_the_same_command_resumes(tmp_path, monkeypatch, capsys):
    """SIGTERM in the first epoch of a resumed run (epoch 2 of 2, after 1
    epoch trained by an earlier run) saves the state after its next step and
    exits 143; training again resumes epoch 2 from the saved weights, not
    epoch 1 (Keras's own backup records epoch 0 for a mid-epoch save in a
    resumed run's first epoch), and `epochs.jsonl` counts the stopped
    steps: its steps add up to the optimizer's, and its seconds include
    the stopped ones. The SIGTERM handler from before training is back
    after each training."""
    import signal

    import keras_transformer.training as training

    handler_before = signal.getsignal(signal.SIGTERM)
    data = tmp_path / "data"
    write_synthetic_corpus(str(data), n_train=300, n_val=10, seed=6)
    run = tmp_path / "run"
    args = ["train", "--train-src", str(data / "train.en"), "--train-tgt", str(data / "train.de"),
            "--output-dir", str(run), "--preset", "tiny", "--num-layers", "1", "--sequence-length", "24",
            "--src-vocab-size", "100", "--tgt-vocab-size", "100", "--tokens-per-batch", "512",
            "--warmup-steps", "5", "--no-tensorboard"]
    main(args + ["--epochs", "1"])
    original = training._Timer.on_train_batch_end

    def signalled(self, batch, logs=None):
        original(self, batch, logs)
        if self.steps == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(training._Timer, "on_train_batch_end", signalled)
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(args + ["--epochs", "2"])
    err = capsys.readouterr().err
    assert info.value.code == 143
    assert "stopped by SIGTERM after step 4 of epoch 2" in err and "Resume with: keras-transformer train" in err
    assert signal.getsignal(signal.SIGTERM) is handler_before
    assert json.load(open(run / "checkpoints" / "training_metadata.json"))["epoch"] == 1
    partial = json.load(open(run / "checkpoints" / "partial_epoch.json"))
    assert partial["epoch"] == 2 and partial["steps"] == 4 and partial["seconds"] > 0
    monkeypatch.setattr(training._Timer, "on_train_batch_end", original)
    model, *_ = training.train(training.TrainingConfig(**json.load(open(run / "config.json"))["training"]),
                               verbose=0)
    records = [json.loads(line) for line in open(run / "epochs.jsonl")]
    assert [r["epoch"] for r in records] == [1, 2]
    assert records[1]["steps"] == records[0]["steps"] + 4
    assert records[1]["seconds"] > partial["seconds"]
    assert not (run / "checkpoints" / "partial_epoch.json").exists()
    assert int(model.optimizer.iterations.numpy()) == sum(r["steps"] for r in records)
    assert signal.getsignal(signal.SIGTERM) is handler_before


def test_settings_that_would_silently_train_the_wrong_thing_are_refused(tmp_path, monkeypatch, capsys):
    """From a new-user trial: `--max-train-pairs 0` trained on everything
    and -90 on all but 90 pairs; a quoted "false" in YAML turned a bool on;
    `--bleu-every` on jax failed only after an epoch. Each is refused before
    any work; hyphenated keys and YAML in a .txt file are read."""
    import keras_transformer.training as training
    from keras_transformer.training import TrainingConfig, read_config_file

    data = tmp_path / "data"
    write_synthetic_corpus(str(data), n_train=40, n_val=10, seed=7)
    base = ["train", "--train-src", str(data / "train.en"), "--train-tgt", str(data / "train.de"),
            "--output-dir", str(tmp_path / "run")]
    for value in ("0", "-90"):
        with pytest.raises(SystemExit):
            main(base + ["--max-train-pairs", value])
        assert "--max-train-pairs" in capsys.readouterr().err
    config = tmp_path / "settings.txt"
    config.write_text("shared_vocab: 'false'\n")
    with pytest.raises(ValueError, match="`shared_vocab` must be a bool; got 'false'"):
        read_config_file(str(config))
    # PyYAML reads 5e-1 as text; the message said only "must be a float".
    config.write_text("lr_scale: 5e-1\n")
    with pytest.raises(ValueError, match=r"`lr_scale` must be a float; got '5e-1' \(str\) \(YAML reads a number "
                                         r"like 5e-1 as text: write it with a dot, such as 0.5 or 5.0e-1"):
        read_config_file(str(config))
    config.write_text("lr_scale: 5.0e-1\n")
    assert read_config_file(str(config)) == {"lr_scale": 0.5}
    config.write_text("max-train-pairs: 5\nlowercase: true\nlr_scale: 1\n")
    assert read_config_file(str(config)) == {"max_train_pairs": 5, "lowercase": True, "lr_scale": 1}
    config.write_text("max_train_pairs: -5\n")
    with pytest.raises(SystemExit):
        main(base + ["--config", str(config)])
    assert "`max_train_pairs` must be a positive integer" in capsys.readouterr().err
    with pytest.raises(ValueError, match="TrainingConfig: `norm_first` must be a bool; got 'false' \\(str\\)"):
        TrainingConfig(train_src="a", train_tgt="b", norm_first="false")  # truthy: it trained pre-LN
    with pytest.raises(ValueError, match=r"unknown settings \['epoch'\]"):
        TrainingConfig.from_file(str(tmp_path / "settings.txt"), epoch=3)
    monkeypatch.setattr(training.keras.backend, "backend", lambda: "jax")
    with pytest.raises(ValueError, match="needs the tensorflow backend"):
        training.train(TrainingConfig(str(data / "train.en"), str(data / "train.de"),
                                      val_src=str(data / "val.en"), val_tgt=str(data / "val.de"),
                                      output_dir=str(tmp_path / "jax-run"), bleu_every=1))
    assert not (tmp_path / "jax-run").exists()


def test_averaging_mistakes_get_the_right_advice(tmp_path, capsys):
    from keras_transformer.training import load_run

    (tmp_path / "config.json").write_text('{"training": {}, "model": {}}')
    with pytest.raises(FileNotFoundError, match="keras-transformer average --run"):
        load_run(str(tmp_path), which="averaged")
    with pytest.raises(SystemExit):
        main(["average", "--run", str(tmp_path / "missing"), "--last", "2"])
    assert "is not a training run folder" in capsys.readouterr().err


def test_help_does_not_start_tensorflow_and_commands_print_no_start_up_notices():
    # Issue 17: --help imported TensorFlow (5-25 s) and every command printed
    # 10-12 TensorFlow/absl start-up lines, two of them at error level.
    import subprocess
    import sys

    probe = (
        "import sys; sys.argv = ['keras-transformer', '--help']\n"
        "from keras_transformer.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('keras', 'tensorflow', 'jax', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[-1] == "[]"
    assert "usage: keras-transformer" in out.stdout

    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    run = subprocess.run(
        [sys.executable, "-m", "keras_transformer.cli", "translate", "--saved-model",
         os.path.join(os.path.dirname(__file__), "..", "saved_models", "multi30k-en-de"), "A dog runs."],
        capture_output=True, text=True, env=env, check=True,
    )
    assert run.stdout.strip() == "Ein Hund rennt."
    assert run.stderr == ""


@pytest.mark.parametrize("argv", [
    ["translate", "--run", "no-such-run", "A dog."],
    ["translate", "--saved-model", "no-such-model", "A dog."],
    ["evaluate", "--saved-model", "no-such-model", "--src", "no.en", "--ref", "no.de"],
    ["evaluate", "--run", "no-such-run", "--src", __file__, "--ref", __file__],
    ["export", "--run", "no-such-run", "--output", "out"],
    ["export", "--format", "ctranslate2", "--saved-model", "no-such-model", "--output", "out"],
    ["average", "--run", "no-such-run", "--last", "2"],
], ids=["translate-run", "translate-saved", "evaluate-files", "evaluate-run", "export", "export-ct2",
        "average"])
def test_a_wrong_path_is_reported_before_tensorflow_starts(argv, tmp_path):
    """A typo in a path was reported only after TensorFlow had started
    (seconds); the path checks come first, and TensorFlow is not imported."""
    import subprocess
    import sys

    # `-X importtime` lists every module imported, on stderr.
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "keras_transformer.cli", *argv],
                            capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "import time:" in line]
    assert result.returncode == 1 and "argparse" in imported
    assert not [name for name in imported if name.split(".")[0] in ("tensorflow", "keras")]
    assert "error:" in result.stderr and ("no-such" in result.stderr or "no.en" in result.stderr)


@pytest.mark.parametrize("problem, message", [
    ("misaligned", "has 50 lines but"),
    ("blank", "No sentence pairs in"),
    ("vocabulary", "vocab_size"),
    ("val-misaligned", "validation files: .*val.en has 10 lines but .*short.de has 9"),
    ("val-blank", "No sentence pairs in the validation files .*blank.txt"),
])
def test_a_train_that_fails_on_its_data_leaves_no_run_folder(tmp_path, capsys, problem, message):
    """These are found while reading the files or training the tokenizers,
    after the folder was made: it used to stay behind with a config.json.
    Validation files were read only after the tokenizers were trained and
    the folder written (a new-user trial), and their errors named no file."""
    data = tmp_path / "data"
    write_synthetic_corpus(str(data), n_train=50, n_val=10, seed=3)
    src, tgt, flags = data / "train.en", data / "train.de", []
    if problem == "misaligned":
        tgt = tmp_path / "short.de"
        tgt.write_text("\n".join((data / "train.de").read_text().splitlines()[:40]) + "\n")
    elif problem == "blank":
        src = tgt = tmp_path / "blank.txt"
        src.write_text("\n \n\n")
    elif problem == "val-misaligned":
        short = tmp_path / "short.de"
        short.write_text("\n".join((data / "val.de").read_text().splitlines()[:9]) + "\n")
        flags = ["--val-src", str(data / "val.en"), "--val-tgt", str(short)]
    elif problem == "val-blank":
        (tmp_path / "blank.txt").write_text("\n \n\n")
        flags = ["--val-src", str(tmp_path / "blank.txt"), "--val-tgt", str(tmp_path / "blank.txt")]
    else:
        flags = ["--src-vocab-size", "5"]
    run = tmp_path / "run"
    err = _train_error(["--train-src", str(src), "--train-tgt", str(tgt), "--output-dir", str(run),
                        "--preset", "tiny"] + flags, capsys)
    assert re.search(message, err), err
    assert not run.exists()


def test_a_second_train_on_a_folder_in_training_is_refused(tmp_path, capsys):
    """Two `train`s on one folder interleaved their epochs in log.csv and
    epochs.jsonl, one died on an HDF5 lock error, the other said "Trained 8
    epochs" of 5 (a new-user trial). The first holds the folder's lock."""
    fcntl = pytest.importorskip("fcntl")
    data = tmp_path / "data"
    write_synthetic_corpus(str(data), n_train=40, n_val=10, seed=3)
    run = tmp_path / "run"
    run.mkdir()
    descriptor = os.open(run, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another process's train
        err = _train_error(["--train-src", str(data / "train.en"), "--train-tgt", str(data / "train.de"),
                            "--output-dir", str(run), "--preset", "tiny"], capsys)
    finally:
        os.close(descriptor)
    assert f"{run} is being trained by another process (it holds the run folder's lock)" in err, err
    assert run.is_dir() and not os.listdir(run)


def test_resuming_with_changed_settings_says_which(tmp_path, capsys):
    data = tmp_path / "data"
    write_synthetic_corpus(str(data), n_train=60, n_val=10, seed=5)
    args = ["train", "--train-src", str(data / "train.en"), "--train-tgt", str(data / "train.de"),
            "--output-dir", str(tmp_path / "run"), "--preset", "tiny", "--num-layers", "1",
            "--sequence-length", "24", "--src-vocab-size", "100", "--tgt-vocab-size", "100",
            "--tokens-per-batch", "1024", "--warmup-steps", "10"]
    main(args + ["--epochs", "1", "--subword-alpha", "0.3"])
    out = capsys.readouterr().out
    assert "Settings changed" not in out and "Subword regularization: each epoch samples" in out
    main(args + ["--epochs", "2"])
    out = capsys.readouterr().out
    assert "Settings changed since the run's config.json: epochs 1 -> 2; subword_alpha 0.3 -> None" in out
    assert json.loads((tmp_path / "run" / "config.json").read_text())["training"]["subword_alpha"] is None


def test_short_warmup_warning_counts_the_two_way_epochs(capsys):
    """The warning that the warm-up outlasts the run counts BiT's two-way
    epochs at their own batches: it counted every epoch at the one-way
    batches, 13 x 3 = 39 steps for a run of 21 + 13 x 2 = 47 (a new-user
    trial)."""
    from types import SimpleNamespace

    import tensorflow as tf

    from keras_transformer.training import _warn_short_warmup

    built = []

    def two_way():
        built.append(1)
        return tf.data.Dataset.range(21)

    for warmup, bidirectional, said in ((50, 1, "(21 steps an epoch x 1 epoch in both directions + 13 x 2 = 47)"),
                                        (70, 2, "(21 steps an epoch x 2 epochs in both directions + 13 x 1 = 55)"),
                                        (50, 0, "(13 steps an epoch x 3 epochs = 39)"),
                                        (40, 1, None), (47, 1, None), (39, 0, None)):
        config = SimpleNamespace(warmup_steps=warmup, epochs=3, bidirectional_epochs=bidirectional)
        _warn_short_warmup(config, tf.data.Dataset.range(13), two_way)
        out = capsys.readouterr().out
        if said is None:
            assert out == ""
        else:
            assert f"Warning: warmup_steps={warmup} is more than the whole run {said}" in out
    # Not built where the one-way epochs alone cover the warm-up.
    _warn_short_warmup(SimpleNamespace(warmup_steps=39, epochs=3, bidirectional_epochs=1),
                       tf.data.Dataset.range(13), two_way)
    assert len(built) == 4


def test_bidirectional_epochs_train_both_directions_first_and_resume_in_either_stage(
    tmp_path, capsys, monkeypatch
):
    """BiT (Ding et al., 2021): epochs 1-2 train on each pair and its
    reverse (target -> source), as many steps as that dataset has batches;
    epochs 3-4 on source -> target only. A run stopped in either stage
    resumes in it."""
    import keras_transformer.training as training
    from keras_transformer.data.pipeline import make_dataset
    from keras_transformer.tokenizers import SubwordTokenizer

    data = tmp_path / "data"
    write_synthetic_corpus(str(data), n_train=80, n_val=10, seed=6)
    run = tmp_path / "run"
    args = ["train", "--train-src", str(data / "train.en"), "--train-tgt", str(data / "train.de"),
            "--val-src", str(data / "val.en"), "--val-tgt", str(data / "val.de"),
            "--output-dir", str(run), "--preset", "tiny", "--num-layers", "1",
            "--sequence-length", "24", "--src-vocab-size", "120", "--tgt-vocab-size", "120",
            "--shared-vocab", "--tokens-per-batch", "256", "--warmup-steps", "10",
            "--bidirectional-epochs", "2"]
    calls = []

    def recording(src, tgt, *rest, **kwargs):
        calls.append((list(src) if isinstance(src, list) else src, list(tgt) if isinstance(tgt, list) else tgt))
        return make_dataset(src, tgt, *rest, **kwargs)

    monkeypatch.setattr(training, "make_dataset", recording)
    main(args + ["--epochs", "1"])  # stopped inside the first stage
    assert "epochs 1-2 train on the pairs in both directions" in capsys.readouterr().out
    main(args + ["--epochs", "4"])
    main(args + ["--epochs", "4"])  # nothing left: builds no two-way data
    en = (data / "train.en").read_text().splitlines()
    de = (data / "train.de").read_text().splitlines()
    both = [call for call in calls if call[0] == en + de]
    assert len(both) == 2 and all(tgt == de + en for _, tgt in both)  # the first two runs
    assert [tgt for src, tgt in calls if src == en] == [de] * 3

    tok = SubwordTokenizer.load(str(run / "source.model"))
    assert (run / "source.model").read_bytes() == (run / "target.model").read_bytes()

    def batches(src, tgt):
        return int(make_dataset(src, tgt, tok, tok, sequence_length=24, tokens_per_batch=256,
                                shuffle=False).cardinality())

    one_way, two_way = batches(en, de), batches(en + de, de + en)
    assert two_way > one_way
    records = [json.loads(line) for line in (run / "epochs.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3, 4]
    assert [r["steps"] for r in records] == [two_way, two_way, one_way, one_way]
    # The optimizer went on across the switch: one step a batch.
    model = keras.saving.load_model(str(run / "model.keras"), compile=True)
    assert int(model.optimizer.iterations) == 2 * two_way + 2 * one_way
    # Resuming a finished first stage starts with the second.
    calls.clear()
    main(args + ["--epochs", "5"])
    assert [call for call in calls if call[0] == en + de] == []
    records = [json.loads(line) for line in (run / "epochs.jsonl").read_text().splitlines()]
    assert records[-1]["epoch"] == 5 and records[-1]["steps"] == one_way


def test_extra_train_pairs_join_every_epoch_but_not_the_tokenizer(tmp_path, capsys, monkeypatch):
    """--extra-train SRC TGT (repeatable): its pairs follow the training
    pairs in every epoch's data, BiT's reversed pairs included; the shared
    tokenizer is trained on --train-src/--train-tgt alone, and
    --max-train-pairs cuts those alone. config.json records the pairs, and
    `--config` of that file repeats them."""
    import keras_transformer.training as training
    from keras_transformer.data.pipeline import make_dataset

    data = tmp_path / "data"
    write_synthetic_corpus(str(data), n_train=60, n_val=10, seed=8)
    en = (data / "train.en").read_text().splitlines()
    de = (data / "train.de").read_text().splitlines()
    # Two extra file pairs: "distilled" targets and "back-translated" sources.
    (data / "kd.en").write_text("\n".join(en[:20]) + "\n")
    (data / "kd.de").write_text("\n".join(line.upper() for line in de[:20]) + "\n")
    (data / "bt.en").write_text("\n".join(line[::-1] for line in en[20:30]) + "\n")
    (data / "bt.de").write_text("\n".join(de[20:30]) + "\n")
    run = tmp_path / "run"
    args = ["train", "--train-src", str(data / "train.en"), "--train-tgt", str(data / "train.de"),
            "--val-src", str(data / "val.en"), "--val-tgt", str(data / "val.de"),
            "--extra-train", str(data / "kd.en"), str(data / "kd.de"),
            "--extra-train", str(data / "bt.en"), str(data / "bt.de"),
            "--output-dir", str(run), "--preset", "tiny", "--num-layers", "1",
            "--sequence-length", "24", "--src-vocab-size", "120", "--tgt-vocab-size", "120",
            "--shared-vocab", "--tokens-per-batch", "256", "--warmup-steps", "10",
            "--bidirectional-epochs", "1", "--max-train-pairs", "50", "--epochs", "2"]
    calls, tokenizer_data = [], []

    def recording(src, tgt, *rest, **kwargs):
        calls.append((src, tgt))
        return make_dataset(src, tgt, *rest, **kwargs)

    def recording_trainer(lines, *rest, **kwargs):
        tokenizer_data.append(list(lines))
        return train_subword_tokenizer(lines, *rest, **kwargs)

    train_subword_tokenizer = training.train_subword_tokenizer
    monkeypatch.setattr(training, "make_dataset", recording)
    monkeypatch.setattr(training, "train_subword_tokenizer", recording_trainer)
    main(args)
    out = capsys.readouterr().out
    assert f"Extra training pairs: {data / 'kd.en'} / {data / 'kd.de'}" in out
    assert "Read 80 training pairs" in out  # 50 + 20 + 10
    src = en[:50] + en[:20] + [line[::-1] for line in en[20:30]]
    tgt = de[:50] + [line.upper() for line in de[:20]] + de[20:30]
    assert tokenizer_data == [en[:50] + de[:50]]
    assert (src, tgt) in calls and (src + tgt, tgt + src) in calls
    saved = json.loads((run / "config.json").read_text())["training"]["extra_train"]
    assert saved == [[str(data / "kd.en"), str(data / "kd.de")], [str(data / "bt.en"), str(data / "bt.de")]]
    # The run's own config.json repeats it, extra pairs included.
    calls.clear()
    main(["train", "--config", str(run / "config.json"), "--epochs", "3"])
    assert (src, tgt) in calls
    records = [json.loads(line) for line in (run / "epochs.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records] == [1, 2, 3]


@pytest.mark.parametrize("extra, message", [
    (["kd.en", "short.de"], "kd.en has 20 lines but .*short.de has 3"),
    (["kd.en", "missing.de"], "missing.de is not a file"),
])
def test_extra_train_files_misaligned_or_missing_are_refused_before_training(tmp_path, capsys, extra, message):
    data = tmp_path / "data"
    write_synthetic_corpus(str(data), n_train=40, n_val=10, seed=8)
    (data / "kd.en").write_text("a dog runs .\n" * 20)
    (data / "short.de").write_text("ein Hund rennt .\n" * 3)
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        main(["train", "--train-src", str(data / "train.en"), "--train-tgt", str(data / "train.de"),
              "--extra-train", *(str(data / name) for name in extra),
              "--output-dir", str(run), "--preset", "tiny", "--num-layers", "1",
              "--src-vocab-size", "100", "--tgt-vocab-size", "100", "--epochs", "1"])
    assert info.value.code == 1
    assert re.search(message, capsys.readouterr().err)
    assert not run.exists()


@pytest.mark.parametrize("value", ["a.en", [["a.en"]], [["a.en", "b.de", "c.de"]], [[1, 2]], ["ab"]])
def test_extra_train_that_is_not_a_list_of_path_pairs_is_refused(value):
    from keras_transformer.config import check_extra_train

    with pytest.raises(ValueError, match=r"list of \[source file, target file\] pairs.*--extra-train SRC TGT"):
        check_extra_train(value)
    assert check_extra_train(None) == []
    assert check_extra_train((("a.en", "a.de"),)) == [("a.en", "a.de")]


def test_tagged_back_translation_keeps_its_tag_one_piece_and_a_resume_cannot_change_it(tmp_path, capsys,
                                                                                       monkeypatch):
    """--user-defined-symbols '<BT>' (tagged back-translation): the run's
    shared tokenizer holds the tag as one piece that no other text makes,
    the tagged source lines of an --extra-train file tokenize to it first,
    BiT's reversed pairs drop it from their targets, config.json records the
    symbols, resuming with other symbols is refused (the tokenizers would
    not fit), and so is a tag in capitals with --lowercase."""
    import keras_transformer.training as training
    from keras_transformer.data.pipeline import make_dataset
    from keras_transformer.training import load_run

    calls = []

    def recording(src, tgt, *rest, **kwargs):
        calls.append((src, tgt))
        return make_dataset(src, tgt, *rest, **kwargs)

    monkeypatch.setattr(training, "make_dataset", recording)

    data = tmp_path / "data"
    write_synthetic_corpus(str(data), n_train=60, n_val=10, seed=8)
    en = (data / "train.en").read_text().splitlines()
    de = (data / "train.de").read_text().splitlines()
    (data / "bt.en").write_text("".join(f"<BT> {line[::-1]}\n" for line in en[:20]))
    (data / "bt.de").write_text("\n".join(de[:20]) + "\n")
    run = tmp_path / "run"
    args = ["train", "--train-src", str(data / "train.en"), "--train-tgt", str(data / "train.de"),
            "--extra-train", str(data / "bt.en"), str(data / "bt.de"),
            "--output-dir", str(run), "--preset", "tiny", "--num-layers", "1",
            "--sequence-length", "24", "--src-vocab-size", "120", "--tgt-vocab-size", "120",
            "--shared-vocab", "--tokens-per-batch", "256", "--warmup-steps", "10", "--bidirectional-epochs", "1",
            "--epochs", "1"]
    with pytest.raises(SystemExit):
        main(args + ["--user-defined-symbols", "<BT>", "--lowercase"])
    assert "would never match it; write them in lower case (['<bt>'])" in capsys.readouterr().err
    assert not run.exists()
    main(args + ["--user-defined-symbols", "<BT>"])
    capsys.readouterr()
    tagged = [f"<BT> {line[::-1]}" for line in en[:20]]
    src_lines, tgt_lines = en + tagged, de + de[:20]
    assert (src_lines + tgt_lines, tgt_lines + en + [line[::-1] for line in en[:20]]) in calls  # BiT
    assert json.loads((run / "config.json").read_text())["training"]["user_defined_symbols"] == ["<BT>"]
    _, src, tgt, _ = load_run(str(run))
    vocabulary = src.vocabulary()
    assert vocabulary == tgt.vocabulary() and vocabulary.count("<BT>") == 1
    tag = vocabulary.index("<BT>")
    ids = [int(i) for i in src.tokenize(["<BT> " + en[0], en[0], "<B T>"]).to_list()[0]]
    assert tag in ids[:2] and ids.count(tag) == 1  # the tag first (after a lone "▁" piece, if any)
    for line in [en[0], "<B T>", "BT"]:
        assert tag not in [int(i) for i in src.tokenize([line]).to_list()[0]]
    assert src.detokenize(src.tokenize(["<BT> " + en[0]])).numpy()[0].decode() == "<BT> " + en[0]
    for other in (["--user-defined-symbols", "<FT>"], []):
        with pytest.raises(SystemExit) as info:
            main(args[:-1] + ["2"] + other)
        err = capsys.readouterr().err
        assert info.value.code == 1 and "user_defined_symbols ['<BT>'] -> " in err, err


@pytest.mark.parametrize("value, message", [
    ("<BT>", "must be a list of pieces"),
    (["<BT>", ""], "non-empty piece without whitespace"),
    (["<B T>"], "non-empty piece without whitespace"),
    ([7], "non-empty piece without whitespace"),
    (["<BT>", "<BT>"], "names a piece twice"),
    (["<BT>", "</s>"], r"special piece\(s\) \['</s>'\]"),
])
def test_bad_user_defined_symbols_are_refused(value, message):
    from keras_transformer.config import TrainingConfig

    with pytest.raises(ValueError, match=message):
        TrainingConfig(train_src="a.en", train_tgt="a.de", user_defined_symbols=value)
    assert TrainingConfig(train_src="a.en", train_tgt="a.de", user_defined_symbols=[]).user_defined_symbols is None


@pytest.mark.parametrize("bidirectional", [0, 1])
def test_cooldown_epochs_end_the_learning_rate_at_zero_on_the_last_step(tmp_path, capsys, bidirectional):
    """--cooldown-epochs 2 of 3: the schedule's cooldown spans the steps of
    the last two epochs (as epochs.jsonl counts them, BiT's two-way epoch
    included) and ends at the run's last step, where the rate is 0; before
    the cooldown the rate is the plain schedule's."""
    from keras_transformer.schedules import WarmupSchedule

    data = tmp_path / "data"
    write_synthetic_corpus(str(data), n_train=80, n_val=10, seed=6)
    run = tmp_path / "run"
    main(["train", "--train-src", str(data / "train.en"), "--train-tgt", str(data / "train.de"),
          "--val-src", str(data / "val.en"), "--val-tgt", str(data / "val.de"),
          "--output-dir", str(run), "--preset", "tiny", "--num-layers", "1",
          "--sequence-length", "24", "--src-vocab-size", "120", "--tgt-vocab-size", "120",
          "--shared-vocab", "--tokens-per-batch", "256", "--warmup-steps", "10",
          "--bidirectional-epochs", str(bidirectional), "--epochs", "3", "--cooldown-epochs", "2"])
    steps = [json.loads(line)["steps"] for line in (run / "epochs.jsonl").read_text().splitlines()]
    assert len(steps) == 3 and (steps[0] > steps[1]) == bool(bidirectional)
    out = capsys.readouterr().out
    assert f"linear to 0 over the last 2 epochs, steps {steps[0] + 1}-{sum(steps)}" in out
    model = keras.saving.load_model(str(run / "model.keras"), compile=True)
    config = model.optimizer.get_config()["learning_rate"]["config"]
    assert (config["total_steps"], config["cooldown_steps"]) == (sum(steps), steps[1] + steps[2])
    assert int(model.optimizer.iterations) == sum(steps)
    assert float(model.optimizer.learning_rate) == 0.0
    schedule = WarmupSchedule.from_config(config)
    plain = WarmupSchedule(config["d_model"], 10, scale=config["scale"])
    assert float(schedule(steps[0])) == float(plain(steps[0])) > 0


@pytest.mark.parametrize("extra, message", [
    (["--parallel-searches", "2", "--jit-compile"],
     "--parallel-searches splits the batches of the plain graph search, and with --jit-compile alone"),
    (["--xla-max-batch-size", "4"], "--xla-max-batch-size chooses which batches take the XLA search: pass --jit-compile"),
])
def test_search_flags_that_need_each_other_are_refused_by_flag_name_before_loading(tmp_path, capsys, extra,
                                                                                   message):
    """The run folder does not exist: the flag error comes first, named as
    flags (it used to come after the model load, in Python names)."""
    for command in (["translate", "--run", str(tmp_path / "no-run"), "A dog."],
                    ["export", "--run", str(tmp_path / "no-run"), "--output", str(tmp_path / "out")]):
        with pytest.raises(SystemExit) as info:
            main(command + extra)
        assert info.value.code == 1
        err = capsys.readouterr().err
        assert message in err and "no-run" not in err, err


def test_more_parallel_searches_than_cores_is_warned(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    with pytest.raises(SystemExit):
        main(["export", "--run", str(tmp_path / "no-run"), "--output", str(tmp_path / "out"),
              "--parallel-searches", "3"])
    assert "--parallel-searches 3 is more search loops than this machine's 2 cores" in capsys.readouterr().err


THREADS_SCRIPT = r"""
import sys, warnings
import tensorflow as tf
from keras_transformer.loading import SavedModelTranslator
if sys.argv[2] == "started":
    tf.constant(1.0) + 1.0  # TensorFlow has run an op: too late to set threads
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        SavedModelTranslator(sys.argv[1])
    except Exception as error:  # the folder's saved_model.pb is a stand-in
        print("load failed:", type(error).__name__)
print(*[str(w.message)[:60] for w in caught], sep="\n")
print(tf.config.threading.get_inter_op_parallelism_threads(), tf.config.threading.get_intra_op_parallelism_threads())
"""


def test_an_export_with_parallel_searches_gets_its_threads(tmp_path):
    """Loading an export with parallel_searches 2 (the CLI's --saved-model,
    kt.load_translator) runs TensorFlow with 2 inter-op threads of 1
    intra-op thread, set before the graph loads; one without keeps
    TensorFlow's defaults (0, 0); when TensorFlow has already started, a
    warning says how to set them."""
    for parts, state, want in ((2, "fresh", "2 1"), (1, "fresh", "0 0"), (2, "started", "0 0")):
        folder = tmp_path / f"export{parts}"
        folder.mkdir(exist_ok=True)
        (folder / "saved_model.pb").write_bytes(b"")
        (folder / "keras_transformer.json").write_text(json.dumps({"decoding": {"parallel_searches": parts}}))
        out = subprocess.run([sys.executable, "-c", THREADS_SCRIPT, str(folder), state], capture_output=True,
                             text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), check=True)
        assert out.stdout.split()[-2:] == want.split(), out.stdout
        warned = "This model splits each batch into 2 search loops" in out.stdout
        assert warned == (state == "started"), out.stdout
