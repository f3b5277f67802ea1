"""Every layer through the shared battery (`layer_battery.run_layer_test`):
symbolic and eager calls, config and `.keras` round trips with weights, a
`fit` step and mixed precision. Backend-neutral (`tests/test_backends.py`
re-runs it on jax and torch)."""

import numpy as np
import pytest

from layer_battery import run_layer_test
from keras_transformer.layers import Dropout
from keras_transformer.layers import FeedForward
from keras_transformer.layers import LayerNormalization
from keras_transformer.layers import MultiHeadAttention
from keras_transformer.layers import OutputProjection
from keras_transformer.layers import PositionalEmbedding
from keras_transformer.layers import TransformerDecoder
from keras_transformer.layers import TransformerEncoder

RNG = np.random.default_rng(0)
X = RNG.normal(size=(2, 5, 8)).astype("float32")
MEMORY = RNG.normal(size=(2, 4, 8)).astype("float32")
IDS = np.array([[5, 6, 7, 0, 0], [8, 9, 10, 11, 12]], "int32")
ALL = {"eager", "symbolic", "config", "keras_file", "fit", "mixed_float16", "mixed_bfloat16"}


def test_positional_embedding():
    shape, checks = run_layer_test(
        lambda **kw: PositionalEmbedding(vocab_size=30, d_model=8, sequence_length=6, **kw), [IDS], expect_mask=IDS != 0
    )
    assert shape == (2, 5, 8) and checks == ALL | {"mask"}


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder(norm_first):
    shape, checks = run_layer_test(lambda **kw: TransformerEncoder(num_heads=2, dff=16, dropout_rate=0.1,
        norm_first=norm_first, **kw), [X])
    assert shape == (2, 5, 8) and checks == ALL


def test_transformer_decoder():
    shape, checks = run_layer_test(lambda **kw: TransformerDecoder(num_heads=2, dff=16, dropout_rate=0.1, **kw), [X, MEMORY])
    assert shape == (2, 5, 8) and checks == ALL


def test_multi_head_attention():
    shape, checks = run_layer_test(lambda **kw: MultiHeadAttention(num_heads=2, key_dim=4, **kw), [X, MEMORY])
    assert shape == (2, 5, 8) and checks == ALL


def test_feed_forward():
    shape, checks = run_layer_test(lambda **kw: FeedForward(dff=16, activation_dropout_rate=0.1, **kw), [X])
    assert shape == (2, 5, 8) and checks == ALL


def test_layer_normalization():
    shape, checks = run_layer_test(lambda **kw: LayerNormalization(epsilon=1e-6, **kw), [X])
    assert shape == (2, 5, 8) and checks == ALL


def test_output_projection():
    shape, checks = run_layer_test(lambda **kw: OutputProjection(11, **kw), [X])
    assert shape == (2, 5, 11) and checks == ALL


def test_dropout():
    shape, checks = run_layer_test(lambda **kw: Dropout(0.3, **kw), [X])
    assert shape == (2, 5, 8) and checks == ALL - {"fit"}  # no weights to fit
