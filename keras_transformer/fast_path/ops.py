"""The training fast path's element-wise steps on TensorFlow.

Each function computes what the plain layer computes in training, with
fewer passes over memory: the fused CPU kernels (`fast_path.kernels`) where
they are built and usable, else TensorFlow ops with hand-written gradients.
Every function here runs in training only (dropout is on).
"""

import keras
from keras import ops

from keras_transformer.fast_path import kernels
from keras_transformer.layers.multi_head_attention import masked_softmax

# Each random uint32 gives the keep decisions of two elements, one per
# 16-bit half: half the random numbers of a float per element.
_LEVELS = 1 << 16
# Rates whose rounding to a multiple of 2^-16 moves them by under 0.2%.
_FAST_RATES = (1.0 / 256, 255.0 / 256)


def next_seed(dropout):
    """An int32 `(2,)` seed from a `keras.layers.Dropout`'s SeedGenerator,
    whose state advances each call (as Keras's TensorFlow backend does)."""
    import tensorflow as tf

    seed = dropout.seed_generator.next()
    return tf.cast(tf.math.floormod(seed, tf.int32.max - 1), tf.int32)


def _is_float(x, *dtypes):
    return keras.backend.standardize_dtype(x.dtype) in dtypes


def _tf_dropout(inputs, rate, seed):
    """`inputs` with each element zeroed with probability `rate` (rounded
    to a multiple of 2^-16) and the rest scaled to keep the expectation.

    An element is dropped when its 16-bit random number is below
    `threshold = round(rate * 2^16)`, so it is dropped with probability
    `p = threshold / 2^16` (0.1000061 for `rate=0.1`), and kept elements
    are multiplied by `1 / (1 - p)`: `E[output] = inputs` exactly. The
    gradient is the same mask times the upstream gradient.

    Args:
        inputs: float tensor, any shape.
        rate: python float in [2^-8, 1 - 2^-8] (`_FAST_RATES`).
        seed: int32 `(2,)` tensor, the stateless seed.

    Returns:
        A tensor of the shape and dtype of `inputs`.
    """
    import tensorflow as tf

    threshold = int(round(rate * _LEVELS))
    size = tf.size(inputs)
    bits = tf.random.stateless_uniform(
        [(size + 1) // 2], seed=seed, minval=None, maxval=None, dtype=tf.uint32
    )
    halves = tf.reshape(tf.bitcast(bits, tf.uint16), [-1])[:size]
    keep = tf.reshape(halves >= threshold, tf.shape(inputs))
    scale = tf.constant(_LEVELS / (_LEVELS - threshold), inputs.dtype)
    # One pass to a float mask, one multiply (forward and backward alike).
    return inputs * tf.where(keep, scale, tf.zeros((), inputs.dtype))


def _fast_rate(dropout):
    """Whether `dropout` (a `keras.layers.Dropout`) runs here rather than as
    the layer: a rate the 16-bit masks represent, no `noise_shape`."""
    return _FAST_RATES[0] <= dropout.rate <= _FAST_RATES[1] and dropout.noise_shape is None


def dropout(inputs, layer):
    """`layer(inputs, training=True)` for a `keras.layers.Dropout` `layer`.

    Where the rate allows (`_FAST_RATES`, no `noise_shape`), one random
    uint32 per two elements (`_tf_dropout`), or the fused kernel's counter
    hash where it is usable (float32, or bfloat16 between casts): the drop
    probability is the rate rounded to a multiple of 2^-16 and kept
    elements are scaled to keep the expectation. Otherwise the layer itself.

    Args:
        inputs: float tensor, any shape.
        layer: a `keras.layers.Dropout`.

    Returns:
        A tensor of the shape and dtype of `inputs`.
    """
    if not layer.rate:
        return inputs
    if not _fast_rate(layer):
        return layer(inputs, training=True)
    seed = next_seed(layer)
    if kernels.usable(inputs):
        return kernels.fused_dropout(inputs, float(layer.rate), seed)
    if _is_float(inputs, "bfloat16") and kernels.usable():
        # mixed_bfloat16: the float32 kernel between casts (same mask).
        dropped = kernels.fused_dropout(ops.cast(inputs, "float32"), float(layer.rate), seed)
        return ops.cast(dropped, inputs.dtype)
    return _tf_dropout(inputs, float(layer.rate), seed)


def _tf_layer_norm(x, gamma, beta, epsilon):
    """LayerNorm over the last axis with its gradient written out.

    Forward: `x_hat = (x - mean) / sqrt(var + epsilon)`, `y = x_hat * gamma
    + beta`. Backward, with `g = dy * gamma`: `dx = (g - mean(g) - x_hat *
    mean(g * x_hat)) / sqrt(var + epsilon)`, `dgamma = sum(dy * x_hat)`,
    `dbeta = sum(dy)` over all but the last axis. TensorFlow's autodiff of
    the same forward pass runs about twice the ops.

    Args:
        x: float32 `(..., d)`.
        gamma, beta: float32 `(d,)`.
        epsilon: python float.

    Returns:
        float32 `(..., d)`.
    """
    import tensorflow as tf

    @tf.custom_gradient
    def layer_norm(x, gamma, beta):
        mean = tf.reduce_mean(x, axis=-1, keepdims=True)
        centered = x - mean
        variance = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
        inverse_std = tf.math.rsqrt(variance + epsilon)
        x_hat = centered * inverse_std

        def grad(dy):
            scaled = dy * gamma
            mean_scaled = tf.reduce_mean(scaled, axis=-1, keepdims=True)
            mean_projected = tf.reduce_mean(scaled * x_hat, axis=-1, keepdims=True)
            dx = inverse_std * (scaled - mean_scaled - x_hat * mean_projected)
            depth = tf.shape(dy)[-1]
            dgamma = tf.reduce_sum(tf.reshape(dy * x_hat, (-1, depth)), axis=0)
            dbeta = tf.reduce_sum(tf.reshape(dy, (-1, depth)), axis=0)
            return dx, dgamma, dbeta

        return x_hat * gamma + beta, grad

    return layer_norm(x, gamma, beta)


def _plain_last_axis(norm, inputs):
    """Whether `norm` (a `keras.layers.LayerNormalization`) normalizes the
    last axis with a scale and a centre, which `_tf_layer_norm` computes."""
    axis = list(norm.axis) if isinstance(norm.axis, (list, tuple)) else [norm.axis]
    last = axis in ([-1], [len(inputs.shape) - 1])
    return last and norm.center and norm.scale and not norm.rms_scaling


def layer_norm(inputs, norm):
    """`norm(inputs)` for a `keras.layers.LayerNormalization`, through
    `_tf_layer_norm` where it applies; float32 arithmetic, the result in
    the layer's compute dtype."""
    if not _plain_last_axis(norm, inputs):
        return norm(inputs)
    outputs = _tf_layer_norm(
        ops.cast(inputs, "float32"),
        ops.cast(norm.gamma, "float32"),
        ops.cast(norm.beta, "float32"),
        float(norm.epsilon),
    )
    return ops.cast(outputs, norm.compute_dtype)


def residual(inputs, sublayer, norm, dropout_layer, norm_first):
    """`layers.residual.residual` in training.

    Post-LN `LayerNorm(x + Dropout(Sublayer(x)))` runs as one fused kernel
    (`kernels.fused_residual_layer_norm`) where it is usable: float32
    throughout (or bfloat16 between casts), a LayerNorm over the last axis
    and a dropout rate of 0 or one the 16-bit masks represent. Pre-LN is
    `x + Dropout(Sublayer(LayerNorm(x)))`.

    Args:
        inputs: float `(tokens, d_model)` (or any `(..., d_model)`).
        sublayer: callable from that to a tensor of the same shape.
        norm: the block's `keras.layers.LayerNormalization`.
        dropout_layer: the block's `keras.layers.Dropout` on the sub-layer
            output (section 5.4).
        norm_first: bool, pre-LN.

    Returns:
        A tensor of the shape of `inputs`.
    """
    result = sublayer(layer_norm(inputs, norm) if norm_first else inputs)
    if not norm_first and _fusable(inputs, result, norm, dropout_layer):
        rate = float(dropout_layer.rate)
        seed = next_seed(dropout_layer) if rate else ops.zeros((2,), "int32")
        outputs = kernels.fused_residual_layer_norm(
            ops.cast(inputs, "float32"),
            ops.cast(result, "float32"),
            ops.convert_to_tensor(norm.gamma),
            ops.convert_to_tensor(norm.beta),
            rate,
            seed,
            float(norm.epsilon),
        )
        return ops.cast(outputs, norm.compute_dtype)
    outputs = ops.add(inputs, dropout(result, dropout_layer))
    return outputs if norm_first else layer_norm(outputs, norm)


def _fusable(inputs, result, norm, dropout_layer):
    if dropout_layer.rate and not _fast_rate(dropout_layer):
        return False
    if not _plain_last_axis(norm, inputs) or tuple(inputs.shape) != tuple(result.shape):
        return False
    dtypes = {keras.backend.standardize_dtype(t.dtype) for t in (inputs, result)}
    dtypes.add(norm.compute_dtype)
    return dtypes in ({"float32"}, {"bfloat16"}) and kernels.usable()


def attention(query, key, value, mask, dropout_layer):
    """Equation (1) in training on heads-first tensors, the query scaled.

    The weights and their dropout run as one fused kernel
    (`kernels.fused_masked_softmax_dropout`) where it is usable (float32
    scores, or bfloat16 values with float32 scores); otherwise
    `masked_softmax` and `dropout`. Blocked keys get weight exactly 0, and a
    row with none allowed all 0.

    Args:
        query: `(batch, heads, query_length, key_dim)`, times
            `1 / sqrt(key_dim)`.
        key: `(batch, heads, key_length, key_dim)`.
        value: `(batch, heads, key_length, value_dim)`.
        mask: bool, broadcastable to `(batch, heads, query_length,
            key_length)`, True where allowed.
        dropout_layer: the `keras.layers.Dropout` on the weights.

    Returns:
        `(batch, heads, query_length, value_dim)` in the dtype of `value`.
    """
    scores = ops.einsum("bhqd,bhkd->bhqk", query, key)
    dtype = keras.backend.standardize_dtype(value.dtype)
    if dtype == "bfloat16":
        scores = ops.cast(scores, "float32")
    rate = float(dropout_layer.rate)
    fusable = not rate or _fast_rate(dropout_layer)
    if dtype in ("float32", "bfloat16") and fusable and kernels.usable(scores):
        seed = next_seed(dropout_layer) if rate else ops.zeros((2,), "int32")
        _, attended = kernels.fused_masked_softmax_dropout(scores, mask, rate, seed)
    else:
        attended = dropout(masked_softmax(scores, mask), dropout_layer)
    return ops.einsum("bhqk,bhkd->bhqd", ops.cast(attended, dtype), value)


def _tf_softmax_cross_entropy(ids, logits, label_smoothing):
    """`logsumexp(x) - sum(target * x)`, target `(1 - eps) * onehot(ids) +
    eps / V`, with its gradient `softmax(x) - target` written out: the
    values of `tf.nn.softmax_cross_entropy_with_logits`, in fewer ops on a
    CPU. The gradient is `exp(x - max) * (upstream / sum)`, less `eps / V *
    upstream`, with `(1 - eps) * upstream` subtracted at the target ids
    only (no one-hot tensor is built).

    Args:
        ids: int32 `(N,)`, valid target ids.
        logits: float32 `(N, V)`.
        label_smoothing: python float, epsilon_ls.

    Returns:
        float32 `(N,)`.
    """
    import tensorflow as tf

    eps = float(label_smoothing)

    @tf.custom_gradient
    def cross_entropy(x):
        top = tf.reduce_max(x, axis=-1, keepdims=True)
        exp = tf.exp(x - top)
        total = tf.reduce_sum(exp, axis=-1)
        target_logit = tf.gather(x, ids, batch_dims=1)
        loss = tf.math.log(total) + top[:, 0] - (1.0 - eps) * target_logit
        if eps:
            loss -= eps * tf.reduce_mean(x, axis=-1)

        def grad(upstream):
            gradient = exp * (upstream / total)[:, None]
            if eps:
                vocab = tf.cast(tf.shape(x)[-1], x.dtype)
                gradient -= (eps / vocab * upstream)[:, None]
            at_ids = tf.stack([tf.range(tf.shape(ids)[0], dtype=ids.dtype), ids], axis=-1)
            return tf.tensor_scatter_nd_sub(gradient, at_ids, (1.0 - eps) * upstream)

        return loss, grad

    return cross_entropy(logits)


def cross_entropy(ids, logits, label_smoothing):
    """Per-row label-smoothed softmax cross-entropy and the predictions.

    Args:
        ids: int32 `(N,)`, target ids in `[0, V)`.
        logits: float32 `(N, V)`.
        label_smoothing: python float in [0, 1), epsilon_ls (section 5.4).

    Returns:
        `(losses float32 (N,), argmax int32 (N,))`: one pass over the
        logits for both with the fused kernel, where it is usable.
    """
    import tensorflow as tf

    ids = tf.cast(ids, tf.int32)
    if kernels.usable(logits):
        return kernels.fused_softmax_cross_entropy(ids, logits, label_smoothing)
    losses = _tf_softmax_cross_entropy(ids, logits, label_smoothing)
    return losses, tf.argmax(logits, axis=-1, output_type=tf.int32)
