"""Training precision: the `"auto"` choice, mixed-precision training runs,
and float32 decoding of a model trained in mixed precision."""

import json

import keras
import numpy as np
import pytest

from keras_transformer import precision
from keras_transformer.models.transformer import build_transformer
from keras_transformer.precision import compute_dtype
from keras_transformer.precision import cpu_has_bfloat16
from keras_transformer.precision import resolve_precision
from keras_transformer.precision import with_dtype_policy

_EPYC_FLAGS = "flags\t\t: fpu vme avx2 avx512f avx512bw avx512_vnni avx512_bf16 vaes\n"
_NO_BF16_FLAGS = "flags\t\t: fpu vme avx2 avx512f avx512bw avx512_vnni vaes\n"


@pytest.mark.parametrize("text, expected", [
    ("processor\t: 0\n" + _EPYC_FLAGS, True),
    ("processor\t: 0\n" + _NO_BF16_FLAGS, False),
    ("processor\t: 0\nflags\t\t: fpu amx_bf16 amx_tile\n", True),
    # A flag that only contains the name is not the flag.
    ("flags\t\t: fpu avx512_bf16_extra\n", False),
    ("processor\t: 0\n", False),
])
def test_cpu_has_bfloat16_reads_the_flags_line(tmp_path, text, expected):
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    assert cpu_has_bfloat16(str(path)) is expected


def test_cpu_has_bfloat16_is_false_without_a_cpuinfo(tmp_path):
    assert cpu_has_bfloat16(str(tmp_path / "missing")) is False


@pytest.mark.parametrize("name", ["float32", "mixed_bfloat16", "mixed_float16"])
def test_explicit_precisions_are_kept(name, monkeypatch):
    monkeypatch.setenv("KERAS_TRANSFORMER_PRECISION", "float32")  # only replaces "auto"
    assert resolve_precision(name) == name


@pytest.mark.parametrize("bad", ["bfloat16", "fp32", None, ""])
def test_unknown_precision_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="`precision` must be one of"):
        resolve_precision(bad)


@pytest.mark.parametrize("has_bf16", [True, False])
def test_auto_follows_the_cpu_on_tensorflow(monkeypatch, has_bf16):
    monkeypatch.delenv("KERAS_TRANSFORMER_PRECISION", raising=False)
    monkeypatch.setattr(precision, "cpu_has_bfloat16", lambda: has_bf16)
    monkeypatch.setattr(precision, "_has_gpu", lambda: False)
    expected = "mixed_bfloat16" if has_bf16 and keras.backend.backend() == "tensorflow" else "float32"
    assert resolve_precision("auto") == expected
    assert resolve_precision("auto", d_model=256) == expected
    assert resolve_precision("auto", d_model=512) == expected
    # Narrow models train faster in float32 (measured: tiny, d_model 128).
    assert resolve_precision("auto", d_model=128) == "float32"
    assert resolve_precision("mixed_bfloat16", d_model=128) == "mixed_bfloat16"
    # A GPU, not measured here, keeps float32.
    monkeypatch.setattr(precision, "_has_gpu", lambda: True)
    assert resolve_precision("auto") == "float32"


def test_environment_variable_replaces_auto(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_bfloat16", lambda: True)
    monkeypatch.setenv("KERAS_TRANSFORMER_PRECISION", "float32")
    assert resolve_precision("auto") == "float32"
    assert precision.precision_source("auto") == "KERAS_TRANSFORMER_PRECISION"
    assert precision.precision_source("float32") == "given"
    monkeypatch.setenv("KERAS_TRANSFORMER_PRECISION", "half")
    with pytest.raises(
        ValueError, match="environment variable KERAS_TRANSFORMER_PRECISION .* got 'half'"
    ):
        resolve_precision("auto")
    # An explicit precision does not read the variable.
    assert resolve_precision("float32") == "float32"
    for unset in ("", "auto"):
        monkeypatch.setenv("KERAS_TRANSFORMER_PRECISION", unset)
        assert precision.precision_source("auto") == "auto"


def _tiny(dtype=None):
    return build_transformer(
        40, 48, num_layers=1, d_model=32, num_heads=2, dff=64, dropout_rate=0.0,
        sequence_length=16, dtype=dtype,
    )


def test_with_dtype_policy_copies_weights_and_changes_compute_dtype():
    keras.utils.set_random_seed(1)
    model = _tiny("mixed_bfloat16")
    assert compute_dtype(model) == "bfloat16"
    # Mixed precision keeps float32 variables: the copy's weights are equal.
    assert {w.dtype.name if hasattr(w.dtype, "name") else str(w.dtype)
            for w in model.get_weights()} == {"float32"}
    copy = with_dtype_policy(model, "float32")
    assert compute_dtype(copy) == "float32"
    assert [layer.name for layer in copy.layers] == [layer.name for layer in model.layers]
    for a, b in zip(model.get_weights(), copy.get_weights()):
        np.testing.assert_array_equal(a, b)
    # The float32 copy computes what a float32 model with these weights does.
    reference = _tiny()
    reference.set_weights(model.get_weights())
    src = np.array([[5, 6, 7, 3, 0, 0], [9, 3, 0, 0, 0, 0]], "int32")
    tgt = np.array([[2, 11, 12, 13], [2, 14, 0, 0]], "int32")
    inputs = {"encoder_inputs": src, "decoder_inputs": tgt}
    want = keras.ops.convert_to_numpy(reference(inputs))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(copy(inputs)), want)
    # And the bfloat16 model differs from it (the test can see a policy).
    out = keras.ops.convert_to_numpy(keras.ops.cast(model(inputs), "float32"))
    assert not np.array_equal(out, want)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="Translator needs tensorflow")
def test_translator_decodes_a_mixed_precision_model_in_float32():
    from keras_transformer.tokenizers import train_subword_tokenizer
    from keras_transformer.translator import Translator

    sentences = ["a dog runs", "the cat sleeps", "a bird sings", "dogs run fast"] * 5
    src_tok = train_subword_tokenizer(sentences, vocab_size=30)
    tgt_tok = train_subword_tokenizer(sentences, vocab_size=30)

    def build(dtype=None):
        return build_transformer(
            src_tok.vocab_size, tgt_tok.vocab_size, num_layers=1, d_model=32, num_heads=2,
            dff=64, dropout_rate=0.0, sequence_length=12, dtype=dtype,
        )

    keras.utils.set_random_seed(3)
    mixed = build("mixed_bfloat16")
    reference = build()
    reference.set_weights(mixed.get_weights())
    translator = Translator(mixed, src_tok, tgt_tok, beam_size=2)
    assert compute_dtype(translator.model) == "float32"
    assert translator.model is not mixed
    expected = Translator(reference, src_tok, tgt_tok, beam_size=2)
    ids = np.array([[4, 5, 6, 3], [7, 3, 0, 0]], "int32")
    got, want = translator.serve_ids(ids), expected.serve_ids(ids)
    np.testing.assert_array_equal(got["target_ids"].numpy(), want["target_ids"].numpy())
    np.testing.assert_allclose(got["score"].numpy(), want["score"].numpy(), rtol=1e-6)
    # A float32 model is used as it is.
    assert expected.model is reference


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="train's CLI runs tensorflow")
def test_train_records_and_uses_the_precision(tmp_path):
    from keras_transformer.data.synthetic import write_synthetic_corpus
    from keras_transformer.training import TrainingConfig
    from keras_transformer.training import load_run
    from keras_transformer.training import train

    data = tmp_path / "data"
    write_synthetic_corpus(str(data), n_train=120, n_val=12, seed=5)
    run = tmp_path / "run"
    config = dict(
        train_src=str(data / "train.en"), train_tgt=str(data / "train.de"),
        val_src=str(data / "val.en"), val_tgt=str(data / "val.de"), output_dir=str(run),
        preset="tiny", num_layers=1, sequence_length=24, src_vocab_size=120, tgt_vocab_size=140,
        tokens_per_batch=1024, warmup_steps=20, epochs=1,
    )
    with pytest.raises(ValueError, match="`precision` must be one of"):
        train(TrainingConfig(precision="bf16", **config), verbose=0)
    assert not run.exists()

    model, _, _ = train(TrainingConfig(precision="mixed_bfloat16", **config), verbose=0)
    assert compute_dtype(model) == "bfloat16"
    saved = json.loads((run / "config.json").read_text())
    assert saved["training"]["precision"] == "mixed_bfloat16"
    assert saved["model"]["dtype"] == "mixed_bfloat16"
    losses = [json.loads(line)["loss"] for line in (run / "epochs.jsonl").read_text().splitlines()]
    assert all(np.isfinite(losses))
    loaded, _, _, _ = load_run(str(run))
    assert compute_dtype(loaded) == "bfloat16"

    # The run resumes in float32 (the variables are float32 either way).
    model, _, _ = train(TrainingConfig(precision="float32", **dict(config, epochs=2)), verbose=0)
    assert compute_dtype(model) == "float32"
    epochs = [json.loads(line) for line in (run / "epochs.jsonl").read_text().splitlines()]
    assert [e["precision"] for e in epochs] == ["mixed_bfloat16", "float32"]
    # Each epoch records the machine it ran on (model cards report it).
    from keras_transformer.devices import host_description

    assert [e["hardware"] for e in epochs] == [host_description()] * 2
    assert json.loads((run / "config.json").read_text())["model"]["dtype"] == "float32"


@pytest.mark.parametrize("policy, scaled", [("mixed_float16", True), ("mixed_bfloat16", False), ("float32", False)])
def test_a_model_built_in_mixed_float16_gets_loss_scaling(policy, scaled, tmp_path):
    """`build_transformer(dtype="mixed_float16")` (and so `train --precision
    mixed_float16`) left the model's own policy at float32, and `compile`,
    which reads it, never wrapped the optimizer in a `LossScaleOptimizer`:
    float16 gradients went unscaled (a new-user trial). The model's policy is
    the layers' now, through a `.keras` round trip too."""
    from keras_transformer import MaskedSparseCategoricalCrossentropy

    model = _tiny(policy)
    assert model.dtype_policy.name == policy
    model.compile(keras.optimizers.Adam(1e-3), MaskedSparseCategoricalCrossentropy())
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer) == scaled
    src = np.array([[5, 6, 7, 3], [9, 3, 0, 0]], "int32")
    tgt = np.array([[2, 11, 12, 13], [2, 14, 0, 0]], "int32")
    history = model.fit({"encoder_inputs": src, "decoder_inputs": tgt}, np.roll(tgt, -1, axis=1), verbose=0)
    assert np.isfinite(history.history["loss"][0])
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert loaded.dtype_policy.name == policy
    assert isinstance(loaded.optimizer, keras.optimizers.LossScaleOptimizer) == scaled
