"""Padding-aware cross-entropy with label smoothing for sequence targets."""

import keras
import numpy as np
from keras import ops

from keras_transformer.layers.id_range import check_integer_ids
from keras_transformer.layers.id_range import check_label_ids
from keras_transformer.validation import check_bool


def _check_args(pad_id, label_smoothing):
    if isinstance(pad_id, (bool, np.bool_)) or not isinstance(pad_id, (int, np.integer)):
        raise ValueError(
            f"`pad_id` must be an int token id. Received: pad_id={pad_id!r}."
        )
    if not 0.0 <= float(label_smoothing) < 1.0:
        raise ValueError(
            "`label_smoothing` must be in [0, 1) (the paper uses 0.1). "
            f"Received: label_smoothing={label_smoothing!r}."
        )


def check_label_shape(y_true, reference, axes=2, reference_name="predictions"):
    """`y_true`, once its first `axes` axes are checked to equal
    `reference`'s: the labels `(batch, T)` against the predictions `(batch,
    T, vocab)` or the decoder inputs `(batch, T)` they are shifted from.

    Args:
        y_true: int tensor or NumPy array, the labels.
        reference: tensor or array whose leading axes the labels must have.
        axes: int, how many leading axes to compare.
        reference_name: what `reference` is, for the message.

    Returns:
        `y_true` (in a TensorFlow graph of unknown shape, with the check as a
        control dependency).

    Raises:
        ValueError: when the shapes are known here and differ.
        tf.errors.InvalidArgumentError: (tensorflow graph, shapes unknown
            until run time) the same, at run time.
    """
    message = (
        f"Labels and {reference_name} differ in shape: labels {{}} against {reference_name} {{}}{{}}. "
        "The labels are the decoder inputs shifted by one, so both must have the "
        "same `(batch, T)`."
    )
    known = True
    for axis in range(axes):
        labels, logits = y_true.shape[axis], reference.shape[axis]
        if labels is not None and logits is not None and labels != logits:
            raise ValueError(message.format(
                tuple(y_true.shape), tuple(reference.shape), f" (axis {axis})"))
        known = known and labels is not None and logits is not None
    if known or keras.backend.backend() != "tensorflow":
        return y_true
    import tensorflow as tf

    check = tf.debugging.assert_equal(
        tf.shape(y_true)[:axes], tf.shape(reference)[:axes],
        message=(f"Labels and {reference_name} differ in shape: their leading axes follow, "
                 "labels first. The labels are the decoder inputs shifted by one, so both "
                 "must have the same `(batch, T)`."),
    )
    with tf.control_dependencies([check]):
        return tf.identity(y_true)


def _align_ranks(y_true, y_pred):
    """Accepts labels `(batch, T)` or `(batch, T, 1)` for `(batch, T, V)`."""
    true_rank, pred_rank = len(y_true.shape), len(y_pred.shape)
    if true_rank == pred_rank and y_true.shape[-1] == 1:
        y_true = ops.squeeze(y_true, axis=-1)
        true_rank -= 1
    if true_rank != pred_rank - 1:
        raise ValueError(
            "Expected integer labels of shape `(batch, T)` and predictions "
            "of shape `(batch, T, vocab)` (labels one rank lower than "
            f"predictions). Received: y_true.shape={tuple(y_true.shape)}, "
            f"y_pred.shape={tuple(y_pred.shape)}."
        )
    y_true = check_label_shape(y_true, y_pred, true_rank)
    return y_true


def per_token_loss(
    y_true, y_pred, *, pad_id=0, label_smoothing=0.0, from_logits=True
):
    """Per-token smoothed cross-entropy and the real-token mask.

    The smoothed target distribution is `(1 - eps) * onehot + eps / V`, so
    the cross-entropy against it is `(1 - eps) * nll(target) + eps *
    mean_v(-log p_v)`. From logits, it is the backend's softmax
    cross-entropy, whose gradient is `softmax - target`. All arithmetic is
    in float32, whatever the dtype of `y_pred`.

    Args:
        y_true: int tensor `(batch, T)` (or `(batch, T, 1)`), target ids.
        y_pred: float tensor `(batch, T, vocab)`, logits (or probabilities
            when `from_logits=False`), any float dtype.
        pad_id: int. Target id that marks padding.
        label_smoothing: float in [0, 1). The paper's epsilon_ls.
        from_logits: bool. Whether `y_pred` holds logits.

    Returns:
        A tuple `(losses, mask)`: `losses` is float32 `(batch, T)` with 0 at
        padding, and `mask` is bool `(batch, T)`, True at real tokens.
    """
    check_integer_ids(y_true, "The labels (`y_true`)",
                      fix="Give int32 target ids (for `model.compile`, pass the loss class, "
                          "`MaskedSparseCategoricalCrossentropy()`: Keras casts the labels of a loss "
                          "function to the predictions' float dtype)")
    y_pred = ops.cast(ops.convert_to_tensor(y_pred), "float32")
    y_true = _align_ranks(ops.convert_to_tensor(y_true), y_pred)
    y_true = ops.cast(y_true, "int32")
    mask = ops.not_equal(y_true, pad_id)
    # Pad positions may hold an id outside the vocabulary (e.g. -1): gather
    # a valid index there and zero the result afterwards.
    if isinstance(y_pred.shape[-1], int):
        safe_ids = check_label_ids(y_true, y_pred.shape[-1], pad_id)
    else:
        safe_ids = ops.where(mask, y_true, ops.zeros_like(y_true))
    vocab = y_pred.shape[-1] or ops.shape(y_pred)[-1]
    if from_logits:
        if label_smoothing:
            eps = float(label_smoothing)
            target = ops.one_hot(safe_ids, vocab, dtype="float32")
            target = target * (1.0 - eps) + eps / vocab
            losses = ops.categorical_crossentropy(target, y_pred, from_logits=True)
        else:
            losses = ops.sparse_categorical_crossentropy(
                safe_ids, y_pred, from_logits=True
            )
    else:
        probs = y_pred / ops.sum(y_pred, axis=-1, keepdims=True)
        epsilon = keras.backend.epsilon()
        log_probs = ops.log(ops.clip(probs, epsilon, 1.0 - epsilon))
        target_log_prob = ops.take_along_axis(
            log_probs, ops.expand_dims(safe_ids, axis=-1), axis=-1
        )
        losses = -ops.squeeze(target_log_prob, axis=-1)
        if label_smoothing:
            eps = float(label_smoothing)
            uniform = -ops.mean(log_probs, axis=-1)
            losses = (1.0 - eps) * losses + eps * uniform
    losses = ops.where(mask, losses, ops.zeros_like(losses))
    return losses, mask


def masked_loss(
    y_true, y_pred, *, pad_id=0, label_smoothing=0.0, from_logits=True
):
    """Token-weighted mean cross-entropy over real (non-padding) targets.

    Sums the per-token (optionally label-smoothed) cross-entropy over the
    positions whose label is not `pad_id` and divides by their number, so the
    value does not depend on how much padding a batch carries, and a batch
    made only of padding gives 0 (not NaN). Label smoothing follows the paper
    (section 5.4, epsilon_ls = 0.1): the target distribution is
    `(1 - eps) * onehot + eps / vocab`. Computed in float32 even for
    float16/bfloat16 logits.

    For `model.compile`, use `MaskedSparseCategoricalCrossentropy`: it
    reports the same number through Keras's loss reduction.

    Args:
        y_true: int tensor `(batch, T)` (or `(batch, T, 1)`), target ids.
        y_pred: float tensor `(batch, T, vocab)`, logits (or probabilities
            when `from_logits=False`).
        pad_id: int. Label id that marks padding. Defaults to 0.
        label_smoothing: float in [0, 1). Defaults to 0.0.
        from_logits: bool. Whether `y_pred` holds logits. Defaults to True.

    Returns:
        A scalar float32 tensor: `sum(loss * mask) / max(sum(mask), 1)`.

    Raises:
        ValueError: if `label_smoothing` is outside [0, 1), `pad_id` is not
            an int, or the ranks of `y_true` and `y_pred` do not match.
        TypeError: if `y_true` is not integer ids (float labels would be cut
            to integers).

    Example:

    ```python
    y_true = np.array([[2, 0]])
    logits = np.array([[[0.0, 0.0, 2.0, 0.0], [1.0, 0.0, 0.0, 0.0]]])
    float(masked_loss(y_true, logits))  # 0.340753
    float(masked_loss(y_true, logits, label_smoothing=0.1))  # 0.490753
    ```

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762),
          section 5.4 "Regularization" (label smoothing).
    """
    _check_args(pad_id, label_smoothing)
    losses, mask = per_token_loss(
        y_true,
        y_pred,
        pad_id=pad_id,
        label_smoothing=label_smoothing,
        from_logits=from_logits,
    )
    count = ops.sum(ops.cast(mask, "float32"))
    return ops.sum(losses) / ops.maximum(count, 1.0)


def per_token_weight(weight, losses):
    """A sample weight `(batch,)`, `(batch, T)` or `(batch, T, 1)` as
    `(batch, 1)` or `(batch, T)`, to multiply `losses` `(batch, T)`; a
    scalar as it is. Written without the rank, which a traced function may
    not know (one `fit` with `(batch, T)` weights, then one with `(batch,)`).

    Raises:
        ValueError: where the shapes are known (eagerly, and under jax
            always) and the weight has another number of rows than
            `losses`, another rank, or a second size neither 1 nor T:
            broadcasting would weigh the wrong tokens without an error.
    """
    # A TensorShape has `rank` (None when unknown); other backends, tuples.
    rank = weight.shape.rank if hasattr(weight.shape, "rank") else len(weight.shape)
    if rank == 0:
        return weight
    if rank is not None:
        _check_weight_shape(tuple(weight.shape), tuple(losses.shape))
    if rank is None and keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.reshape(weight, tf.stack([tf.shape(weight)[0], -1]))
    return ops.reshape(weight, (ops.shape(weight)[0], -1))


def _check_weight_shape(weight_shape, losses_shape):
    """`per_token_weight`'s check of the static sizes (None: unknown)."""
    batch, length = losses_shape
    rows = "batch" if batch is None else batch
    expected = f"({rows},), or one a token, ({rows}, {'T' if length is None else length})"
    if len(weight_shape) == 3 and weight_shape[2] not in (1, None):
        wrong = "a third size other than 1"
    elif len(weight_shape) > 3:
        wrong = f"rank {len(weight_shape)}"
    elif None not in (weight_shape[0], batch) and weight_shape[0] != batch:
        wrong = f"{weight_shape[0]} rows for {batch} sentences"
    elif (len(weight_shape) > 1 and None not in (weight_shape[1], length)
          and weight_shape[1] not in (1, length)):
        wrong = f"{weight_shape[1]} columns for {length} target tokens"
    else:
        return
    raise ValueError(
        f"`sample_weight` has shape {weight_shape}, {wrong}: give one weight a sentence, "
        f"{expected}, or a scalar."
    )


_REDUCTIONS = ("sum_over_batch_size", "mean", "sum", None, "none")


def _scale_for_distribution(loss):
    """Divides by the replica count under a TF distribution strategy.

    Keras's own losses do this for mean reductions and the TF trainer undoes
    it for the reported value (`unscale_loss_for_distribution`), so a loss
    that owns its reduction must do it too. A no-op on JAX, PyTorch and a
    single TF device.
    """
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if replicas > 1:
            loss = loss * (1.0 / replicas)
    return loss


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedSparseCategoricalCrossentropy(keras.losses.Loss):
    """Sparse cross-entropy with label smoothing that ignores padding.

    The loss to pass to `model.compile` for sequence targets: `fit` and
    `evaluate` report, for each batch, the mean over real target tokens of
    the (smoothed) cross-entropy, exactly `masked_loss`, whatever the
    padding; an all-padding batch gives 0. Label smoothing follows the paper
    (section 5.4, epsilon_ls = 0.1) with sparse integer targets. Computed in
    float32 even under a mixed-precision policy.

    The class owns its reduction (it overrides `__call__`): Keras's default
    `"sum_over_batch_size"` divides by `batch * T`, padding included. The
    padding is read from the labels only; a Keras mask carried by `y_pred`
    (a model whose embedding has `mask_zero=True`) is ignored, because
    `keras.losses.Loss.__call__` would rescale the mean by it a second time.
    A `sample_weight` of shape `(batch,)` or `(batch, T)` multiplies the
    per-token losses; the divisor stays the number of real tokens.

    Args:
        pad_id: int. Label id that marks padding. Defaults to 0.
        label_smoothing: float in [0, 1). Defaults to 0.1, the paper's value.
        from_logits: bool. Whether predictions are logits. Defaults to True.
        reduction: `"sum_over_batch_size"` (or `"mean"`, the same here): the
            mean over real tokens, the default; `"sum"`: their sum; `None`
            (or `"none"`): the per-token losses, 0 at padding.
        name: string. Name of the loss.

    Call arguments:
        y_true: int tensor `(batch, T)`, target ids (`pad_id` at padding).
        y_pred: float tensor `(batch, T, vocab)`, logits (probabilities when
            `from_logits=False`), any float dtype.
        sample_weight: optional float tensor `(batch,)` or `(batch, T)`.

    Returns:
        A scalar float32 tensor, or float32 `(batch, T)` when `reduction` is
        `None`.

    Raises:
        ValueError: if `label_smoothing` is outside [0, 1), `pad_id` is not
            an int, `reduction` is not one of the values above, or the ranks
            of `y_true` and `y_pred` do not match.
        TypeError: (when called) if `y_true` is not integer ids.

    Example:

    ```python
    model.compile(
        optimizer=keras.optimizers.Adam(WarmupSchedule(d_model=512)),
        loss=MaskedSparseCategoricalCrossentropy(pad_id=0,
                                                 label_smoothing=0.1),
        metrics=[MaskedAccuracy(pad_id=0)],
    )
    ```

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762),
          section 5.4 "Regularization" (label smoothing).
    """

    def __init__(
        self,
        pad_id=0,
        label_smoothing=0.1,
        from_logits=True,
        reduction="sum_over_batch_size",
        name="masked_sparse_categorical_crossentropy",
    ):
        _check_args(pad_id, label_smoothing)
        if reduction not in _REDUCTIONS:
            raise ValueError(
                f"`reduction` must be one of {_REDUCTIONS}. Received: "
                f"reduction={reduction!r}."
            )
        # float32 whatever the global policy: the loss of a mixed-precision
        # model must not be computed in float16.
        super().__init__(name=name, reduction=reduction, dtype="float32")
        self.pad_id = int(pad_id)
        self.label_smoothing = label_smoothing
        self.from_logits = check_bool(from_logits, "from_logits")  # "False" is truthy

    def call(self, y_true, y_pred):
        """Per-token losses `(batch, T)`, float32, 0 at padding."""
        losses, _ = per_token_loss(
            y_true,
            y_pred,
            pad_id=self.pad_id,
            label_smoothing=self.label_smoothing,
            from_logits=self.from_logits,
        )
        return losses

    def __call__(self, y_true, y_pred, sample_weight=None):
        with keras.name_scope(self.name):
            losses, mask = per_token_loss(
                y_true,
                y_pred,
                pad_id=self.pad_id,
                label_smoothing=self.label_smoothing,
                from_logits=self.from_logits,
            )
            if sample_weight is not None:
                weight = ops.cast(
                    ops.convert_to_tensor(sample_weight), "float32"
                )
                losses = losses * per_token_weight(weight, losses)
            if self.reduction in (None, "none"):
                return losses
            total = ops.sum(losses)
            if self.reduction == "sum":
                return total
            count = ops.sum(ops.cast(mask, "float32"))
            return _scale_for_distribution(total / ops.maximum(count, 1.0))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "pad_id": self.pad_id,
                "label_smoothing": self.label_smoothing,
                "from_logits": self.from_logits,
            }
        )
        return config
