"""Weight tying (section 3.4), separate dropout rates, checkpoint averaging,
resumable early stopping and validation BLEU: values, not just runs."""

import json
import os

import keras
import numpy as np
import pytest

from conftest import to_numpy
from keras_transformer import build_transformer
from keras_transformer.callbacks import history_state
from keras_transformer.checkpoints import average_weights
from keras_transformer.checkpoints import select_checkpoints
from keras_transformer.decoding import TransformerParts
from keras_transformer.layers import FeedForward

SIZES = dict(num_layers=1, d_model=16, num_heads=2, dff=32, sequence_length=12)
INPUTS = {"encoder_inputs": np.array([[5, 6, 7, 0], [8, 9, 0, 0]], "int32"),
          "decoder_inputs": np.array([[2, 7, 9], [2, 4, 0]], "int32")}


@pytest.mark.parametrize("tie, fewer", [("none", 0), ("target", 16 * 40 + 40), ("all", 2 * 16 * 40 + 40)])
def test_tied_parameter_counts(tie, fewer):
    """Tying removes exactly the shared matrices: the output kernel and bias
    ("target"), and the source table too ("all")."""
    untied = build_transformer(40, 40, **SIZES)
    tied = build_transformer(40, 40, tie_embeddings=tie, **SIZES)
    assert untied.count_params() - tied.count_params() == fewer


def test_tied_logits_are_the_embedding_transposed():
    """The logits of a tied model are the decoder output times E^T, with the
    table the embedding multiplies by sqrt(d_model): one matrix."""
    model = build_transformer(40, 40, tie_embeddings="all", **SIZES)
    encoder, decoder, output = model.encoder_embedding, model.decoder_embedding, model.logits_layer
    assert encoder is decoder is output
    logits = to_numpy(model(INPUTS))
    hidden_model = keras.Model(model.inputs, model.get_layer("decoder_layer_0").output)
    hidden = to_numpy(hidden_model(INPUTS))
    table = to_numpy(encoder.embeddings)
    np.testing.assert_allclose(logits, hidden @ table.T, rtol=1e-5, atol=1e-5)
    ids = INPUTS["decoder_inputs"]
    embedded = to_numpy(encoder(ids))
    positions = to_numpy(encoder.position_encoding)[: ids.shape[1]]
    np.testing.assert_allclose(embedded, table[ids] * 4.0 + positions, rtol=1e-5, atol=1e-5)


def test_all_tying_needs_one_vocabulary():
    with pytest.raises(ValueError, match="src_vocab_size=40 and tgt_vocab_size=50"):
        build_transformer(40, 50, tie_embeddings="all", **SIZES)
    with pytest.raises(ValueError, match="tie_embeddings must be one of"):
        build_transformer(40, 40, tie_embeddings="yes", **SIZES)


def test_tied_gradient_is_one_sum_of_three_paths():
    """With everything tied, the table's gradient is the sum over its three
    uses (source lookup, target lookup, output projection), and one variable
    receives it."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("GradientTape")
    import tensorflow as tf

    model = build_transformer(40, 40, tie_embeddings="all", dropout_rate=0.0, **SIZES)
    variable = model.encoder_embedding.token_embedding.embeddings
    assert sum(v is variable for v in model.trainable_variables) == 1
    table = variable.value  # the tf.Variable
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(INPUTS) ** 2)
    grad = tf.convert_to_tensor(tape.gradient(loss, table)).numpy()
    # The projection's share alone: d/dE of sum((h E^T)^2) with h held fixed.
    hidden = keras.Model(model.inputs, model.get_layer("decoder_layer_0").output)(INPUTS)
    with tf.GradientTape() as tape:
        projection_only = tf.reduce_sum(tf.matmul(tf.stop_gradient(hidden), table, transpose_b=True) ** 2)
    share = tape.gradient(projection_only, table).numpy()
    assert np.abs(grad - share).max() > 1e-6  # the lookups contribute too
    used = np.unique(np.concatenate([INPUTS["encoder_inputs"].ravel(), INPUTS["decoder_inputs"].ravel()]))
    unused = np.setdiff1d(np.arange(40), used)
    np.testing.assert_allclose(grad[unused], share[unused], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("tie", ["target", "all"])
def test_tied_model_round_trips_and_decodes(tmp_path, tie):
    """Tied weights stay one variable through .keras save and load, and the
    cached decoder's step logits equal the full model's."""
    model = build_transformer(40, 40, tie_embeddings=tie, **SIZES)
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(INPUTS, np.array([[7, 9, 3], [4, 3, 0]]), epochs=1, verbose=0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert len(loaded.trainable_variables) == len(model.trainable_variables)
    np.testing.assert_array_equal(to_numpy(loaded(INPUTS)), to_numpy(model(INPUTS)))
    parts = TransformerParts(loaded)
    memory, mask = parts.encode(INPUTS["encoder_inputs"])
    caches = parts.empty_self_caches(2, 12, memory.dtype)
    cross = parts.cross_caches(memory)
    full = to_numpy(loaded(INPUTS))
    real = INPUTS["decoder_inputs"] != 0  # the full model masks a padded decoder input
    for index in range(3):
        step, caches = parts.decode_step(INPUTS["decoder_inputs"][:, index], index, caches, cross, mask)
        rows = real[:, index]
        np.testing.assert_allclose(to_numpy(step)[rows], full[rows, index], rtol=1e-4, atol=1e-4)


def test_activation_dropout_drops_the_inner_activation():
    layer = FeedForward(dff=64, activation_dropout_rate=0.5)
    x = np.random.default_rng(0).normal(size=(4, 5, 8)).astype("float32")
    np.testing.assert_allclose(to_numpy(layer(x, training=False)),
                               to_numpy(layer.output_dense(layer.intermediate_dense(x))), rtol=1e-6)
    assert not np.allclose(to_numpy(layer(x, training=True)), to_numpy(layer(x, training=False)))
    restored = FeedForward.from_config(layer.get_config())
    assert restored.activation_dropout_rate == 0.5
    with pytest.raises(ValueError, match="activation_dropout_rate"):
        FeedForward(dff=8, activation_dropout_rate=1.0)


def test_block_dropout_rates_reach_their_layers():
    model = build_transformer(40, 40, dropout_rate=0.3, attention_dropout_rate=0.2,
                              activation_dropout_rate=0.1, **SIZES)
    block = model.get_layer("encoder_layer_0")
    assert (block.dropout_rate, block.attention_dropout_rate, block.activation_dropout_rate) == (0.3, 0.2, 0.1)
    assert block.feedforward.activation_dropout.rate == 0.1
    assert block.self_attention_dropout.rate == 0.3
    assert model.get_layer("encoder_embedding_dropout").rate == 0.3


def test_average_weights_is_the_numpy_mean():
    rng = np.random.default_rng(1)
    sets = [[rng.normal(size=(3, 4)).astype("float32"), rng.normal(size=5).astype("float32"),
             np.array([k, 7], "int64")] for k in range(3)]
    averaged = average_weights(sets)
    np.testing.assert_allclose(averaged[0], np.mean([s[0] for s in sets], axis=0), rtol=1e-6)
    np.testing.assert_allclose(averaged[1], np.mean([s[1] for s in sets], axis=0), rtol=1e-6)
    # One path is not a list of them (its characters were read as paths; a new-user trial).
    from keras_transformer.checkpoints import average_checkpoints

    with pytest.raises(TypeError, match="takes a list of weight files; got one path, 'run/epoch-001"):
        average_checkpoints(None, "run/epoch-001.weights.h5")
    np.testing.assert_array_equal(averaged[2], [2, 7])  # integer state: the last one
    with pytest.raises(ValueError, match="different shapes"):
        average_weights([sets[0], sets[1][:2] + [np.zeros(3)]])


def _log(run, values, key="val_loss"):
    with open(os.path.join(run, "epochs.jsonl"), "w") as f:
        for epoch, value in enumerate(values, 1):
            f.write(json.dumps({"epoch": epoch, key: value}) + "\n")


def test_select_checkpoints_last_and_best(tmp_path):
    run = str(tmp_path)
    os.makedirs(os.path.join(run, "epochs"))
    for epoch in (3, 4, 5, 6):
        open(os.path.join(run, "epochs", f"epoch-{epoch:03d}.weights.h5"), "w").close()
    _log(run, [9.0, 8.0, 2.0, 5.0, 1.0, 2.0])
    names = lambda paths: [os.path.basename(p)[6:9] for p in paths]  # noqa: E731
    assert names(select_checkpoints(run, last=2)) == ["005", "006"]
    assert names(select_checkpoints(run, best=2)) == ["005", "006"]  # 6 beats 3 on the tie
    assert names(select_checkpoints(run, best=3)) == ["003", "005", "006"]
    # The advice named --keep-checkpoints alone where the run had fewer epochs (a new-user trial).
    with pytest.raises(ValueError, match="fewer than the 5 .* train more epochs with --keep-checkpoints 5 or more"):
        select_checkpoints(run, last=5)
    with pytest.raises(ValueError, match="one positive count"):
        select_checkpoints(run, last=1, best=1)
    # An accuracy ranks highest first; it ranked lowest first, as a loss (a
    # new-user trial), and a key that holds text ("hardware") failed in
    # float(). Other keys rank lowest first, as Keras's mode="auto" does.
    _log(run, [0.1, 0.2, 0.9, 0.5, 0.7, 0.6], key="val_masked_accuracy")
    assert names(select_checkpoints(run, best=2, monitor="val_masked_accuracy")) == ["003", "005"]
    _log(run, [0.1, 0.2, 0.9, 0.5, 0.7, 0.6], key="val_perplexity")
    assert names(select_checkpoints(run, best=2, monitor="val_perplexity")) == ["004", "006"]
    _log(run, ["AMD EPYC, 2 cores"] * 6, key="hardware")
    with pytest.raises(ValueError, match=r"has a number for `hardware` in epochs.jsonl; it logged \[\]"):
        select_checkpoints(run, best=2, monitor="hardware")
    _log(run, [9.0, 8.0, 2.0, 5.0, 1.0, 2.0])
    # A run trained without --bleu-every logs no val_bleu: said so, not
    # "0 epoch checkpoints ... train with a larger --keep-checkpoints".
    with pytest.raises(ValueError, match=r"has a number for `val_bleu`.*--bleu-every\); it logged \['val_loss'\]"):
        select_checkpoints(run, best=2, monitor="val_bleu")
    # Epoch 5 not kept: "the last 3" took epoch 3 in its place without a
    # word (a new-user trial); it still does, and says so.
    os.remove(os.path.join(run, "epochs", "epoch-005.weights.h5"))
    with pytest.warns(UserWarning, match=r"are epochs \[3, 4, 6\]: the checkpoints of epoch\(s\) \[5\] were not kept"):
        assert names(select_checkpoints(run, last=3)) == ["003", "004", "006"]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert names(select_checkpoints(run, last=1)) == ["006"]


def test_average_last_beyond_the_epochs_is_refused_first_and_a_shorter_run_averages_what_it_kept(tmp_path):
    """`train --average-last 5 --epochs 3` trained all three epochs and then
    failed, advising --keep-checkpoints (a new-user trial). It is refused
    before anything is written; a run that ends sooner (early stopping,
    the time budget) averages the checkpoints it kept, with a warning."""
    from keras_transformer import training
    from keras_transformer.config import TrainingConfig

    with pytest.raises(ValueError, match="average_last=5 averages the last 5 epochs, but epochs=3 trains 3"):
        training.train(TrainingConfig(train_src="s", train_tgt="t", epochs=3, average_last=5,
                                      output_dir=str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()
    run = tmp_path / "stopped"
    (run / "epochs").mkdir(parents=True)
    model = build_transformer(40, 40, **SIZES)
    model.save_weights(run / "epochs" / "epoch-001.weights.h5")
    first = model.get_weights()
    model.set_weights([w + 1.0 if np.issubdtype(w.dtype, np.floating) else w for w in first])
    model.save_weights(run / "epochs" / "epoch-002.weights.h5")
    config = TrainingConfig(train_src="s", train_tgt="t", epochs=10, average_last=4)
    with pytest.warns(UserWarning, match="average_last=4, but the run ended with 2 epoch checkpoint"):
        training._finish(config, model, str(run), None, None, verbose=False)
    averaged = keras.saving.load_model(run / "averaged.keras", compile=False).get_weights()
    for got, w in zip(averaged, first):
        if np.issubdtype(w.dtype, np.floating):
            np.testing.assert_allclose(got, w + 0.5, rtol=1e-6, atol=1e-6)


def test_early_stopping_state_from_the_log(tmp_path):
    run = str(tmp_path)
    _log(run, [3.0, 2.0, 2.5, 2.1, 2.2])
    assert history_state(run, "val_loss", 3) == (3, 2.0, True)
    assert history_state(run, "val_loss", 4) == (3, 2.0, False)


@pytest.mark.slow
def test_train_with_tying_shared_vocab_bleu_early_stopping_and_averaging(tmp_path, capsys):
    """`train` end to end with the new settings: one vocabulary for both
    sides, everything tied, val_bleu logged every epoch and choosing
    best.keras, early stopping that a rerun resumes, and averaged.keras
    equal to the NumPy mean of the last two epoch checkpoints."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the CLI uses the tensorflow backend")
    from keras_transformer.cli import main
    from keras_transformer.data.synthetic import write_synthetic_corpus
    from keras_transformer.training import load_run

    data = tmp_path / "data"
    write_synthetic_corpus(str(data), n_train=300, n_val=20, seed=3)
    run = str(tmp_path / "run")
    args = ["train", "--train-src", str(data / "train.en"), "--train-tgt", str(data / "train.de"),
            "--val-src", str(data / "val.en"), "--val-tgt", str(data / "val.de"),
            "--output-dir", run, "--preset", "tiny", "--num-layers", "1", "--sequence-length", "24",
            "--src-vocab-size", "200", "--tgt-vocab-size", "200", "--tokens-per-batch", "1024",
            "--warmup-steps", "10", "--epochs", "3", "--shared-vocab", "--tie-embeddings", "all",
            "--activation-dropout-rate", "0.1", "--attention-dropout-rate", "0.05",
            "--bleu-every", "1", "--checkpoint-metric", "val_bleu", "--average-last", "2",
            "--keep-checkpoints", "2", "--early-stopping-patience", "5"]
    main(args)
    out = capsys.readouterr().out
    assert "Averaged epoch-002, epoch-003 into" in out
    with open(os.path.join(run, "source.model"), "rb") as a, open(os.path.join(run, "target.model"), "rb") as b:
        assert a.read() == b.read()
    with open(os.path.join(run, "config.json")) as f:
        config = json.load(f)
    assert config["model"]["tie_embeddings"] == "all"
    assert config["model"]["activation_dropout_rate"] == 0.1
    records = [json.loads(line) for line in open(os.path.join(run, "epochs.jsonl"))]
    assert [r["epoch"] for r in records] == [1, 2, 3]
    assert all(0.0 <= r["val_bleu"] <= 100.0 for r in records)
    best_two = sorted(records, key=lambda r: (-r["val_bleu"], -r["epoch"]))[:2]  # later wins a tie
    expected = {2, 3} | {r["epoch"] for r in best_two}
    assert set(os.listdir(os.path.join(run, "epochs"))) == {f"epoch-{e:03d}.weights.h5" for e in expected}
    model = load_run(run, "last")[0]
    sets = []
    for path in select_checkpoints(run, last=2):
        model.load_weights(path)
        sets.append([np.array(w) for w in model.get_weights()])
    averaged = load_run(run, "averaged")[0]
    for got, *values in zip(averaged.get_weights(), *sets):
        np.testing.assert_allclose(got, np.mean(values, axis=0), rtol=1e-5, atol=1e-7)
    # Early stopping resumes from the log: with patience already spent, a
    # rerun with more epochs trains nothing more.
    with open(os.path.join(run, "epochs.jsonl"), "a") as f:
        for epoch in (4, 5):
            f.write(json.dumps({"epoch": epoch, "val_loss": 99.0}) + "\n")
    main(args[:args.index("--early-stopping-patience")] + ["--early-stopping-patience", "2",
                                                           "--epochs", "8"])
    assert "nothing more to train" in capsys.readouterr().out
    # So does a spent time budget: the three trained epochs took more than 1 s.
    main(args + ["--epochs", "8", "--time-budget", "1"])
    out = capsys.readouterr().out
    assert "Time budget:" in out and "nothing more to train" in out
    assert len(open(os.path.join(run, "epochs.jsonl")).readlines()) == 5


def test_averaging_names_a_weights_file_that_cannot_be_read(tmp_path):
    """A truncated epoch file gave h5py's "Unable to synchronously open file
    (truncated file: eof = 5000, ...)", which names no file (a new-user
    trial)."""
    from keras_transformer.checkpoints import average_checkpoints

    model = build_transformer(40, 40, **SIZES)
    good, cut = tmp_path / "epoch-001.weights.h5", tmp_path / "epoch-002.weights.h5"
    model.save_weights(good)
    cut.write_bytes(good.read_bytes()[:5000])
    with pytest.raises(ValueError, match=f"{cut} cannot be read \\(truncated or corrupt\\?\\)"):
        average_checkpoints(model, [str(good), str(cut)])
    before = model.get_weights()
    averaged = average_checkpoints(model, [str(good), str(good)]).get_weights()
    for a, b in zip(averaged, before):
        np.testing.assert_allclose(a, b, rtol=1e-6)
