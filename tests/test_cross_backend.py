"""Models move between backends: trained on jax or torch, saved as .keras,
loaded on tensorflow, equal logits (C27), exported as a SavedModel."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from conftest import REPO
from conftest import jax_compiling_fast

if keras.backend.backend() != "tensorflow":
    pytest.skip("this test drives the other backends from tensorflow", allow_module_level=True)

TRAIN = r"""
import sys
import numpy as np, keras
from keras_transformer import build_transformer, MaskedSparseCategoricalCrossentropy
keras.utils.set_random_seed(0)
model = build_transformer(SRC, TGT, num_layers=1, d_model=16, num_heads=2, dff=32, sequence_length=10)
# XLA on jax (C27). On torch, jit_compile means torch.compile, whose guard
# code (torch 2.13) raises KeyError on the ragged last batch: train eagerly.
model.compile(optimizer="adam", loss=MaskedSparseCategoricalCrossentropy(),
              jit_compile=keras.backend.backend() == "jax")
rng = np.random.default_rng(0)
x = {"encoder_inputs": rng.integers(4, SRC, (3, 6)).astype("int32"),
     "decoder_inputs": rng.integers(4, TGT, (3, 5)).astype("int32")}
x["encoder_inputs"][1, 4:] = 0
model.fit(x, rng.integers(4, TGT, (3, 5)).astype("int32"), batch_size=2, epochs=1, verbose=0)
model.save(sys.argv[1])
np.save(sys.argv[2], keras.ops.convert_to_numpy(model(x)))
np.savez(sys.argv[3], **x)
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_c27_trained_elsewhere_loads_on_tensorflow_and_exports(backend, tmp_path):
    import tensorflow as tf

    from keras_transformer import Translator
    from keras_transformer.data.synthetic import make_synthetic_corpus
    from keras_transformer.export import export_translator
    from keras_transformer.tokenizers import train_subword_tokenizer

    en, de = make_synthetic_corpus(300, seed=4)
    src, tgt = train_subword_tokenizer(en, 120), train_subword_tokenizer(de, 140)
    script = TRAIN.replace("SRC", str(src.vocab_size)).replace("TGT", str(tgt.vocab_size))
    paths = [str(tmp_path / name) for name in ("model.keras", "logits.npy", "inputs.npz")]
    env = dict(os.environ, KERAS_BACKEND=backend)
    if backend == "jax":
        jax_compiling_fast(env)
    result = subprocess.run([sys.executable, "-c", script, *paths], env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    model = keras.saving.load_model(paths[0])
    inputs = dict(np.load(paths[2]))
    np.testing.assert_allclose(model(inputs).numpy(), np.load(paths[1]), atol=1e-4)
    translator = Translator(model, src, tgt, beam_size=2)
    path = export_translator(translator, str(tmp_path / "saved"))
    serve = tf.saved_model.load(path).signatures["serving_default"]
    out = serve(text=tf.constant(["A dog runs.", "The cat sleeps."]))["translation"]
    assert out.numpy().tolist() == translator(["A dog runs.", "The cat sleeps."]).numpy().tolist()
