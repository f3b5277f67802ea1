"""Token-level accuracy that ignores padding."""

import keras
import numpy as np
from keras import ops

from keras_transformer.layers.id_range import check_integer_ids
from keras_transformer.losses import check_label_shape
from keras_transformer.losses import per_token_weight


def _check_pad_id(pad_id):
    if isinstance(pad_id, (bool, np.bool_)) or not isinstance(pad_id, (int, np.integer)):
        raise ValueError(
            f"`pad_id` must be an int token id. Received: pad_id={pad_id!r}."
        )


def _correct_and_mask(y_true, y_pred, pad_id):
    """Float32 `(batch, T)` hits and real-token mask. `y_pred` is float
    scores `(batch, T, vocab)` or int predicted ids `(batch, T)`."""
    check_integer_ids(y_true, "The labels (`y_true`)", fix="Give int32 target ids")
    y_pred = ops.convert_to_tensor(y_pred)
    y_true = ops.convert_to_tensor(y_true)
    ids_given = "int" in keras.backend.standardize_dtype(y_pred.dtype)
    expected = len(y_pred.shape) - (0 if ids_given else 1)
    if len(y_true.shape) == expected + 1 and y_true.shape[-1] == 1:
        y_true = ops.squeeze(y_true, axis=-1)
    if len(y_true.shape) != expected:
        raise ValueError(
            "Expected integer labels of shape `(batch, T)` and predictions "
            "of shape `(batch, T, vocab)` (scores: labels one rank lower than "
            f"predictions) or `(batch, T)` (predicted ids). Received: y_true.shape={tuple(y_true.shape)}, "
            f"y_pred.shape={tuple(y_pred.shape)}."
        )
    # A (batch, 1) label against (batch, T, vocab) broadcast into an
    # accuracy above 1 without this; (batch, T') failed inside the backend.
    y_true = ops.cast(check_label_shape(y_true, y_pred, axes=2), "int32")
    if ids_given:
        predicted = ops.cast(y_pred, "int32")
    else:
        predicted = ops.cast(ops.argmax(y_pred, axis=-1), "int32")
    mask = ops.cast(ops.not_equal(y_true, pad_id), "float32")
    correct = ops.cast(ops.equal(y_true, predicted), "float32") * mask
    return correct, mask


@keras.saving.register_keras_serializable(package="keras_transformer")
def masked_accuracy(y_true, y_pred, *, pad_id=0):
    """Fraction of real (non-padding) target tokens predicted correctly.

    Compares `argmax(y_pred, -1)` with `y_true` at the positions whose label
    is not `pad_id` only, so padding (easy to predict) does not inflate the
    score. A batch made only of padding gives 0 (not NaN). For
    `model.compile`, use the stateful `MaskedAccuracy`, which weights batches
    by their number of real tokens.

    Args:
        y_true: int tensor `(batch, T)` (or `(batch, T, 1)`), target ids.
        y_pred: float tensor `(batch, T, vocab)`, logits or probabilities,
            or int tensor `(batch, T)`, the predicted ids.
        pad_id: int. Label id that marks padding. Defaults to 0.

    Returns:
        A scalar float32 tensor: `correct_real_tokens / max(real_tokens, 1)`.

    Raises:
        ValueError: if `pad_id` is not an int, or the ranks of `y_true` and
            `y_pred` or their `(batch, T)` do not match.
        TypeError: if `y_true` is not integer ids.

    Example:

    ```python
    y_true = np.array([[5, 6, 0, 0]])
    y_pred = keras.ops.one_hot(np.array([[5, 9, 0, 0]]), 10)
    float(masked_accuracy(y_true, y_pred))  # 0.5, not 0.75
    ```
    """
    _check_pad_id(pad_id)
    correct, mask = _correct_and_mask(y_true, y_pred, pad_id)
    return ops.sum(correct) / ops.maximum(ops.sum(mask), 1.0)


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedAccuracy(keras.metrics.Metric):
    """Token-level accuracy over real targets, accumulated across batches.

    Keeps two running totals, the correctly predicted real tokens and the
    real tokens (labels different from `pad_id`), so `model.evaluate` and
    the `fit` logs report the token-level accuracy over all the batches seen,
    not a mean of per-batch accuracies. Padding positions, and rows made only
    of padding, contribute nothing; the result is 0 before any real token is
    counted. The padding is read from the labels; a Keras mask carried by
    `y_pred` is not used.

    Args:
        pad_id: int. Label id that marks padding. Defaults to 0.
        name: string. Name of the metric.
        dtype: dtype of the result and of the running totals. Defaults to
            "float32" (exact counts up to 2**24 tokens; beyond, rounding is
            relative 1e-7 or less).

    Call arguments (`update_state`):
        y_true: int tensor `(batch, T)`, target ids (`pad_id` at padding).
        y_pred: float tensor `(batch, T, vocab)`, logits or probabilities,
            or int tensor `(batch, T)`, the predicted ids.
        sample_weight: optional float tensor `(batch,)` or `(batch, T)`;
            weighs both the hits and the token count.

    Returns:
        `result()`: a scalar float32 tensor, `correct / max(count, 1)`.

    Raises:
        ValueError: if `pad_id` is not an int, `dtype` is not float32 or
            float64, or the ranks of `y_true` and `y_pred` or their
            `(batch, T)` do not match.
        TypeError: if `y_true` is not integer ids.

    Example:

    ```python
    metric = MaskedAccuracy(pad_id=0)
    metric.update_state(np.array([[5, 6, 0, 0]]),
                        keras.ops.one_hot(np.array([[5, 9, 0, 0]]), 10))
    float(metric.result())  # 0.5
    ```
    """

    def __init__(self, pad_id=0, name="masked_accuracy", dtype="float32"):
        _check_pad_id(pad_id)
        super().__init__(name=name, dtype=dtype)
        if self.dtype not in ("float32", "float64"):
            # int32 rounded 0.5 to 0; float16 stops counting at 2,048 tokens.
            raise ValueError(
                f"MaskedAccuracy counts tokens in its `dtype`, float32 or float64; got {self.dtype}. "
                "Leave dtype at its default: the model's precision does not change it."
            )
        self.pad_id = int(pad_id)
        self.correct = self.add_variable(
            shape=(), initializer="zeros", dtype=self.dtype, name="correct"
        )
        self.count = self.add_variable(
            shape=(), initializer="zeros", dtype=self.dtype, name="count"
        )

    def update_state(self, y_true, y_pred, sample_weight=None):
        correct, mask = _correct_and_mask(y_true, y_pred, self.pad_id)
        if sample_weight is not None:
            weight = ops.cast(ops.convert_to_tensor(sample_weight), "float32")
            weight = per_token_weight(weight, correct)
            correct = correct * weight
            mask = mask * weight
        self.correct.assign_add(ops.cast(ops.sum(correct), self.dtype))
        self.count.assign_add(ops.cast(ops.sum(mask), self.dtype))

    def result(self):
        return ops.cast(
            ops.divide_no_nan(self.correct, self.count), self.dtype
        )

    def get_config(self):
        config = super().get_config()
        config["pad_id"] = self.pad_id
        return config
