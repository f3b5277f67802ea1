"""The TensorFlow training fast path, attached to a model in one place.

The layers, losses and metrics of this package are plain Keras: one
`keras.ops` implementation each, on every backend. This subpackage is a
second way to run one training step of a `build_transformer` model on
TensorFlow, faster on a CPU, computing the same loss and gradients:

- `forward.TrainingForward`: the forward pass on the real tokens only
  (`unpadding`), attention alone on the padded layout;
- `ops`: its element-wise steps (dropout, LayerNorm, the residual
  connection, the attention weights, the label-smoothed cross-entropy), as
  the fused CPU kernels of `kernels` where they are built, else TensorFlow
  ops with hand-written gradients;
- `kernels`: the fused kernels (`fused_ops.cc`), built by an explicit,
  cached step (`keras-transformer build-kernels`, or `kernels.build()`).

`attach(model, ...)` gives a compiled model this `train_step`; `train`
attaches it where it applies and prints which path it takes, and user code
can do the same before `model.fit`:

```python
model.compile(optimizer, MaskedSparseCategoricalCrossentropy(label_smoothing=0.1),
              metrics=[MaskedAccuracy()])
fast_path.attach(model, label_smoothing=0.1)
model.fit(dataset)
```

Evaluation, prediction and saving are the model's own: the fast path
changes only how `fit` takes a step.
"""

import math

import keras

from keras_transformer.devices import in_xla_context
from keras_transformer.fast_path import kernels
from keras_transformer.fast_path.forward import TrainingForward
from keras_transformer.fast_path.ops import cross_entropy
from keras_transformer.layers.id_range import check_integer_ids
from keras_transformer.layers.id_range import check_label_ids


def applies(model, jit_compile=False):
    """Why the fast path cannot run for this model here, or None.

    It runs on the tensorflow backend, outside XLA (`jit_compile=False`:
    its tensors have data-dependent shapes), for a `build_transformer`
    model.

    Returns:
        None when it applies, else a one-line reason.
    """
    if keras.backend.backend() != "tensorflow":
        return f"the fast path is TensorFlow's; this process runs {keras.backend.backend()!r}"
    if jit_compile is True or in_xla_context():
        return "the fast path runs outside XLA (jit_compile=False)"
    try:
        TrainingForward(model)
    except ValueError as error:
        return str(error)
    if any(getattr(layer, "quantized", False) is True for layer in model._flatten_layers()):
        return "its attention is Keras-quantized, and the fast path reads float kernels"
    return None


def describe(jit_compile=False):
    """One line: the training path `train` takes on this machine, building
    the fused kernels (cached) where they can run."""
    backend = keras.backend.backend()
    if backend != "tensorflow":
        return f"{backend} ops (the fast path and its fused kernels are TensorFlow's)"
    if jit_compile is True:
        return "XLA (--jit-compile; the fast path runs outside XLA only)"
    if kernels.has_accelerator():
        return "fast path with TensorFlow ops (the fused kernels are CPU ops; TensorFlow sees an accelerator)"
    built = kernels.build()
    if built.available:
        return f"fast path with fused CPU kernels ({built.path})"
    return f"fast path with TensorFlow ops, slower: fused CPU kernels {built.reason}"


def loss_and_predictions(forward, x, y, pad_id=0, label_smoothing=0.0):
    """The masked label-smoothed loss of a batch and the predicted ids.

    The value of `MaskedSparseCategoricalCrossentropy(pad_id,
    label_smoothing)` on the model's training-mode logits: the mean over
    real labels (not `pad_id`) of the smoothed cross-entropy. A real label
    over a padded decoder input costs `log(vocab_size)`, as its logits are 0.

    Args:
        forward: a `TrainingForward`.
        x: dict with `"encoder_inputs"` and `"decoder_inputs"`.
        y: int `(batch, target_length)` labels.

    Returns:
        `(loss scalar float32, predicted int32 (batch, target_length))`,
        the predictions 0 at padded decoder inputs.

    Raises:
        ValueError / InvalidArgumentError: for labels outside the vocabulary.
        TypeError: for labels or ids that are not integers.
    """
    check_integer_ids(y, "The labels (`y_true`)", fix="Give int32 target ids")
    logits, unpadding = forward(x["encoder_inputs"], x["decoder_inputs"])
    vocab = logits.shape[-1]
    y = keras.ops.cast(keras.ops.convert_to_tensor(y), "int32")
    if len(y.shape) == 3:
        y = keras.ops.squeeze(y, axis=-1)
    real = keras.ops.not_equal(y, pad_id)
    safe = check_label_ids(y, vocab, pad_id)
    # The labels of the real decoder inputs, in the logits' row order.
    labels = keras.ops.take(keras.ops.reshape(safe, (-1,)), unpadding.indices)
    counted = keras.ops.cast(
        keras.ops.take(keras.ops.reshape(real, (-1,)), unpadding.indices), "float32")
    losses, argmax = cross_entropy(labels, logits, label_smoothing)
    total = keras.ops.sum(keras.ops.cast(real, "float32"))
    # Real labels over padded decoder inputs: logits 0, cross-entropy log V.
    uncovered = total - keras.ops.sum(counted)
    loss = (keras.ops.sum(losses * counted) + uncovered * math.log(vocab)) / keras.ops.maximum(total, 1.0)
    return loss, unpadding.pad(argmax)


def _loss_settings(model, pad_id, label_smoothing):
    """`(pad_id, label_smoothing)` of the compiled loss, which must be the
    one the fast step computes, so that `fit` and `evaluate` report the same
    quantity."""
    from keras_transformer.losses import MaskedSparseCategoricalCrossentropy

    if getattr(model, "optimizer", None) is None:
        raise ValueError("The training fast path attaches to a compiled model: call "
                         "model.compile(optimizer, MaskedSparseCategoricalCrossentropy(...)) first.")
    loss = getattr(model, "loss", None)
    if not isinstance(loss, MaskedSparseCategoricalCrossentropy) or not loss.from_logits:
        raise ValueError(
            "The training fast path computes MaskedSparseCategoricalCrossentropy from logits; "
            f"this model is compiled with {loss!r}. Compile it with "
            "MaskedSparseCategoricalCrossentropy(label_smoothing=...), or train without the fast path.")
    # The fast step computes the mean over real tokens, unweighted: another
    # reduction or `compile(loss_weights=...)` trained on another quantity
    # than `fit` and `evaluate` would then report.
    if loss.reduction not in ("sum_over_batch_size", "mean"):
        raise ValueError(
            f"The training fast path computes the loss's mean over real tokens; this model's loss has "
            f"reduction={loss.reduction!r}. Compile it with the default reduction, or train without "
            "the fast path.")
    weights = getattr(getattr(model, "_compile_loss", None), "_user_loss_weights", None)
    if weights is not None and keras.tree.flatten(weights) != [1.0]:
        raise ValueError(
            f"The training fast path computes the unweighted loss; this model is compiled with "
            f"loss_weights={weights!r}. Compile it without loss_weights (scale the learning rate "
            "instead), or train without the fast path.")
    if pad_id is None:
        pad_id = loss.pad_id
    if label_smoothing is None:
        label_smoothing = loss.label_smoothing
    return int(pad_id), float(label_smoothing)


def _metrics_needing_logits(model):
    """Names of the compiled metrics that cannot take predicted ids.

    The fast step has the logits of the real decoder inputs only, so it
    gives the compiled metrics `(batch, T)` predicted ids; `MaskedAccuracy`
    and `masked_accuracy` take them, other metrics (Keras's `"accuracy"`,
    cross-entropies, top-k) need `(batch, T, vocab)` scores.
    """
    from keras_transformer.metrics import MaskedAccuracy, masked_accuracy

    compiled = getattr(model, "_compile_metrics", None)
    if compiled is None:
        return []
    given = [getattr(compiled, name, None) for name in ("_user_metrics", "_user_weighted_metrics")]
    names = []
    for metric in keras.tree.flatten([m for m in given if m]):
        if metric is None or isinstance(metric, MaskedAccuracy) or metric is masked_accuracy:
            continue
        names.append(metric if isinstance(metric, str) else getattr(metric, "name", None)
                     or getattr(metric, "__name__", repr(metric)))
    return names


def _check_metrics(model):
    names = _metrics_needing_logits(model)
    if names:
        raise ValueError(
            "The training fast path gives the compiled metrics predicted ids, not logits "
            f"(it computes no logits at padded positions), and these metrics need logits: {names}. "
            "Compile with metrics=[MaskedAccuracy()] (token accuracy over real targets), or "
            "train without the fast path (do not attach it, or fast_path.detach(model)).")


def attach(model, pad_id=None, label_smoothing=None):
    """Give a compiled `build_transformer` model the fast `train_step`.

    The step computes the loss of `MaskedSparseCategoricalCrossentropy`
    with the model's training-mode forward pass (`TrainingForward`), takes
    its gradient, applies the optimizer (with loss scaling under
    `mixed_float16`), and updates the compiled metrics with the predicted
    ids (`MaskedAccuracy` takes them). Sample weights and models without
    the loss fall back to Keras's own step.

    Args:
        model: a compiled `build_transformer` model.
        pad_id: int, the labels' padding id; default the compiled loss's.
        label_smoothing: float, epsilon_ls; default the compiled loss's.

    Returns:
        `model`.

    Raises:
        ValueError: where the fast path does not apply (`applies`), for a
            model not compiled yet, compiled with another loss, or with
            metrics that need logits (anything but `MaskedAccuracy`); the
            step raises it too if the model is compiled again with them.
    """
    reason = applies(model)
    if reason:
        raise ValueError(f"The training fast path cannot be attached: {reason}.")
    import tensorflow as tf
    from keras.src.trainers.data_adapters import data_adapter_utils

    forward = TrainingForward(model)
    given = (pad_id, label_smoothing)
    _loss_settings(model, *given)
    _check_metrics(model)
    keras_step = type(model).train_step

    def train_step(data):
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        if sample_weight is not None or not isinstance(x, dict):
            return keras_step(model, data)
        # At trace time: the model may have been compiled again since
        # `attach` (another label smoothing, loss weights or metrics).
        _check_metrics(model)
        pad_id, label_smoothing = _loss_settings(model, *given)
        with tf.GradientTape() as tape:
            loss, predicted = loss_and_predictions(forward, x, y, pad_id, label_smoothing)
            if model.losses:
                loss = loss + keras.ops.sum(model.losses)
            replicas = tf.distribute.get_strategy().num_replicas_in_sync
            model._loss_tracker.update_state(loss, sample_weight=tf.shape(y)[0])
            scaled = loss / replicas if replicas > 1 else loss
            scaled = model.optimizer.scale_loss(scaled)
        variables = model.trainable_weights
        gradients = tape.gradient(scaled, variables)
        model.optimizer.apply_gradients(zip(gradients, variables))
        return model.compute_metrics(x, y, predicted, sample_weight=None)

    model.train_step = train_step
    model.train_function = None  # rebuilt with this step by the next fit
    return model


def detach(model):
    """Remove an `attach`ed fast path: `fit` takes Keras's own step again."""
    model.__dict__.pop("train_step", None)
    model.train_function = None
    return model


def is_attached(model):
    """Whether `attach` gave `model` the fast `train_step`."""
    return "train_step" in model.__dict__


__all__ = ["applies", "attach", "describe", "detach", "is_attached", "kernels",
           "loss_and_predictions"]
