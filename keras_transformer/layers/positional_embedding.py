"""Token embedding scaled by sqrt(d_model) plus the sinusoidal encoding."""

import keras
import numpy as np
from keras import ops

from keras_transformer.layers.id_range import check_id_range
from keras_transformer.layers.id_range import check_integer_ids
from keras_transformer.deprecation import renamed_argument
from keras_transformer.layers.output_projection import vocabulary_logits
from keras_transformer.validation import check_count


def sinusoidal_encoding(sequence_length, d_model):
    """The fixed positional encoding of section 3.5, as a NumPy array.

    `PE[pos, 2i] = sin(pos / 10000^(2i / d_model))` and
    `PE[pos, 2i + 1] = cos(pos / 10000^(2i / d_model))`: sines on the even
    dimensions and cosines on the odd ones, interleaved as in the paper (the
    TF tutorial concatenates them instead, a different encoding).

    Args:
        sequence_length: int, number of positions (rows).
        d_model: int, model width (columns); may be odd.

    Returns:
        float32 array, shape `(sequence_length, d_model)`.

    References:
        Vaswani et al. (2017), section 3.5.
    """
    positions = np.arange(sequence_length, dtype=np.float64)[:, None]
    two_i = np.arange(0, d_model, 2, dtype=np.float64)[None, :]
    angles = positions / np.power(10000.0, two_i / d_model)
    encoding = np.zeros((sequence_length, d_model), dtype=np.float64)
    encoding[:, 0::2] = np.sin(angles)
    encoding[:, 1::2] = np.cos(angles[:, : d_model // 2])
    return encoding.astype("float32")


def embedding_lookup(table, ids):
    """Rows of `table` at `ids`, with a dense gradient on TensorFlow.

    TensorFlow's gradient of a gather is a `tf.IndexedSlices`: one slice per
    occurrence of an id. Keras 3's optimizers apply their elementwise ops to
    those slices before summing them, so Adam's second moment of a token
    that occurs `n` times gets `g_1^2 + ... + g_n^2` instead of
    `(g_1 + ... + g_n)^2`: a wrong step for every token repeated in a batch
    (start, end, frequent words). Here the gradient is the summed dense
    `(vocab_size, d_model)` tensor, which the optimizers had to build from
    the slices anyway. Other backends already give a dense gradient.

    Args:
        table: float tensor or variable, `(vocab_size, d_model)`.
        ids: ints of any shape (tensor, array, list or int), values in
            `[0, vocab_size)`; other dtypes are cast to int32.

    Returns:
        Tensor of shape `ids.shape + (d_model,)`, dtype of `table`.
    """
    if keras.backend.backend() != "tensorflow":
        return ops.take(table, ids, axis=0)
    import tensorflow as tf

    table = tf.convert_to_tensor(table)
    ids = tf.convert_to_tensor(ids)
    if ids.dtype not in (tf.int32, tf.int64):
        ids = tf.cast(ids, "int32")

    @tf.custom_gradient
    def lookup(rows):
        def grad(upstream):
            flat = tf.reshape(upstream, [-1, tf.shape(rows)[-1]])
            return tf.math.unsorted_segment_sum(
                flat, tf.reshape(ids, [-1]), tf.shape(rows)[0]
            )

        return tf.gather(rows, ids), grad

    return lookup(table)


def _concrete_int(value):
    """`value` as an int when it is known now (a Python int or an eager
    scalar tensor), else None (a symbolic or traced tensor)."""
    if isinstance(value, int):
        return value
    try:
        return int(value)
    except Exception:  # graph tensors, KerasTensors and jax tracers have no value yet
        return None


def _check_start_index(start_index):
    """Raises TypeError unless `start_index` is an integer position (a float
    or bool failed in a conversion); `check_sequence_length` refuses a
    negative one."""
    dtype = getattr(start_index, "dtype", None)
    if dtype is not None:
        integer = "int" in keras.backend.standardize_dtype(dtype)
    else:
        integer = isinstance(start_index, int) and not isinstance(start_index, bool)
    if not integer:
        raise TypeError(
            f"`start_index` is the integer position of inputs[:, 0]; got {start_index!r} "
            f"({type(start_index).__name__})."
        )


def check_sequence_length(inputs, sequence_length, name, start_index=0):
    """`inputs`, once their length (axis 1) plus `start_index` is checked
    not to pass `sequence_length`, the rows of the position table (section
    3.5).

    Args:
        inputs: int tensor `(batch, length)`, token ids.
        sequence_length: python int, the longest sequence the model takes.
        name: what the inputs are, for the message (e.g. a layer's name).
        start_index: int or scalar int tensor, the position of the first
            token.

    Returns:
        `inputs` (in a TensorFlow graph of unknown length, with the check as
        a control dependency).

    Raises:
        ValueError: when the start is known here and negative, or the length
            and start are known here and too long
            (a start known only at run time, as in cached decoding, is
            not checked: the search bounds it).
        tf.errors.InvalidArgumentError: (tensorflow graph, length unknown
            until run time) the same, at run time.
    """
    length, start = inputs.shape[1], _concrete_int(start_index)
    if start is not None and start < 0:  # a NumPy or tensor one failed in a Slice op
        raise ValueError(f"`start_index` is the position of inputs[:, 0], 0 or more; got {start}.")
    if length is not None:  # with a start known only at run time, unchecked
        if start is not None and length + start > sequence_length:
            raise ValueError(
                f"{name} got a sequence of length {length}"
                + (f" starting at position {start}" if start else "")
                + f", longer than its sequence_length={sequence_length}. Truncate "
                "the input to sequence_length tokens, or build the model with a "
                "larger sequence_length."
            )
        return inputs
    if keras.backend.backend() != "tensorflow":
        return inputs  # jax and torch shapes are known when traced
    # Unknown length inside a tf.function: check in the graph, with the same
    # message, rather than fail later in a Slice op.
    import tensorflow as tf

    check = tf.debugging.assert_less_equal(
        tf.shape(inputs)[1] + start_index,
        sequence_length,
        message=(
            f"{name} got a sequence longer than its sequence_length={sequence_length}. "
            "Truncate the input to sequence_length tokens (make_dataset's "
            "sequence_length must not exceed the model's), or build the model with a "
            "larger sequence_length."
        ),
    )
    # What reads the inputs must wait for the check: otherwise the two run in
    # parallel and a later op's own error may come first.
    with tf.control_dependencies([check]):
        return tf.identity(inputs)


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionalEmbedding(keras.layers.Layer):
    """Token embedding times sqrt(d_model), plus the sinusoidal encoding.

    Section 3.4: "In the embedding layers, we multiply those weights by
    sqrt(d_model)". Section 3.5: the sum with fixed sine and cosine
    position encodings. The encoding table has exactly `sequence_length` rows
    (not `vocab_size`) and is computed from the config, so it is not a
    weight and costs nothing in a checkpoint.

    The layer emits a Keras padding mask (`inputs != pad_id`) that the
    encoder and decoder blocks pick up and carry on.

    Called with `reverse=True` on decoder outputs, the layer is the
    pre-softmax linear transformation with the embedding's own weights
    (section 3.4, "we share the same weight matrix between the two
    embedding layers and the pre-softmax linear transformation"; Press and
    Wolf, 2017): logits `x @ E^T`, without the sqrt(d_model) factor, in
    float32, as `OutputProjection` returns them. KerasHub's
    `ReversibleEmbedding` works the same way.

    Args:
        vocab_size: int, number of token ids.
        d_model: int, embedding width.
        sequence_length: int, the longest sequence the layer accepts (the
            rows of the position table; KerasHub's name). `max_length` is
            its deprecated old name.
        pad_id: int or None, the padding id that the mask marks; `None`
            emits no mask.
        embeddings_initializer: initializer of the token table; default
            normal with stddev `d_model ** -0.5`, which the sqrt(d_model)
            scaling brings back to unit variance.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: int tensor `(batch, length)` of token ids, `length <=
            sequence_length`.
        start_index: int or scalar int tensor, position of `inputs[:, 0]`
            (cached decoding embeds one token at position `start_index`).
        check_ids: bool, check that the ids lie in `[0, vocab_size)`
            (`check_id_range`). Cached decoding passes False: it embeds the
            search's own outputs, one step at a time.
        reverse: bool, project float `inputs` `(batch, length, d_model)`
            onto the vocabulary instead (tied output projection).
        mask, training: accepted and unused (a Keras mask and the training
            flag reach every layer of a functional model).

    Returns:
        float tensor `(batch, length, d_model)` in the layer's compute dtype;
        with `reverse=True`, float32 logits `(batch, length, vocab_size)`
        that carry no Keras mask.

    Raises:
        TypeError: for ids that are not integers (floats, strings, bools),
            or a `start_index` that is not an integer.
        ValueError: for a length of 0, a negative `start_index` (where its
            value is known), or when
            `length + start_index` exceeds `sequence_length` (for a
            statically known length), for an id outside the vocabulary
            (see `check_id_range` for the errors in compiled code), on a
            size that is not a positive whole number or a `pad_id`
            outside the vocabulary.

    Example:
    >>> import numpy as np
    >>> layer = PositionalEmbedding(vocab_size=100, d_model=16, sequence_length=8)
    >>> tuple(layer(np.array([[5, 6, 0]])).shape)
    (1, 3, 16)

    References:
        Vaswani et al. (2017), sections 3.4 and 3.5.
    """

    def __init__(
        self,
        vocab_size,
        d_model,
        sequence_length=None,
        pad_id=0,
        embeddings_initializer=None,
        max_length=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        sequence_length = renamed_argument(
            "PositionalEmbedding", "sequence_length", sequence_length, "max_length", max_length)
        if sequence_length is None:
            raise TypeError("PositionalEmbedding needs `sequence_length`, the longest sequence "
                            "it accepts (the rows of its position table).")
        self.vocab_size = check_count(vocab_size, "vocab_size")
        self.d_model = check_count(d_model, "d_model")
        self.sequence_length = check_count(sequence_length, "sequence_length")
        self.pad_id = None if pad_id is None else check_count(pad_id, "pad_id", minimum=0)
        if self.pad_id is not None and self.pad_id >= self.vocab_size:
            raise ValueError(f"`pad_id` must be an id of the vocabulary, below vocab_size={self.vocab_size}; "
                             f"got {pad_id!r} (None: no padding mask).")
        if embeddings_initializer is None:
            embeddings_initializer = keras.initializers.RandomNormal(
                stddev=self.d_model**-0.5
            )
        self.embeddings_initializer = keras.initializers.get(
            embeddings_initializer
        )
        self.supports_masking = True

    def build(self, input_shape=None):
        self.token_embedding = keras.layers.Embedding(
            self.vocab_size,
            self.d_model,
            embeddings_initializer=self.embeddings_initializer,
            dtype=self.dtype_policy,
            name="token_embedding",
        )
        self.token_embedding.build((None, None))
        # A NumPy constant, turned into a tensor at each call: a tensor made
        # here would leak out of a tf.function that happens to build the layer.
        self._position_table = sinusoidal_encoding(self.sequence_length, self.d_model)
        self.built = True

    @property
    def max_length(self):
        """Deprecated: `sequence_length`."""
        return self.sequence_length

    @property
    def position_encoding(self):
        """The sinusoidal table, `(sequence_length, d_model)` float32 tensor."""
        return ops.convert_to_tensor(self._position_table)

    @property
    def embeddings(self):
        """The token table, `(vocab_size, d_model)`."""
        return self.token_embedding.embeddings

    def call(self, inputs, start_index=0, check_ids=True, reverse=False, mask=None,
             training=None):
        if reverse:
            return vocabulary_logits(self._reverse, inputs)
        self._check_ids_shape_and_dtype(inputs, start_index)
        inputs = check_sequence_length(
            inputs, self.sequence_length, f"PositionalEmbedding ({self.name})", start_index
        )
        if check_ids:
            inputs = check_id_range(inputs, self.vocab_size, f"The inputs of {self.name}")
        embedded = self._lookup(inputs)
        embedded = ops.multiply(
            embedded, ops.cast(self.d_model**0.5, embedded.dtype)
        )
        length = ops.shape(inputs)[1]
        positions = ops.slice(
            ops.convert_to_tensor(self._position_table),
            (start_index, 0),
            (length, self.d_model),
        )
        return embedded + ops.cast(positions, embedded.dtype)[None]

    def _check_ids_shape_and_dtype(self, inputs, start_index):
        """The checks of `call` that need no values (so `keras.Input`s get
        them too): integer ids of shape `(batch, length)`, length not 0, an
        integer `start_index`."""
        check_integer_ids(
            inputs, f"The inputs of PositionalEmbedding ({self.name})",
            fix="Tokenize to int32 ids first, or pass reverse=True to project decoder outputs onto "
                "the vocabulary",
        )
        _check_start_index(start_index)
        if len(inputs.shape) != 2:
            raise ValueError(
                f"PositionalEmbedding expects token ids of shape (batch, length) ({self.name}); "
                f"received shape {tuple(inputs.shape)}. For one sequence, add a batch axis "
                "(`ids[None]`)."
            )
        length = inputs.shape[1]
        if length == 0:
            raise ValueError(
                f"PositionalEmbedding got a sequence of length 0 ({self.name}, inputs of shape "
                f"{tuple(inputs.shape)}): a sequence needs at least one token. Pack each sentence "
                "with its end token (`pack_source`; an empty sentence is then just the end id)."
            )

    def decoding_weights(self):
        """The token table `(vocab_size, d_model)` in the compute dtype, read
        (and cast from its storage dtype) once, for `step`; None for a
        quantized or LoRA table, which `step` then reads through the layer."""
        layer = self.token_embedding
        if layer.quantization_mode is not None or layer.lora_enabled:
            return None
        return ops.cast(layer.embeddings, layer.compute_dtype)

    def step(self, token_ids, index, table=None):
        """The embedding of one position per row, for decoding: the values
        of `call(token_ids[:, None], start_index=index, check_ids=False)[:,
        0]`.

        Args:
            token_ids: int `(batch,)`, in `[0, vocab_size)` (not checked).
            index: scalar int, their position, below `sequence_length`.
            table: `decoding_weights()`; the layer reads its variable if None.

        Returns:
            `(batch, d_model)` in the compute dtype.
        """
        if table is None:
            return self(ops.expand_dims(token_ids, 1), start_index=index, check_ids=False)[:, 0]
        embedded = embedding_lookup(table, token_ids)
        embedded = ops.multiply(embedded, ops.cast(self.d_model**0.5, embedded.dtype))
        position = ops.take(ops.convert_to_tensor(self._position_table), index, axis=0)
        return embedded + ops.cast(position, embedded.dtype)[None]

    def _lookup(self, inputs):
        layer = self.token_embedding
        if layer.quantization_mode is not None or layer.lora_enabled:
            return layer(inputs)
        # `keras.layers.Embedding.call`, with a dense gradient on TensorFlow.
        return ops.cast(embedding_lookup(layer.embeddings, inputs), layer.compute_dtype)

    def _float_table(self):
        """The token table variable; a ValueError when it is quantized."""
        table = self.token_embedding
        if table.quantization_mode is not None:
            raise ValueError(
                f"{self.name} is quantized ({table.quantization_mode}) and also the "
                "tied output projection, which needs its float table; quantize "
                "an untied model, or keep this embedding in float."
            )
        return table.embeddings

    def _check_reverse_width(self, inputs):
        if inputs.shape[-1] is not None and inputs.shape[-1] != self.d_model:
            raise ValueError(
                f"{self.name}(..., reverse=True) projects decoder outputs of width d_model={self.d_model} "
                f"onto the vocabulary; got width {inputs.shape[-1]} (shape {tuple(inputs.shape)})."
            )

    def _reverse(self, inputs):
        self._check_reverse_width(inputs)
        return ops.matmul(inputs, ops.transpose(ops.cast(self._float_table(), inputs.dtype)))

    def output_weights(self, table=None):
        """`(kernel (d_model, vocab_size), None)`: the transposed token table
        in the compute dtype, the tied output projection's weights for
        step-by-step decoding. `table`: `decoding_weights()`, to transpose
        that rather than read and cast the variable again.

        Raises:
            ValueError: if the table is Keras-quantized.
        """
        if table is None:
            table = ops.cast(self._float_table(), self.compute_dtype)
        return ops.transpose(table), None

    def compute_mask(self, inputs, mask=None):
        # Token ids get the padding mask; decoder outputs (reverse=True,
        # floats) get logits, which carry none (see `OutputProjection`).
        if self.pad_id is None or "float" in keras.backend.standardize_dtype(inputs.dtype):
            return None
        return ops.not_equal(inputs, self.pad_id)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.d_model,)

    def compute_output_spec(self, inputs, start_index=0, check_ids=True, reverse=False,
                            mask=None, training=None):
        if reverse:
            self._check_reverse_width(inputs)
            shape = tuple(inputs.shape[:-1]) + (self.vocab_size,)
            return keras.KerasTensor(shape, dtype="float32")
        self._check_ids_shape_and_dtype(inputs, start_index)
        if inputs.shape[1] is not None:  # a static length: its check needs no value
            check_sequence_length(inputs, self.sequence_length, f"PositionalEmbedding ({self.name})",
                                  start_index)
        shape = self.compute_output_shape(inputs.shape)
        return keras.KerasTensor(shape, dtype=self.compute_dtype)

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if "max_length" in config and "sequence_length" not in config:
            # Saved by an earlier version: the same setting under its old name.
            config["sequence_length"] = config.pop("max_length")
        return cls(**config)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocab_size": self.vocab_size,
                "d_model": self.d_model,
                "sequence_length": self.sequence_length,
                "pad_id": self.pad_id,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer
                ),
            }
        )
        return config
