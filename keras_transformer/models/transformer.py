"""The encoder-decoder Transformer, assembled with the functional API."""

import keras
import numpy as np
from keras import ops

from keras_transformer.deprecation import renamed_argument
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.id_range import check_integer_ids
from keras_transformer.layers.layer_normalization import LayerNormalization
from keras_transformer.layers.layer_normalization import layer_norm
from keras_transformer.layers.masks import padding_mask
from keras_transformer.layers.output_projection import OutputProjection
from keras_transformer.layers.positional_embedding import PositionalEmbedding
from keras_transformer.layers.transformer_decoder import TransformerDecoder
from keras_transformer.layers.transformer_decoder import cached_step_masks
from keras_transformer.layers.transformer_encoder import TransformerEncoder
from keras_transformer.models.checked_steps import CheckedXLASteps
from keras_transformer.models.presets import get_preset
from keras_transformer.validation import check_bool
from keras_transformer.validation import check_count
from keras_transformer.validation import check_rate

ENCODER_INPUTS = "encoder_inputs"
DECODER_INPUTS = "decoder_inputs"
# What `tie_embeddings` shares (OpenNMT-tf's EmbeddingsSharingLevel).
TIE_EMBEDDINGS = ("none", "target", "all")


def check_sizes(**sizes):
    """The size checks of `build_transformer`, callable before building.

    Args:
        **sizes: `build_transformer`'s int arguments by name (any subset of
            the vocabulary sizes, layer counts, `d_model`, `num_heads`,
            `dff`, `sequence_length`).

    Raises:
        ValueError: for a size that is not a positive whole number (a
            bool, a string or 2.5 included), a vocabulary of 4 ids or fewer
            (0-3 are padding, unknown, start and end), a `sequence_length`
            below 2 (a piece and the end id), or `num_heads` that does not
            divide `d_model`.
    """
    minimums = {"src_vocab_size": (5, ": ids 0-3 are padding, unknown, start and end"),
                "tgt_vocab_size": (5, ": ids 0-3 are padding, unknown, start and end"),
                "sequence_length": (2, ": a piece and the end id")}
    for name, value in sizes.items():
        minimum, why = minimums.get(name, (1, ""))
        try:
            check_count(value, name, minimum)
        except ValueError:
            raise ValueError(
                f"build_transformer needs a positive whole `{name}` of at least {minimum}{why}; "
                f"got {value!r}."
            ) from None
    d_model, num_heads = sizes.get("d_model"), sizes.get("num_heads")
    if d_model is not None and num_heads is not None and d_model % num_heads:
        raise ValueError(
            f"num_heads={num_heads} must divide d_model={d_model}; the paper "
            "uses d_model=512 with 8 heads (64 dimensions per head)."
        )


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(CheckedXLASteps, keras.Model):
    """The paper's encoder-decoder Transformer: a functional `keras.Model`
    that owns its layers and its step-by-step decoding calls.

    Encoder: `PositionalEmbedding` -> dropout -> `num_layers` x
    `TransformerEncoder`. Decoder: `PositionalEmbedding` -> dropout ->
    `num_decoder_layers` x `TransformerDecoder` (each attending to the
    encoder output) -> `OutputProjection` to target-vocabulary logits
    (figure 1). Padding masks are derived from the inputs (`pad_id`) inside
    the model, so callers pass token ids only. Construct it with
    `build_transformer` (same arguments), which documents them.

    As KerasHub's backbones do, the model keeps its layers as attributes
    (`encoder_embedding`, `decoder_embedding`, `logits_layer`,
    `encoder_embedding_dropout`, `decoder_embedding_dropout`,
    `encoder_layers`, `decoder_layers`, `encoder_final_norm`,
    `decoder_final_norm`), and decoding goes through `call_encoder` and
    `call_decoder_with_cache` (as KerasHub's seq2seq models).

    An id outside its vocabulary is an error in `fit`, `evaluate` and
    `predict` on every backend, including tensorflow with
    `jit_compile=True`, where the ids are checked around the XLA step
    (`CheckedXLASteps`).

    Call: `{"encoder_inputs": int32 (batch, src_len), "decoder_inputs":
    int32 (batch, tgt_len)}` -> float32 logits `(batch, tgt_len,
    tgt_vocab_size)`.

    Example:
    >>> import numpy as np
    >>> model = Transformer(100, 120, num_layers=1, d_model=16, num_heads=2,
    ...                     dff=32, sequence_length=10)
    >>> outputs, mask = model.call_encoder(np.array([[5, 6, 0]]))
    >>> tuple(outputs.shape), mask.numpy().tolist()
    ((1, 3, 16), [[True, True, False]])
    >>> caches = model.empty_self_attention_caches(1, 10)
    >>> logits, caches = model.call_decoder_with_cache(
    ...     np.array([2]), caches, 0, model.compute_cross_attention_caches(outputs), mask)
    >>> tuple(logits.shape)
    (1, 120)

    References:
        Vaswani et al. (2017), section 3 and figure 1.
    """

    def __init__(
        self,
        src_vocab_size,
        tgt_vocab_size,
        num_layers=6,
        d_model=512,
        num_heads=8,
        dff=2048,
        dropout_rate=0.1,
        sequence_length=256,
        *,
        attention_dropout_rate=None,
        activation_dropout_rate=0.0,
        tie_embeddings="none",
        num_decoder_layers=None,
        pad_id=0,
        norm_first=False,
        layer_norm_epsilon=1e-6,
        activation="relu",
        dtype=None,
        name="transformer",
        **kwargs,
    ):
        num_decoder_layers = num_layers if num_decoder_layers is None else num_decoder_layers
        if attention_dropout_rate is None:
            attention_dropout_rate = dropout_rate
        dropout_rate = check_rate(dropout_rate, "dropout_rate")
        attention_dropout_rate = check_rate(attention_dropout_rate, "attention_dropout_rate")
        activation_dropout_rate = check_rate(activation_dropout_rate, "activation_dropout_rate")
        check_sizes(
            src_vocab_size=src_vocab_size,
            tgt_vocab_size=tgt_vocab_size,
            num_layers=num_layers,
            num_decoder_layers=num_decoder_layers,
            d_model=d_model,
            num_heads=num_heads,
            dff=dff,
            sequence_length=sequence_length,
        )
        norm_first = check_bool(norm_first, "norm_first")
        if tie_embeddings not in TIE_EMBEDDINGS:
            raise ValueError(
                f"tie_embeddings must be one of {TIE_EMBEDDINGS}; got {tie_embeddings!r}."
            )
        try:
            whole = check_count(pad_id, "pad_id", minimum=0)
        except ValueError:
            whole = None
        if whole is None or whole >= min(int(src_vocab_size), int(tgt_vocab_size)):
            raise ValueError(
                "build_transformer needs `pad_id`, the padding id of both sides, a whole number below "
                f"both vocabulary sizes ({src_vocab_size}, {tgt_vocab_size}); got {pad_id!r}."
            )
        if dtype is not None:
            compute = keras.dtype_policies.get(dtype).compute_dtype
            if "float" not in str(compute):
                raise ValueError(
                    f"build_transformer's `dtype` is a float dtype policy ('float32', 'mixed_float16', "
                    f"'mixed_bfloat16', ...): the layers compute in it; got {dtype!r}."
                )
        if tie_embeddings == "all" and src_vocab_size != tgt_vocab_size:
            raise ValueError(
                "tie_embeddings='all' shares one table between source and target, so "
                f"the vocabularies must be one: got src_vocab_size={src_vocab_size} and "
                f"tgt_vocab_size={tgt_vocab_size}. Train one shared tokenizer "
                "(train --shared-vocab), or tie only the target side ('target')."
            )
        block_args = dict(
            num_heads=num_heads,
            dff=dff,
            dropout_rate=dropout_rate,
            attention_dropout_rate=attention_dropout_rate,
            activation_dropout_rate=activation_dropout_rate,
            activation=activation,
            layer_norm_epsilon=layer_norm_epsilon,
            norm_first=norm_first,
            dtype=dtype,
        )

        def embedding(vocab_size, layer_name):
            return PositionalEmbedding(
                vocab_size, d_model, sequence_length, pad_id=pad_id, dtype=dtype, name=layer_name
            )

        # === Layers and functional graph, in the order of the paper's
        # figure 1 (the order of making and calling fixes the initial
        # weights) ===
        encoder_inputs = keras.Input((None,), dtype="int32", name=ENCODER_INPUTS)
        decoder_inputs = keras.Input((None,), dtype="int32", name=DECODER_INPUTS)
        encoder_embedding = embedding(
            src_vocab_size, "shared_embedding" if tie_embeddings == "all" else "encoder_embedding"
        )
        x = encoder_embedding(encoder_inputs)
        encoder_embedding_dropout = Dropout(dropout_rate, dtype=dtype, name="encoder_embedding_dropout")
        x = encoder_embedding_dropout(x)
        encoder_layers = []
        for i in range(num_layers):
            encoder_layers.append(TransformerEncoder(name=f"encoder_layer_{i}", **block_args))
            x = encoder_layers[-1](x)
        encoder_final_norm = decoder_final_norm = None
        if norm_first:
            encoder_final_norm = LayerNormalization(
                epsilon=layer_norm_epsilon, dtype=dtype, name="encoder_final_norm"
            )
            x = encoder_final_norm(x)

        if tie_embeddings == "all":
            decoder_embedding = encoder_embedding
        else:
            decoder_embedding = embedding(tgt_vocab_size, "decoder_embedding")
        y = decoder_embedding(decoder_inputs)
        decoder_embedding_dropout = Dropout(dropout_rate, dtype=dtype, name="decoder_embedding_dropout")
        y = decoder_embedding_dropout(y)
        decoder_layers = []
        for i in range(num_decoder_layers):
            decoder_layers.append(TransformerDecoder(name=f"decoder_layer_{i}", **block_args))
            y = decoder_layers[-1](y, x)
        if norm_first:
            decoder_final_norm = LayerNormalization(
                epsilon=layer_norm_epsilon, dtype=dtype, name="decoder_final_norm"
            )
            y = decoder_final_norm(y)
        if tie_embeddings == "none":
            logits_layer = OutputProjection(tgt_vocab_size, dtype=dtype, name="logits")
            logits = logits_layer(y)
        else:  # tied (section 3.4)
            logits_layer = decoder_embedding
            logits = decoder_embedding(y, reverse=True)
        super().__init__(
            inputs={ENCODER_INPUTS: encoder_inputs, DECODER_INPUTS: decoder_inputs},
            outputs=logits,
            name=name,
            **kwargs,
        )

        # === Layers as attributes (after the functional init) ===
        self.encoder_embedding = encoder_embedding
        self.decoder_embedding = decoder_embedding
        self.logits_layer = logits_layer
        self.encoder_embedding_dropout = encoder_embedding_dropout
        self.decoder_embedding_dropout = decoder_embedding_dropout
        self.encoder_layers = encoder_layers
        self.decoder_layers = decoder_layers
        self.encoder_final_norm = encoder_final_norm
        self.decoder_final_norm = decoder_final_norm

        # === Config ===
        self.src_vocab_size = int(src_vocab_size)
        self.tgt_vocab_size = int(tgt_vocab_size)
        self.num_layers = int(num_layers)
        self.num_decoder_layers = int(num_decoder_layers)
        self.d_model = int(d_model)
        self.num_heads = int(num_heads)
        self.key_dim = self.d_model // self.num_heads
        self.dff = int(dff)
        self.dropout_rate = dropout_rate
        self.attention_dropout_rate = attention_dropout_rate
        self.activation_dropout_rate = activation_dropout_rate
        self.sequence_length = int(sequence_length)
        self.tie_embeddings = tie_embeddings
        self.pad_id = int(pad_id)
        self.norm_first = bool(norm_first)
        self.layer_norm_epsilon = layer_norm_epsilon
        self.activation = activation
        # The policy the layers were built with (the global one when None),
        # so that a `.keras` file reloads with it whatever the global
        # policy is then, as Keras's own layers do.
        self._layer_dtype = keras.config.dtype_policy().name if dtype is None else dtype
        if dtype is not None:
            # The model's own policy too (a functional model's is the global
            # one): `compile` wraps the optimizer in a `LossScaleOptimizer`
            # when it is mixed_float16; with float32 here, float16 gradients
            # went unscaled.
            self.dtype_policy = keras.dtype_policies.get(dtype)

    def get_config(self):
        activation = self.activation
        if not isinstance(activation, str):
            activation = keras.activations.serialize(activation)
        dtype = self._layer_dtype
        if dtype is not None and not isinstance(dtype, str):
            dtype = keras.dtype_policies.serialize(dtype)
        return {
            "name": self.name,
            "trainable": self.trainable,
            "src_vocab_size": self.src_vocab_size,
            "tgt_vocab_size": self.tgt_vocab_size,
            "num_layers": self.num_layers,
            "d_model": self.d_model,
            "num_heads": self.num_heads,
            "dff": self.dff,
            "dropout_rate": self.dropout_rate,
            "sequence_length": self.sequence_length,
            "attention_dropout_rate": self.attention_dropout_rate,
            "activation_dropout_rate": self.activation_dropout_rate,
            "tie_embeddings": self.tie_embeddings,
            "num_decoder_layers": self.num_decoder_layers,
            "pad_id": self.pad_id,
            "norm_first": self.norm_first,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "activation": activation,
            "dtype": dtype,
        }

    def call(self, inputs, training=None, mask=None, **kwargs):
        """The functional graph, once the inputs are checked to be integer
        ids: Keras's functional inputs would cast float ids to int32,
        truncating 3.7 to 3 without a word.

        Raises:
            TypeError: for float, bool or string ids.
        """
        if isinstance(inputs, dict):  # other structures: Keras's own error
            for name, ids in inputs.items():
                check_integer_ids(ids, f"The model's `{name}`")
        return super().call(inputs, training=training, mask=mask, **kwargs)

    def predict(self, x, *args, **kwargs):
        """`keras.Model.predict`; inputs of different numbers of rows are a
        clear ValueError (Keras's own check fails on them without labels,
        with "'str' object has no attribute 'shape'"), and inputs of no row
        give float32 logits `(0, T, tgt_vocab_size)` (Keras's `predict`
        fails on them with an `UnboundLocalError`)."""
        if isinstance(x, dict):
            rows = {name: value.shape[0] for name, value in x.items() if len(getattr(value, "shape", ())) > 0}
            if len(set(rows.values())) > 1:
                raise ValueError(f"predict's inputs must have one row per sentence each; got {rows} rows.")
            decoder_inputs = x.get(DECODER_INPUTS)
            if set(rows.values()) == {0} and len(getattr(decoder_inputs, "shape", ())) == 2:
                return np.zeros((0, decoder_inputs.shape[1], self.tgt_vocab_size), "float32")
        return super().predict(x, *args, **kwargs)

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("activation"), dict):
            config["activation"] = keras.activations.deserialize(config["activation"])
        return cls(**config)

    # === Ids checked around an XLA step (`CheckedXLASteps`) ===

    def checked_id_inputs(self):
        """`{input name: vocab_size}` of the two id inputs, in input order."""
        return {ENCODER_INPUTS: self.src_vocab_size, DECODER_INPUTS: self.tgt_vocab_size}

    def checked_input_lengths(self):
        """`{input name: sequence_length}` of the two id inputs."""
        return {ENCODER_INPUTS: self.encoder_embedding.sequence_length,
                DECODER_INPUTS: self.decoder_embedding.sequence_length}

    def checked_label_input(self):
        """The labels are the decoder inputs shifted by one: the same `(batch, T)`."""
        return DECODER_INPUTS

    def checked_labels(self):
        """`(tgt_vocab_size, pad_id)` when the compiled loss (alone, or the one
        loss of a list or dict) masks labels by a `pad_id`
        (`MaskedSparseCategoricalCrossentropy`), else None."""
        losses = keras.tree.flatten(getattr(self, "loss", None))
        pad_ids = [getattr(loss, "pad_id", None) for loss in losses]
        if len(pad_ids) != 1 or pad_ids[0] is None:
            return None
        return self.tgt_vocab_size, int(pad_ids[0])

    # === Step-by-step decoding ===
    # One source is encoded once; the decoder then runs one position per
    # call against a key/value cache per layer: self-attention keys and
    # values written at the step's index, cross-attention keys and values
    # computed once per source (`TransformerDecoder`'s cached call).

    def call_encoder(self, encoder_inputs):
        """The encoder stack on a batch of sources.

        Args:
            encoder_inputs: int `(batch, source_length)` ids, padded with
                `pad_id`.

        Returns:
            `(encoder_outputs, encoder_outputs_mask)`: float `(batch,
            source_length, d_model)` in the compute dtype and bool `(batch,
            source_length)`, True at tokens.
        """
        mask = padding_mask(encoder_inputs, self.pad_id)
        x = self.encoder_embedding(encoder_inputs)
        for layer in self.encoder_layers:
            x = layer(x, mask=mask)
        if self.encoder_final_norm is not None:
            x = self.encoder_final_norm(x)
        return x, mask

    def compute_cross_attention_caches(self, encoder_outputs):
        """Per decoder layer, the cross-attention `(key (batch, heads,
        key_dim, source_length), value (batch, heads, source_length,
        key_dim))` of `encoder_outputs` (float `(batch, source_length,
        d_model)`)."""
        return [layer.precompute_cross_attention_cache(encoder_outputs) for layer in self.decoder_layers]

    def empty_self_attention_caches(self, batch_size, length, dtype=None):
        """Per decoder layer, zero self-attention `(key (batch, heads,
        key_dim, length), value (batch, heads, length, key_dim))` caches
        for `length` output positions, in `dtype` (default: the compute
        dtype).

        Raises:
            ValueError: for a Python `batch_size` or `length` that is not a
                positive whole number, or a `length` beyond the decoder's
                `sequence_length` (positions it has no encoding for).
        """
        python = (int, float, np.number)
        if isinstance(batch_size, python):
            check_count(batch_size, "batch_size")
        limit = self.decoder_embedding.sequence_length
        if isinstance(length, python) and check_count(length, "length") > limit:
            raise ValueError(f"`length` is at most the decoder's sequence_length, {limit}; got {length}.")
        return [layer.empty_cache(batch_size, length, dtype) for layer in self.decoder_layers]

    def grow_self_attention_caches(self, caches, length):
        """`caches` (from `empty_self_attention_caches`) padded with zero
        slots at the end to `length` output positions."""
        return [layer.grow_cache(cache, length) for layer, cache in zip(self.decoder_layers, caches)]

    def _check_cached_step(self, token_ids, caches, index, encoder_outputs_mask, growing_cache,
                           beams_per_source):
        """`call_decoder_with_cache`'s checks of what is known in Python (a
        search's traced loop passes tensors and is not checked here)."""
        if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
            slots = None if growing_cache else caches[0][0].shape[-1]
            limit = self.decoder_embedding.sequence_length if slots is None else slots
            if not 0 <= index < limit:
                what = f"the caches' {slots} slots" if slots is not None else f"sequence_length {limit}"
                raise ValueError(
                    f"`self_attention_cache_update_index` must be a position in [0, {limit}) ({what}); "
                    f"got {index}."
                )
        rows = token_ids.shape[0] if len(getattr(token_ids, "shape", ())) else None
        cache_rows = caches[0][0].shape[0]
        sources = encoder_outputs_mask.shape[0]
        if None not in (rows, cache_rows) and rows != cache_rows:
            raise ValueError(f"`token_ids` has {rows} rows and the self-attention caches {cache_rows}: "
                             "one cache row per token.")
        if None not in (rows, sources) and rows != sources * int(beams_per_source):
            raise ValueError(
                f"`token_ids` has {rows} rows, and `encoder_outputs_mask` {sources} sources at "
                f"beams_per_source={beams_per_source}: give {sources * int(beams_per_source)} tokens, "
                "one per hypothesis of each source."
            )

    def decoding_weights(self, fold_tied_transpose=False):
        """The weights of `call_decoder_with_cache`, read once: the target
        token table (`PositionalEmbedding.decoding_weights`), per decoder
        layer its `decoding_weights()`, the output projection's `(kernel,
        bias or None, transposed)` and the final LayerNorm's `(gamma, beta)`
        (pre-LN; else None). Build them once, before a decoding loop, and
        pass them to every call.

        Args:
            fold_tied_transpose: bool. With tied embeddings (section 3.4)
                the output kernel is the token table `(vocab, d_model)`
                transposed. False: transposed here, once (a copy the size
                of the table); True: the table itself with `transposed`
                True, and each step multiplies by its transpose, which XLA
                folds into the product (no copy). TensorFlow's graph
                executor runs the plain product faster; XLA saves the copy.
        """
        final_norm = self.decoder_final_norm
        table = self.decoder_embedding.decoding_weights()
        return {
            "embedding": table,
            "layers": [layer.decoding_weights() for layer in self.decoder_layers],
            "logits": self._logits_weights(table, fold_tied_transpose),
            "final_norm": None if final_norm is None else (
                ops.cast(final_norm.gamma, "float32"), ops.cast(final_norm.beta, "float32")),
        }

    def _logits_weights(self, table, fold_tied_transpose):
        """`(kernel, bias or None, transposed)` (see `decoding_weights`)."""
        tied = self.logits_layer is self.decoder_embedding
        if tied and fold_tied_transpose and table is not None:
            return table, None, True
        # A quantized or LoRA table (`table` None) is read by the layer.
        weights = self.logits_layer.output_weights(table) if tied else self.logits_layer.output_weights()
        return (*weights, False)

    def call_decoder_with_cache(
        self,
        token_ids,
        self_attention_caches,
        self_attention_cache_update_index,
        cross_attention_caches,
        encoder_outputs_mask,
        *,
        return_attention_scores=False,
        decoding_weights=None,
        growing_cache=False,
        beams_per_source=1,
    ):
        """The decoder stack on one target position, with the caches.

        Args:
            token_ids: int `(batch,)`, the tokens at the position, in `[0,
                tgt_vocab_size)` (not checked here: a search checks its
                start id once, see `check_id_range`).
            self_attention_caches: list (one per decoder layer) of `(key,
                value)` from `empty_self_attention_caches`.
            self_attention_cache_update_index: scalar int, the position.
            cross_attention_caches: list from
                `compute_cross_attention_caches`.
            encoder_outputs_mask: bool `(batch, source_length)`.
            return_attention_scores: bool, also return the last decoder
                layer's cross-attention weights `(batch, heads,
                source_length)`.
            decoding_weights: `decoding_weights()`; computed here if omitted.
            growing_cache: bool, the caches hold positions `0..index - 1`
                only and grow by one a call (the TensorFlow decoding fast
                path, `keras_transformer.decoding.growing_cache`).
            beams_per_source: int (default 1), rows of `token_ids` per row
                of the cross-attention caches and `encoder_outputs_mask`
                (beam search: the beam size; hypothesis j of source b is
                row `b * beams_per_source + j`).

        Returns:
            `(logits (batch, tgt_vocab_size) float32, self_attention_caches)`
            with the caches updated, plus the attention weights if asked.

        Raises:
            ValueError: for an index that is a Python or NumPy integer
                outside the fixed-size caches' slots (negative, or at or
                past their length), or static batch sizes that disagree.
        """
        index = self_attention_cache_update_index
        self._check_cached_step(token_ids, self_attention_caches, index, encoder_outputs_mask,
                                growing_cache, beams_per_source)
        weights = decoding_weights or self.decoding_weights()
        # Slots of a fixed-size cache (keys transposed: the last axis); a
        # growing cache has no slots to mask.
        slots = None if growing_cache else ops.shape(self_attention_caches[0][0])[-1]
        masks = cached_step_masks(index, slots, encoder_outputs_mask, growing=growing_cache)
        x = ops.expand_dims(self.decoder_embedding.step(token_ids, index, weights["embedding"]), 1)
        new_caches = []
        attention = None
        for layer, layer_weights, self_cache, cross_cache in zip(
            self.decoder_layers, weights["layers"], self_attention_caches, cross_attention_caches
        ):
            outputs = layer(
                x,
                encoder_outputs_mask=encoder_outputs_mask,
                self_attention_cache=self_cache,
                self_attention_cache_update_index=index,
                cross_attention_cache=cross_cache,
                return_attention_scores=return_attention_scores,
                decoding_weights=layer_weights,
                cache_masks=masks,
                beams_per_source=beams_per_source,
            )
            x = outputs[0]
            if return_attention_scores:
                attention = outputs[2]
            new_caches.append(outputs[1])
        x = x[:, 0, :]
        if self.decoder_final_norm is not None:
            x = layer_norm(x, *weights["final_norm"], self.decoder_final_norm.epsilon)
        kernel, bias, transposed = weights["logits"]
        logits = ops.matmul(x, ops.transpose(kernel) if transposed else kernel)
        logits = ops.cast(logits if bias is None else logits + bias, "float32")
        if return_attention_scores:
            return logits, new_caches, attention
        return logits, new_caches


def build_transformer(
    src_vocab_size,
    tgt_vocab_size,
    num_layers=6,
    d_model=512,
    num_heads=8,
    dff=2048,
    dropout_rate=0.1,
    sequence_length=None,
    *,
    attention_dropout_rate=None,
    activation_dropout_rate=0.0,
    tie_embeddings="none",
    num_decoder_layers=None,
    pad_id=0,
    norm_first=False,
    layer_norm_epsilon=1e-6,
    activation="relu",
    dtype=None,
    name="transformer",
    max_length=None,
):
    """Build the paper's encoder-decoder Transformer as a `keras.Model`.

    Encoder: `PositionalEmbedding` -> dropout -> `num_layers` x
    `TransformerEncoder`. Decoder: `PositionalEmbedding` -> dropout ->
    `num_decoder_layers` x `TransformerDecoder` (each attending to the
    encoder output) -> `OutputProjection` to target-vocabulary logits.
    Padding masks are derived from the inputs (`pad_id`) inside the model
    and carried through every block, so callers pass token ids only.

    Layer names are stable, so weight files keep their paths
    (`encoder_embedding`, `encoder_layer_{i}`, `decoder_embedding`,
    `decoder_layer_{i}`, `logits`, and `encoder_final_norm` /
    `decoder_final_norm` with `norm_first`); with tied embeddings the
    decoder embedding is also the output projection (no `logits` layer),
    and with `tie_embeddings="all"` one `shared_embedding` layer replaces
    both embeddings. The model reaches its layers through attributes
    (`Transformer`), never by these names.

    Args:
        src_vocab_size: int, source vocabulary size.
        tgt_vocab_size: int, target vocabulary size.
        num_layers: int, encoder blocks (and decoder blocks unless
            `num_decoder_layers` is given); paper: 6.
        d_model: int, model width; paper: 512.
        num_heads: int, attention heads, must divide `d_model`; paper: 8.
        dff: int, feed-forward inner width; paper: 2048.
        dropout_rate: float, dropout on the embeddings and on every
            sub-layer output before the residual add (section 5.4); paper:
            0.1.
        sequence_length: int, longest source or target sequence in tokens
            (the rows of the position tables); default 256. `max_length` is
            its deprecated old name.
        attention_dropout_rate: float, dropout on the attention weights;
            default `dropout_rate`.
        activation_dropout_rate: float, dropout on the feed-forward inner
            activation; default 0 (the paper has none).
        tie_embeddings: what shares one weight matrix (section 3.4; Press
            and Wolf, 2017): `"none"` (default), `"target"` (the decoder
            embedding and the pre-softmax projection) or `"all"` (the
            source embedding too, which needs one vocabulary for both
            sides: `src_vocab_size == tgt_vocab_size`).
        num_decoder_layers: int, decoder blocks; default `num_layers`.
        pad_id: int, padding id of both vocabularies.
        norm_first: bool, pre-LN blocks plus a final LayerNorm per stack.
        layer_norm_epsilon: float.
        activation: feed-forward activation.
        dtype: dtype policy name for every layer (e.g. `"mixed_bfloat16"`),
            default the global policy.
        name: model name.

    Returns:
        A `Transformer` (a functional `keras.Model`) taking
        `{"encoder_inputs": int32 (batch, src_len), "decoder_inputs": int32
        (batch, tgt_len)}` and returning float32 logits `(batch, tgt_len,
        tgt_vocab_size)`.

    Raises:
        ValueError: for non-positive sizes, `num_heads` not dividing
            `d_model`, an unknown `tie_embeddings`, `"all"` with two
            vocabulary sizes, a `pad_id` that is not an id of both
            vocabularies, a `norm_first` that is not a bool, or a `dtype`
            policy that does not compute in floats.

    Example:
    >>> import numpy as np
    >>> model = build_transformer(100, 120, num_layers=1, d_model=16,
    ...                           num_heads=2, dff=32, sequence_length=10)
    >>> tuple(model({"encoder_inputs": np.array([[5, 6, 0]]),
    ...              "decoder_inputs": np.array([[2, 7]])}).shape)
    (1, 2, 120)
    >>> sizes = dict(num_layers=1, d_model=16, num_heads=2, dff=32, sequence_length=10)
    >>> untied = build_transformer(100, 100, **sizes)
    >>> tied = build_transformer(100, 100, tie_embeddings="all", **sizes)
    >>> untied.count_params() - tied.count_params()  # a table, a kernel, a bias
    3300

    References:
        Vaswani et al. (2017), section 3 and figure 1.
    """
    sequence_length = renamed_argument(
        "build_transformer", "sequence_length", sequence_length, "max_length", max_length, 256)
    return Transformer(
        src_vocab_size,
        tgt_vocab_size,
        num_layers=num_layers,
        d_model=d_model,
        num_heads=num_heads,
        dff=dff,
        dropout_rate=dropout_rate,
        sequence_length=sequence_length,
        attention_dropout_rate=attention_dropout_rate,
        activation_dropout_rate=activation_dropout_rate,
        tie_embeddings=tie_embeddings,
        num_decoder_layers=num_decoder_layers,
        pad_id=pad_id,
        norm_first=norm_first,
        layer_norm_epsilon=layer_norm_epsilon,
        activation=activation,
        dtype=dtype,
        name=name,
    )


def build_from_preset(preset, src_vocab_size, tgt_vocab_size, **overrides):
    """An untrained `build_transformer` model with the sizes of a named
    preset (see `PRESETS`), its weights freshly initialized. To load trained
    weights, use `keras_transformer.load_run` (a run folder) or
    `keras_transformer.load_translator` (a run or a SavedModel).

    Example:
    >>> model = build_from_preset("tiny", 1000, 1000, sequence_length=32)
    """
    config = get_preset(preset, **overrides)
    return build_transformer(src_vocab_size, tgt_vocab_size, **config)
