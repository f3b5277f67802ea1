"""Tests for keras_transformer.data.packing (C10)."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.data import pack_sequence
from keras_transformer.data import pack_source
from keras_transformer.data import pack_target

START, END, PAD = 2, 3, 0
T = list(range(11, 21))  # t1..t10
A, B = 41, 42


def test_c10_end_token_survives_truncation_and_shift():
    """C10: t1..t10 with max_length=6, and a 2-token target."""
    batch = tf.ragged.constant([T, [A, B]], dtype=tf.int32)
    packed = pack_sequence(batch, 6, start_id=START, end_id=END, pad_id=PAD)
    assert packed.numpy().tolist() == [
        [START, 11, 12, 13, 14, END],
        [START, A, B, END, PAD, PAD],
    ]
    dec, lab = pack_target(batch, 6, start_id=START, end_id=END, pad_id=PAD)
    assert dec.dtype == tf.int32 and lab.dtype == tf.int32
    assert dec.shape.as_list() == [2, 5] and lab.shape.as_list() == [2, 5]
    assert dec.numpy().tolist() == [
        [START, 11, 12, 13, 14],
        [START, A, B, PAD, PAD],
    ]
    assert lab.numpy().tolist() == [
        [11, 12, 13, 14, END],
        [A, B, END, PAD, PAD],
    ]
    dec, lab = dec.numpy(), lab.numpy()
    # The packed row is decoder_inputs' start + labels.
    np.testing.assert_array_equal(
        np.concatenate([dec[:, :1], lab], axis=1), packed.numpy()
    )
    assert ((lab == END).sum(axis=1) == 1).all()
    assert not (dec == END).any()
    # labels[i] == decoder_inputs[i + 1] wherever decoder_inputs[i + 1] is
    # not padding.
    real = dec[:, 1:] != PAD
    np.testing.assert_array_equal(lab[:, :-1][real], dec[:, 1:][real])
    assert real.sum() == 4 + 2


def test_pack_source_keeps_end_id():
    batch = tf.ragged.constant([T, [A, B], []], dtype=tf.int32)
    out = pack_source(batch, 6, end_id=END, pad_id=PAD)
    assert out.dtype == tf.int32 and out.shape.as_list() == [3, 6]
    assert out.numpy().tolist() == [
        [11, 12, 13, 14, 15, END],
        [A, B, END, PAD, PAD, PAD],
        [END, PAD, PAD, PAD, PAD, PAD],
    ]


def test_pad_to_longest_in_batch():
    batch = tf.ragged.constant([[A, B], [A]], dtype=tf.int32)
    src = pack_source(
        batch, 64, end_id=END, pad_id=PAD, pad_to_max_length=False
    )
    assert src.numpy().tolist() == [[A, B, END], [A, END, PAD]]
    dec, lab = pack_target(
        batch,
        64,
        start_id=START,
        end_id=END,
        pad_id=PAD,
        pad_to_max_length=False,
    )
    assert dec.numpy().tolist() == [[START, A, B], [START, A, PAD]]
    assert lab.numpy().tolist() == [[A, B, END], [A, END, PAD]]
    # Truncation still applies when padding to the longest row.
    dec, lab = pack_target(
        [T], 4, start_id=START, end_id=END, pad_id=PAD, pad_to_max_length=False
    )
    assert lab.numpy().tolist() == [[11, 12, END]]


def test_single_sequence_and_python_lists():
    dec, lab = pack_target(
        tf.constant(T, tf.int64), 6, start_id=START, end_id=END, pad_id=PAD
    )
    assert dec.numpy().tolist() == [START, 11, 12, 13, 14]
    assert lab.numpy().tolist() == [11, 12, 13, 14, END]
    assert lab.dtype == tf.int32
    src = pack_source([A, B], 3, end_id=END, pad_id=PAD)
    assert src.numpy().tolist() == [A, B, END]
    src = pack_source([[A, B, A, B], [A]], 3, end_id=END, pad_id=PAD)
    assert src.numpy().tolist() == [[A, B, END], [A, END, PAD]]
    empty = pack_source([], 5, end_id=END, pad_id=PAD)
    assert empty.shape.as_list() == [0, 5]


def test_inside_tf_function_and_tf_data():
    @tf.function(
        input_signature=[tf.RaggedTensorSpec([None, None], tf.int32, 1)]
    )
    def pack(ids):
        return pack_target(ids, 6, start_id=START, end_id=END, pad_id=PAD)

    dec, lab = pack(tf.ragged.constant([T, [A]], dtype=tf.int32))
    assert lab.shape.as_list() == [2, 5]
    assert lab.numpy().tolist() == [[11, 12, 13, 14, END], [A, END, 0, 0, 0]]

    rows = tf.ragged.constant([T, [A, B]], dtype=tf.int32)
    ds = tf.data.Dataset.from_tensor_slices(rows).map(
        lambda t: pack_target(
            t,
            6,
            start_id=START,
            end_id=END,
            pad_id=PAD,
            pad_to_max_length=False,
        )
    )
    got = [(d.numpy().tolist(), y.numpy().tolist()) for d, y in ds]
    assert got == [
        ([START, 11, 12, 13, 14], [11, 12, 13, 14, END]),
        ([START, A, B], [A, B, END]),
    ]


def test_invalid_arguments():
    with pytest.raises(ValueError, match="max_length"):
        pack_target([[A]], 1, start_id=START, end_id=END, pad_id=PAD)
    with pytest.raises(ValueError, match="max_length"):
        pack_source([[A]], 0, end_id=END, pad_id=PAD)
    with pytest.raises(ValueError, match="integers"):
        pack_source(tf.constant([1.5]), 4, end_id=END, pad_id=PAD)
