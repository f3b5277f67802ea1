"""The training benchmark's FLOP count, checked against the model's own weights."""

import importlib.util
import pathlib

import numpy as np
import pytest

from keras_transformer import build_transformer

_BENCHMARK = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "training.py"


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("_training_benchmark", _BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_useful_flops_counts_every_kernel_on_the_tokens_it_sees():
    bench = _load_benchmark()
    model = build_transformer(
        bench.VOCAB, bench.VOCAB, bench.LAYERS, bench.D_MODEL, bench.HEADS, bench.DFF,
        0.1, bench.MAX_LEN,
    )
    per_source = per_target = 0
    for weight in model.weights:
        if not weight.path.endswith("/kernel"):
            continue
        macs = int(np.prod(weight.shape))
        # The encoder runs on source tokens, and so do the decoder's
        # cross-attention keys and values (projections of the encoder output).
        on_source = weight.path.startswith("encoder_") or weight.path.split("/")[1:3] in (
            ["cross_attention", "key"],
            ["cross_attention", "value"],
        )
        if on_source:
            per_source += 2 * macs
        else:
            per_target += 2 * macs
    assert per_target > 2 * bench.D_MODEL * bench.VOCAB  # the logits are in it

    src, tgt = np.array([7, 40, 1]), np.array([12, 3, 20])
    d, layers = bench.D_MODEL, bench.LAYERS
    attention = sum(
        layers * (2 * 2 * s * s * d + 2 * 2 * t * t * d / 2 + 2 * 2 * t * s * d)
        for s, t in zip(src, tgt)
    )
    expected = 3 * (per_source * src.sum() + per_target * tgt.sum() + attention)
    np.testing.assert_allclose(bench.useful_flops(src, tgt), expected, rtol=1e-12)


def _load(name):
    path = _BENCHMARK.parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_{name}_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_decoding_profile_counts_ops_per_while_loop_step():
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    profile = _load("decoding_profile")
    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    names = ["while/cond/_1/while/Less:Less", "while/body/_2/while/MatMul:_MklMatMul",
             "while/body/_2/while/add:AddV2", "ExecutorState::Process", "encoder/Less:Less"]
    for key, name in enumerate(names, start=1):
        plane.event_metadata[key].id, plane.event_metadata[key].name = key, name
    line = plane.lines.add(name="tf_Compute")
    # Three steps: the condition runs 3 times, a matmul (10 us) and two adds
    # (1 us) a step; one executor event and one Less outside the loop.
    for _ in range(3):
        line.events.add(metadata_id=1, duration_ps=500_000)
        line.events.add(metadata_id=2, duration_ps=10_000_000)
        line.events.add(metadata_id=3, duration_ps=1_000_000)
        line.events.add(metadata_id=3, duration_ps=1_000_000)
    line.events.add(metadata_id=4, duration_ps=99_000_000)
    line.events.add(metadata_id=5, duration_ps=2_000_000)
    steps, table = profile.op_table(space)
    assert steps == 3
    assert table == {"Less": (4, 3_500_000), "_MklMatMul": (3, 30_000_000), "AddV2": (6, 6_000_000)}
    lines = profile.format_table(steps, table, wall_seconds=0.05)
    assert lines[0] == "decoding steps: 3; ops: 13 (4.3 a step); kernel time 0.0 ms; wall time 50.0 ms"
    assert lines[2].split() == ["_MklMatMul", "1.0", "0.030", "10.00", "75.9%"]


def test_accelerator_check_trains_on_the_rows_make_dataset_makes():
    """`benchmarks/accelerator.py` fits on NumPy rows it builds itself (the
    GPU machine has no TensorFlow): with the fixed segmentation they are the
    rows of `make_dataset` (source + end; start + target; target + end; cut
    to the sequence length; empty sides dropped), padded with 0, as a
    multiset of rows."""
    from keras_transformer import make_dataset
    from keras_transformer import train_subword_tokenizer
    from keras_transformer.data import make_synthetic_corpus

    bench = _load("accelerator")
    en, de = make_synthetic_corpus(300, seed=3)
    src_tok, tgt_tok = train_subword_tokenizer(en, vocab_size=150), train_subword_tokenizer(de, vocab_size=150)
    en, de = en + ["", "A dog runs."], de + ["Ein Hund läuft.", "   "]  # dropped, as by make_dataset
    # Length 12 cuts many sentences (as make_dataset does).
    source, decoder_inputs, labels, kept = bench.token_arrays(src_tok, tgt_tok, en, de, length=12)
    assert kept == list(range(300))
    assert source.shape == decoder_inputs.shape == labels.shape == (300, 12)
    assert (source[:, -1] != 0).sum() > 30  # cut, and ended with the end id

    def rows(*arrays):
        return sorted(tuple(tuple(int(t) for t in a[a != 0]) for a in parts) for parts in zip(*arrays))

    want = []
    for x, y in make_dataset(en, de, src_tok, tgt_tok, sequence_length=12, batch_size=64, shuffle=False):
        want += rows(x["encoder_inputs"].numpy(), x["decoder_inputs"].numpy(), y.numpy())
    assert rows(source, decoder_inputs, labels) == sorted(want)
    assert decoder_inputs[0, 0] == tgt_tok.start_id and source[0, (source[0] != 0).sum() - 1] == src_tok.end_id


def test_the_decoding_benchmarks_uncached_search_gives_the_cached_searchs_ids():
    """`benchmarks/decoding.py`'s decoder re-run on the whole prefix failed
    in the beam search's first cache growth (its token history is 2-D; a
    new-user trial), so the benchmark printed no ratios. Greedy and beam
    search give the cached search's ids."""
    import keras
    import numpy as np

    from keras_transformer import build_transformer
    from keras_transformer.decoding import TransformerParts, beam_search, greedy_search

    bench = _load("decoding")
    keras.utils.set_random_seed(0)
    model = build_transformer(30, 40, num_layers=2, d_model=16, num_heads=2, dff=32, dropout_rate=0.0,
                              sequence_length=40)
    source = np.array([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]], "int32")
    for search in (lambda p: greedy_search(p, source, start_id=2, end_id=3, max_length=39)[0],
                   lambda p: beam_search(p, source, start_id=2, end_id=3, beam_size=3, max_length=39)[0]):
        np.testing.assert_array_equal(np.asarray(search(bench.UncachedParts(model))),
                                      np.asarray(search(TransformerParts(model))))


def test_the_decoding_race_refuses_bad_counts_and_reads_the_recorded_languages(tmp_path, monkeypatch, capsys):
    """`--rounds 0` failed after the workers started ("no median for empty
    data"), `--quick` overrode an explicit `--rounds`, and a SavedModel
    folder not named `...-SRC-TGT` failed to unpack its name (a new-user
    trial): the counts are checked first and the languages are the
    export's own."""
    import json
    import sys

    race = _load("decoding_race")
    unnamed = tmp_path / "mymodel"
    unnamed.mkdir()
    (unnamed / "saved_model.pb").write_bytes(b"")
    (unnamed / "keras_transformer.json").write_text(json.dumps({}))
    for argv, message in ((["--rounds", "0"], "must be at least 1; got 0"),
                          (["--quick", "--sentences", "4"], "--batch1-sentences 8 is more than --sentences 4"),
                          (["--saved-model", str(unnamed)], f"{unnamed} records no language pair")):
        monkeypatch.setattr(sys, "argv", ["decoding_race.py", *argv])
        with pytest.raises(SystemExit):
            race.main()
        assert message in capsys.readouterr().err
    # With the pair recorded, the corpus files are looked for under --data.
    (unnamed / "keras_transformer.json").write_text(json.dumps({"languages": {"source": "en", "target": "fr"}}))
    monkeypatch.setattr(sys, "argv", ["decoding_race.py", "--saved-model", str(unnamed), "--data", str(tmp_path)])
    with pytest.raises(SystemExit):
        race.main()
    assert f"{tmp_path}/test_2016_flickr.en.gz does not exist" in capsys.readouterr().err


def test_accelerator_prepare_needs_a_run_and_takes_its_language_pair(tmp_path, capsys):
    """`prepare` without --run was a TypeError (and left an empty folder);
    `--pair de-en` on an en-de run wrote German sources and English
    references without a word (a new-user trial)."""
    import json

    bench = _load("accelerator")
    with pytest.raises(SystemExit):
        bench.main(["prepare", "--out", str(tmp_path / "out")])
    assert "prepare needs --run" in capsys.readouterr().err and not (tmp_path / "out").exists()
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"training": {"train_src": "d/train.en.gz",
                                                               "train_tgt": "d/train.de.gz"}}))
    with pytest.raises(SystemExit):
        bench.main(["prepare", "--run", str(run), "--pair", "de-en", "--out", str(tmp_path / "out")])
    assert f"{run} was trained en-de and --pair is de-en: pass --pair en-de" in capsys.readouterr().err
