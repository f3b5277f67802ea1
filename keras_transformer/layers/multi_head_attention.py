"""Scaled dot-product attention and multi-head attention (section 3.2)."""

import math

import keras
from keras import ops

from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.masks import as_bool_mask
from keras_transformer.layers.masks import causal_mask
from keras_transformer.layers.masks import key_padding_to_attention_mask
from keras_transformer.layers.masks import merge_masks
from keras_transformer.validation import check_count
from keras_transformer.validation import check_rate

# Added to blocked scores before the softmax. The softmax always runs in
# float32 (see `masked_softmax`), so this constant never meets a float16
# tensor and cannot overflow to -inf under mixed precision.
_MASK_VALUE = -1e9


def masked_softmax(scores, mask=None):
    """Softmax over the last axis that gives blocked keys exactly zero weight.

    The softmax runs in float32 whatever the input dtype (mixed precision
    safe). A row whose keys are all blocked gets all-zero weights rather
    than NaN, and no NaN reaches the gradient: blocked scores get a
    finite -1e9 added before the softmax (so `exp` gives them exactly 0 in
    any row with an allowed key), and the weights are zeroed after it with
    `where`, whose gradient at a constant branch is 0. The softmax itself is
    the backend's (`ops.softmax`: one kernel and a fused gradient on
    TensorFlow, about 20% off the forward and backward pass of an attention
    at bench-small's shapes against the spelled-out max/exp/sum/divide).

    Args:
        scores: float tensor, shape `(..., query_length, key_length)`.
        mask: optional bool tensor broadcastable to `scores`, `True` where
            attention is allowed.

    Returns:
        float32 tensor of the shape of `scores`.
    """
    scores = ops.cast(scores, "float32")
    # Over one key the softmax is exp(x - x) (exactly 1, NaN for a NaN or
    # infinite score, as the softmax gives); Keras's warns that it "will
    # always return the value 1", for a valid one-token sentence.
    if scores.shape[-1] == 1:
        softmax = lambda x: ops.exp(x - x)  # noqa: E731
    else:
        softmax = lambda x: ops.softmax(x, axis=-1)  # noqa: E731
    if mask is None:
        return softmax(scores)
    mask = ops.cast(mask, "bool")
    weights = softmax(scores + attention_bias(mask))
    return ops.where(mask, weights, 0.0)


def scaled_dot_product_attention(
    query, key, value, mask=None, dropout=None, training=None
):
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V, equation (1).

    Args:
        query: float tensor, shape `(batch, query_length, num_heads, key_dim)`.
        key: float tensor, shape `(batch, key_length, num_heads, key_dim)`.
        value: float tensor, shape `(batch, key_length, num_heads, value_dim)`.
        mask: optional bool tensor broadcastable to
            `(batch, num_heads, query_length, key_length)`, `True` where a
            query may attend to a key.
        dropout: optional `keras.layers.Dropout` applied to the weights.
        training: bool, passed to `dropout`.

    Returns:
        `(output, weights)`: output of shape
        `(batch, query_length, num_heads, value_dim)` in the dtype of
        `query`, weights of shape `(batch, num_heads, query_length,
        key_length)` in float32.

    References:
        Vaswani et al. (2017), section 3.2.1, equation (1).
    """
    key_dim = ops.shape(query)[-1]
    query = ops.multiply(query, ops.cast(1.0 / math.sqrt(key_dim), query.dtype))
    return _attention(
        query, key, value, mask, dropout, training, "bqhd,bkhd->bhqk", "bhqk,bkhd->bqhd"
    )


def _attention(query, key, value, mask, dropout, training, scores_equation, output_equation):
    scores = ops.einsum(scores_equation, query, key)
    weights = masked_softmax(scores, mask)
    attended = ops.cast(weights, value.dtype)
    if dropout is not None:
        attended = dropout(attended, training=training)
    return ops.einsum(output_equation, attended, value), weights


def attention_bias(mask):
    """Additive float32 bias from a bool mask: 0 where allowed, -1e9 elsewhere.

    Args:
        mask: bool tensor, `True` where attention is allowed.

    Returns:
        float32 tensor of the mask's shape.
    """
    return ops.where(ops.cast(mask, "bool"), 0.0, _MASK_VALUE)


def single_query_attention(query, key, value, mask=None, keep=None, keys_transposed=True):
    """Attention of one query per row over cached keys (incremental decoding).

    The same function as `scaled_dot_product_attention` for a query length of
    1, laid out for decoding one token at a time: no transposes, plain batched
    matrix products, and a float32 softmax written out in elementwise ops
    (cheap on every backend for these small shapes). The query must already
    carry the `1 / sqrt(d_k)` factor (see `MultiHeadAttention.input_projection`).

    Args:
        query: `(batch, num_heads, 1, key_dim)`, scaled; or `(batch,
            num_heads, beams, key_dim)`: several queries against the same
            keys (the beams of one source in cross-attention).
        key: `(batch, num_heads, key_dim, key_length)` (keys transposed),
            or `(batch, num_heads, key_length, key_dim)` with
            `keys_transposed=False` (a cache that grows along the length
            axis appends whole rows: `decoding.growing_cache`).
        value: `(batch, num_heads, key_length, value_dim)`.
        mask: optional bool, broadcastable to `(batch, num_heads, 1,
            key_length)` (`beams` for 1), True where attention is allowed; blocked scores
            become -1e9 before the softmax.
        keep: optional bool `(batch, 1, 1, 1)`, False for rows whose keys are
            all blocked: their weights become exactly zero, as in
            `masked_softmax`.
        keys_transposed: bool (default True), the layout of `key`.

    Returns:
        `(output (batch, num_heads, 1, value_dim), weights (batch,
        num_heads, 1, key_length) float32)` (`beams` for 1 with that many
        queries).

    References:
        Vaswani et al. (2017), section 3.2.1, equation (1).
    """
    if keys_transposed:
        scores = ops.matmul(query, key)
    else:  # one batched product with the keys' transpose folded in (no copy)
        scores = ops.einsum("bhqd,bhkd->bhqk", query, key)
    scores = ops.cast(scores, "float32")
    if mask is not None:
        scores = ops.where(mask, scores, _MASK_VALUE)
    scores = scores - ops.max(scores, axis=-1, keepdims=True)
    weights = ops.exp(scores)
    weights = weights / ops.sum(weights, axis=-1, keepdims=True)
    if keep is not None:
        weights = ops.where(keep, weights, 0.0)
    return ops.matmul(ops.cast(weights, value.dtype), value), weights


def _check_attention_inputs(query_shape, value_shape, key_shape=None):
    """Raises ValueError unless query, value (and key) are rank-3
    `(batch, length, features)` with one batch size and key and value of
    one length, where the shapes say so statically."""
    shapes = {"query": query_shape, "value": value_shape, "key": key_shape}
    for name, shape in shapes.items():
        if shape is not None and len(shape) != 3:
            raise ValueError(
                f"MultiHeadAttention takes `{name}` of shape (batch, length, features); got "
                f"shape {tuple(shape)}. Add the batch axis (x[None]) for one sequence."
            )
    known = {n: s[0] for n, s in shapes.items() if s is not None and s[0] is not None}
    if len(set(known.values())) > 1:
        raise ValueError(f"MultiHeadAttention's inputs must share the batch size; got {known}.")
    if key_shape is not None and None not in (key_shape[1], value_shape[1]) and key_shape[1] != value_shape[1]:
        raise ValueError(
            f"`key` and `value` must have the same length (one key per value); got "
            f"{key_shape[1]} and {value_shape[1]}."
        )


def _check_mask_shapes(query_shape, value_shape, attention_mask, value_mask):
    """Raises ValueError for masks that cannot broadcast to `(batch,
    query_length, key_length)`, where the shapes say so statically."""
    batch, query_length, key_length = query_shape[0], query_shape[1], value_shape[1]
    if value_mask is not None:
        shape = tuple(value_mask.shape)
        if len(shape) != 2 or any(
            None not in (got, want) and got != want for got, want in zip(shape, (batch, key_length))
        ):
            raise ValueError(
                f"`value_mask` is the keys' padding mask, of shape (batch, key_length) = "
                f"({batch}, {key_length}); got shape {shape}."
            )
    if attention_mask is not None:
        shape = tuple(attention_mask.shape)
        want = (batch, query_length, key_length)
        if not 2 <= len(shape) <= 3 or any(
            None not in (got, size) and got not in (1, size) for got, size in zip(shape[::-1], want[::-1])
        ):
            raise ValueError(
                f"`attention_mask` must broadcast to (batch, query_length, key_length) = {want}; "
                f"got shape {shape}."
            )


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention with padding and causal masks (section 3.2.2).

    Projects queries, keys and values into `num_heads` subspaces of
    `key_dim` dimensions, runs scaled dot-product attention in each, and
    projects the concatenated heads back:
    `MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O` with
    `head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)`.

    The weights have the layout of `keras.layers.MultiHeadAttention`
    (`query`, `key`, `value` kernels `(d_model, num_heads, key_dim)` and an
    `attention_output` kernel `(num_heads, key_dim, output_dim)`), so weights
    copy one-to-one between the two.

    Masks follow the Keras convention: `True` means "may attend". The
    padding mask of the keys (`value_mask`, filled in automatically from a
    Keras mask on `value`) is broadcast along the query axis. A query row
    whose keys are all blocked gives finite output (zero attention weights),
    never NaN.

    Args:
        num_heads: int, number of attention heads `h`.
        key_dim: int, size of each head for query and key, `d_k`.
        value_dim: int, size of each head for value, `d_v`; defaults to
            `key_dim`.
        dropout_rate: float in [0, 1), dropout on the attention weights.
        output_dim: int, size of the output; defaults to the query's last
            dimension.
        use_bias: bool, whether the projections have biases.
        kernel_initializer: initializer of the projection kernels.
            An initializer with a fixed `seed` gives each kernel of one shape
            the same values, as in Keras's own layers (W^Q = W^K = W^V):
            for reproducible weights, leave it unseeded and call
            `keras.utils.set_random_seed`.
        bias_initializer: initializer of the projection biases.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`).

    Call arguments:
        query: float tensor `(batch, query_length, d_model)`.
        value: float tensor `(batch, key_length, d_model)`; defaults to
            `query` (self-attention).
        key: float tensor `(batch, key_length, d_model)`; defaults to
            `value`.
        attention_mask: optional bool (or 0/1 integer) tensor broadcastable
            to `(batch, query_length, key_length)`, `True` where allowed;
            a `(query_length, key_length)` mask applies to every sentence.
        value_mask: optional bool `(batch, key_length)` key padding mask.
        mask: filled in by Keras when `query` is the only tensor given
            (`layer(x)`, self-attention): its Keras mask, which is then the
            key padding mask, as `value_mask` is for `layer(x, x)`.
        use_causal_mask: bool, add the causal (look-ahead) mask.
        return_attention_scores: bool, also return the weights.
        training: bool, enables dropout.
    Returns:
        float tensor `(batch, query_length, output_dim)`, and with
        `return_attention_scores=True` also the float32 weights
        `(batch, num_heads, query_length, key_length)`.

    Raises:
        ValueError: for sizes (`num_heads`, `key_dim`, `value_dim`,
            `output_dim`) that are not positive whole numbers or a
            `dropout_rate` outside [0, 1); when called, for inputs that
            are not `(batch, length, features)`, masks whose shapes do
            not fit them and floating-point masks (an additive mask,
            0 / -1e9, cast to bool would be read backwards).

    Example:
    >>> import numpy as np
    >>> layer = MultiHeadAttention(num_heads=2, key_dim=8)
    >>> x = np.ones((3, 5, 16), "float32")
    >>> tuple(layer(x, x).shape)
    (3, 5, 16)

    References:
        Vaswani et al. (2017), "Attention Is All You Need", section 3.2.
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        dropout_rate=0.0,
        output_dim=None,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_count(num_heads, "num_heads")
        self.key_dim = check_count(key_dim, "key_dim")
        self.value_dim = self.key_dim if value_dim is None else check_count(value_dim, "value_dim")
        self.dropout_rate = check_rate(dropout_rate, "dropout_rate")
        self.output_dim = None if output_dim is None else check_count(output_dim, "output_dim")
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    def _dense(self, equation, output_shape, bias_axes, name):
        dense = keras.layers.EinsumDense(
            equation,
            output_shape=output_shape,
            bias_axes=bias_axes if self.use_bias else None,
            kernel_initializer=self.kernel_initializer.__class__.from_config(
                self.kernel_initializer.get_config()
            ),
            bias_initializer=self.bias_initializer.__class__.from_config(
                self.bias_initializer.get_config()
            ),
            dtype=self.dtype_policy,
            name=name,
        )
        # Projections act per position; let a Keras mask pass through them.
        dense.supports_masking = True
        return dense

    def build(self, query_shape, value_shape=None, key_shape=None):
        _check_attention_inputs(query_shape, value_shape or query_shape, key_shape)
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        self._built_widths = {"query": query_shape[-1], "value": value_shape[-1], "key": key_shape[-1]}
        output_dim = self.output_dim or query_shape[-1]
        self.query_dense = self._dense(
            "abc,cde->abde", (None, self.num_heads, self.key_dim), "de", "query"
        )
        self.query_dense.build(query_shape)
        self.key_dense = self._dense(
            "abc,cde->abde", (None, self.num_heads, self.key_dim), "de", "key"
        )
        self.key_dense.build(key_shape)
        self.value_dense = self._dense(
            "abc,cde->abde", (None, self.num_heads, self.value_dim), "de", "value"
        )
        self.value_dense.build(value_shape)
        self.output_dense = self._dense(
            "abcd,cde->abe", (None, output_dim), "e", "attention_output"
        )
        self.output_dense.build(
            (query_shape[0], query_shape[1], self.num_heads, self.value_dim)
        )
        self.attention_dropout = Dropout(
            self.dropout_rate, dtype=self.dtype_policy, name="attention_dropout"
        )
        self.built = True

    # The three steps below are public so that cached decoding can project
    # one new token, keep keys and values in a cache, and attend over it.
    def project_query(self, query):
        """`(batch, length, d_model)` -> `(batch, length, num_heads, key_dim)`."""
        if self.quantized:
            return self.query_dense(query)
        return self.project_heads(query, ("query",))[0]

    def project_key_value(self, value, key=None):
        """Keys and values `(batch, length, num_heads, key_dim|value_dim)`.

        Keys and values of one tensor (`key` None: the encoder outputs of a
        cross-attention) come from one fused product (`project_heads`); a
        `quantized` layer calls its projections.
        """
        if key is not None or self.quantized:
            key = value if key is None else key
            return self.key_dense(key), self.value_dense(value)
        return self.project_heads(value, ("key", "value"))

    def project_heads(self, inputs, parts):
        """The named projections of `inputs` as one matmul (`input_projection`).

        The kernels are concatenated along the output axis (the variables stay
        separate, in `keras.layers.MultiHeadAttention`'s layout), so one
        `(d_model, sum of h * depth)` product replaces one per part; on
        tensorflow it is also several times faster than the parts'
        `EinsumDense` calls, which run as broadcast batched products.

        Args:
            inputs: `(batch, length, d_model)`.
            parts: names among `"query"`, `"key"`, `"value"`.

        Returns:
            tuple, per part `(batch, length, num_heads, key_dim | value_dim)`;
            a query is not yet scaled.
        """
        kernel, bias = self.input_projection(parts, scale_query=False)
        # The compute dtype, as the projections' own calls cast their inputs.
        fused = self._matmul(ops.cast(inputs, kernel.dtype), kernel, bias)
        depths = [self.value_dim if part == "value" else self.key_dim for part in parts]
        ends = [self.num_heads * sum(depths[:i + 1]) for i in range(len(parts) - 1)]
        pieces = ops.split(fused, ends, axis=-1) if ends else [fused]
        batch, length = ops.shape(fused)[0], ops.shape(fused)[1]
        return tuple(
            ops.reshape(piece, (batch, length, self.num_heads, depth)) for piece, depth in zip(pieces, depths)
        )

    @property
    def quantized(self):
        """True when a projection is Keras-quantized (`quantize("int8")`):
        its `kernel` then holds integer codes and a separate scale, so the
        fused matmuls, which read kernels, give way to the projections' own
        calls. (LoRA needs no such care: `kernel` includes its update.)"""
        return any(
            dense.quantization_mode is not None
            for dense in (self.query_dense, self.key_dense, self.value_dense, self.output_dense)
        )

    def input_projection(self, parts, scale_query):
        """Kernels of the named projections as one 2-D matrix, plus the
        joined bias, for one matmul per position.

        Args:
            parts: names among `"query"`, `"key"`, `"value"`, in the order
                their columns should have.
            scale_query: bool; the query columns then carry the
                `1 / sqrt(key_dim)` of equation (1).

        Returns:
            `(kernel (d_model, sum of h * depth), bias or None)` in the
            compute dtype.
        """
        dtype = self.compute_dtype
        denses = [{"query": self.query_dense, "key": self.key_dense,
                   "value": self.value_dense}[part] for part in parts]

        def flat(dense, tensor, shape):
            tensor = ops.reshape(ops.cast(tensor, dtype), shape)
            if scale_query and dense is self.query_dense:
                tensor = tensor * ops.cast(1.0 / math.sqrt(self.key_dim), dtype)
            return tensor

        def joined(tensors, axis):
            return tensors[0] if len(tensors) == 1 else ops.concatenate(tensors, axis=axis)

        kernel = joined([flat(d, d.kernel, (d.kernel.shape[0], -1)) for d in denses], 1)
        bias = None
        if self.use_bias:
            bias = joined([flat(d, d.bias, (-1,)) for d in denses], 0)
        return kernel, bias

    def fused_projection_weights(self, include_key_value=True):
        """The projections as 2-D matrices, for one matmul per position.

        The query part carries the `1 / sqrt(key_dim)` factor of equation
        (1). With `include_key_value`, the query, key and value kernels are
        concatenated along the output axis (one matmul gives Q, K and V of a
        self-attention), in the compute dtype.

        Returns:
            dict with `"kernel"` `(d_model, h * key_dim [+ h * key_dim +
            h * value_dim])`, `"bias"` (or None), `"output_kernel"`
            `(h * value_dim, output_dim)` and `"output_bias"` (or None);
            None for a `quantized` layer, whose `step_projection` and
            `step_output` then call the projections.
        """
        if self.quantized:
            return None
        parts = ("query", "key", "value") if include_key_value else ("query",)
        kernel, bias = self.input_projection(parts, scale_query=True)
        output_kernel, output_bias = self.output_projection()
        return {
            "kernel": kernel,
            "bias": bias,
            "output_kernel": output_kernel,
            "output_bias": output_bias,
        }

    def output_projection(self):
        """W^O as a `(h * value_dim, output_dim)` matrix and its bias (or
        None), in the compute dtype."""
        dtype = self.compute_dtype
        kernel = ops.reshape(
            ops.cast(self.output_dense.kernel, dtype),
            (self.num_heads * self.value_dim, -1),
        )
        bias = ops.cast(self.output_dense.bias, dtype) if self.use_bias else None
        return kernel, bias

    def step_projection(self, rows, weights, include_key_value=True):
        """The query (scaled by `1 / sqrt(key_dim)`), and with
        `include_key_value` the key and value, of one position per row.

        Args:
            rows: `(rows, d_model)`.
            weights: `fused_projection_weights(include_key_value)`, read
                once outside a decoding loop; None calls the projections.

        Returns:
            `(rows, h * key_dim [+ h * key_dim + h * value_dim])`, the
            columns in the order query, key, value.
        """
        if weights is not None:
            return self._matmul(rows, weights["kernel"], weights["bias"])
        rows = ops.expand_dims(rows, 1)
        query = self.query_dense(rows) * ops.cast(1.0 / math.sqrt(self.key_dim), self.compute_dtype)
        parts = [query, *self.project_key_value(rows)] if include_key_value else [query]
        parts = [ops.reshape(part, (-1, part.shape[-2] * part.shape[-1])) for part in parts]
        return parts[0] if len(parts) == 1 else ops.concatenate(parts, axis=-1)

    def step_output(self, attended, weights):
        """W^O applied to `attended` `(rows, num_heads, 1, value_dim)` with
        `fused_projection_weights()` (None calls the projection): `(rows,
        output_dim)`."""
        if weights is None:
            attended = ops.reshape(attended, (-1, 1, self.num_heads, self.value_dim))
            return self.output_dense(attended)[:, 0]
        kernel = weights["output_kernel"]
        return self._matmul(ops.reshape(attended, (-1, kernel.shape[0])), kernel, weights["output_bias"])

    def project_self_attention(self, inputs):
        """Q, K and V of a self-attention with one fused matmul
        (`project_heads`).

        Args:
            inputs: `(batch, length, d_model)`.

        Returns:
            `(query, key, value)`, each `(batch, length, num_heads, key_dim
            | value_dim)`; the query is not yet scaled.
        """
        return self.project_heads(inputs, ("query", "key", "value"))

    @staticmethod
    def _matmul(x, kernel, bias):
        x = ops.matmul(x, kernel)
        return x if bias is None else x + bias

    def _attend_heads(self, query, key, value, mask, training):
        """Equation (1) per head: `(attended (batch, query_length, heads,
        value_dim), weights (batch, heads, query_length, key_length))`."""
        if mask is not None:
            mask = ops.expand_dims(ops.cast(mask, "bool"), 1)  # heads axis
        return scaled_dot_product_attention(
            query,
            key,
            value,
            mask=mask,
            dropout=self.attention_dropout if self.dropout_rate else None,
            training=training,
        )

    def attend(self, query, key, value, mask=None, training=None):
        """Attention over projected heads, then the output projection.

        Args:
            query: `(batch, query_length, num_heads, key_dim)`.
            key: `(batch, key_length, num_heads, key_dim)`.
            value: `(batch, key_length, num_heads, value_dim)`.
            mask: bool, broadcastable to `(batch, query_length, key_length)`.

        Returns:
            `(output (batch, query_length, output_dim), weights (batch,
            num_heads, query_length, key_length) float32)`.
        """
        attended, weights = self._attend_heads(query, key, value, mask, training)
        return self.project_output(attended), weights

    def project_output(self, attended):
        """W^O on the heads: `(batch, length, num_heads, value_dim)` ->
        `(batch, length, output_dim)`.

        One product with the heads flattened (`output_projection`): the
        same function as the `attention_output` EinsumDense, which on
        tensorflow runs as a broadcast batched product several times slower;
        a `quantized` layer calls the EinsumDense.
        """
        if self.quantized:
            return self.output_dense(attended)
        kernel, bias = self.output_projection()
        batch, length = ops.shape(attended)[0], ops.shape(attended)[1]
        attended = ops.cast(ops.reshape(attended, (batch, length, kernel.shape[0])), kernel.dtype)
        return self._matmul(attended, kernel, bias)

    def call(
        self,
        query,
        value=None,
        key=None,
        attention_mask=None,
        value_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
        mask=None,
    ):
        self_attention = key is None and (value is None or value is query)
        if value is None and value_mask is None:
            value_mask = mask  # the query's padding is the keys' padding
        value = query if value is None else value
        attention_mask, value_mask = self._checked_inputs(query, value, key, attention_mask, value_mask)
        if attention_mask is not None and len(attention_mask.shape) == 2:
            # (query_length, key_length): every sentence's
            attention_mask = ops.expand_dims(attention_mask, 0)
        mask = merge_masks(
            attention_mask,
            key_padding_to_attention_mask(value_mask),
            causal_mask(ops.shape(query)[1], ops.shape(value)[1]) if use_causal_mask else None,
        )
        if self_attention and not self.quantized:
            q, k, v = self.project_self_attention(query)
        else:
            q = self.project_query(query)
            k, v = self.project_key_value(value, key)
        output, weights = self.attend(q, k, v, mask, training)
        if return_attention_scores:
            return output, weights
        return output

    def compute_mask(self, query, mask=None):
        return mask

    def _checked_inputs(self, query, value, key, attention_mask, value_mask):
        """The checks of `call` that shapes and dtypes allow before any
        value is known (so `keras.Input`s get them too): ranks, batch sizes,
        widths, mask shapes and mask dtypes. Returns the masks as bool."""
        _check_attention_inputs(query.shape, value.shape, None if key is None else key.shape)
        self._check_widths(query=query, value=value, key=value if key is None else key)
        _check_mask_shapes(query.shape, value.shape, attention_mask, value_mask)
        if attention_mask is not None:
            attention_mask = as_bool_mask(attention_mask, "attention_mask")
        if value_mask is not None:
            value_mask = as_bool_mask(value_mask, "value_mask")
        return attention_mask, value_mask

    def compute_output_spec(self, query, value=None, key=None, attention_mask=None, value_mask=None,
                            use_causal_mask=False, return_attention_scores=False, training=None,
                            mask=None):
        value = query if value is None else value
        self._checked_inputs(query, value, key, attention_mask, value_mask)
        output = keras.KerasTensor(self.compute_output_shape(query.shape), dtype=self.compute_dtype)
        if not return_attention_scores:
            return output
        weights = (query.shape[0], self.num_heads, query.shape[1], value.shape[1])
        return output, keras.KerasTensor(weights, dtype="float32")

    def _check_widths(self, **inputs):
        """ValueError for an input of another width than the layer was
        built for (a matrix product would fail with a bare shape error)."""
        for name, tensor in inputs.items():
            built = getattr(self, "_built_widths", {}).get(name)
            if None not in (built, tensor.shape[-1]) and tensor.shape[-1] != built:
                raise ValueError(
                    f"{self.name} was built for `{name}` of width {built}; got width "
                    f"{tensor.shape[-1]} (shape {tuple(tensor.shape)}). Call a new layer for other widths."
                )

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return tuple(query_shape[:-1]) + (self.output_dim or query_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "dropout_rate": self.dropout_rate,
                "output_dim": self.output_dim,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "bias_initializer": keras.initializers.serialize(
                    self.bias_initializer
                ),
            }
        )
        return config
