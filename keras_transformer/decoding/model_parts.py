"""A built Transformer, wired for step-by-step decoding."""

import keras
from keras import ops

from keras_transformer.decoding.growing_cache import empty_growing_cache
from keras_transformer.models.conversion import as_transformer


# Slots of the fixed-size self-attention caches in a search's first phase
# (`TransformerParts.cache_phases`).
FIRST_PHASE = 16


def phase_lengths(length, first=None):
    """Slots of the fixed-size caches in each phase of a search: `first`
    (default `FIRST_PHASE`), doubling, and `length` last.

    >>> phase_lengths(64), phase_lengths(40), phase_lengths(10)
    ([16, 32, 64], [16, 32, 40], [10])
    """
    first = FIRST_PHASE if first is None else int(first)
    sizes = []
    while first < length:
        sizes.append(first)
        first *= 2
    return sizes + [length]


def transposed_output_table(model):
    """A copy of the tied token table's transpose, for
    `TransformerParts(output_kernel=...)`.

    A tied output projection (section 3.4; Press & Wolf 2017) multiplies
    the decoder outputs by the transpose of the `(vocab, d_model)` token
    table. In a search that product reads the whole table every step, and
    on a CPU it runs about twice as fast on a table stored as `(d_model,
    vocab)` as on the transpose of one stored as `(vocab, d_model)`; a
    transposed copy taken in every search costs more than it saves at
    small batches. This copy is taken once. It is a snapshot: later
    changes to the model's weights do not reach it.

    Args:
        model: a `Transformer` (from `build_transformer`).

    Returns:
        A non-trainable `keras.Variable` of shape `(d_model, vocab)` in the
        table's storage dtype, holding the table's transpose; None when the
        model's output projection is not a tied plain table (untied: its
        kernel has that layout already; quantized or with LoRA weights).

    Example:
    >>> from keras_transformer import build_transformer
    >>> model = build_transformer(40, 40, num_layers=1, d_model=8, num_heads=2, dff=16,
    ...                           sequence_length=8, tie_embeddings="all")
    >>> tuple(transposed_output_table(model).shape)
    (8, 40)
    >>> untied = build_transformer(40, 40, num_layers=1, d_model=8, num_heads=2, dff=16,
    ...                            sequence_length=8, tie_embeddings="none")
    >>> transposed_output_table(untied) is None
    True
    """
    model = as_transformer(model)
    layer = model.decoder_embedding
    if model.logits_layer is not layer:
        return None
    table = layer.token_embedding
    if table.quantization_mode is not None or table.lora_enabled:
        return None
    embeddings = table.embeddings
    return keras.Variable(
        ops.transpose(ops.convert_to_tensor(embeddings)), dtype=embeddings.dtype,
        trainable=False, name="output_kernel_transposed",
    )


class TransformerParts:
    """A `Transformer` and the cache layout a search decodes it with.

    A search calls the model's own `call_encoder` once per source and its
    `call_decoder_with_cache` once per output position, through this view,
    which adds one choice: fixed-size self-attention caches (every
    backend, XLA) or caches that grow by one position a step (tensorflow
    without XLA: `keras_transformer.decoding.growing_cache`).

    Args:
        model: a `Transformer` (from `build_transformer`); a plain
            functional model saved by an earlier version is converted
            (`as_transformer`).
        pad_id: int, padding id of the source; must be the model's.
        growing_cache: bool, grow the self-attention caches a step.
        output_kernel: optional `(d_model, tgt_vocab_size)` variable from
            `transposed_output_table(model)`: the tied output projection
            (section 3.4) then multiplies by this copy of the token table's
            transpose instead of transposing the table (or folding the
            transpose into the product) in every search. It must hold the
            table's current values: a copy taken before the weights changed
            gives logits of the old table.

    Raises:
        ValueError: if `model` is not a Transformer, `pad_id` differs
            from the model's, or `output_kernel` is given for a model
            without a tied output projection or has another shape.
    """

    # `decode_step` returns logits, which the searches log-softmax.
    returns_log_probs = False

    def __init__(self, model, pad_id=0, growing_cache=False, output_kernel=None):
        model = as_transformer(model)
        if int(pad_id) != model.pad_id:
            raise ValueError(
                f"The source pads with id {pad_id} but the model {model.name!r} was built "
                f"with pad_id={model.pad_id}; use the tokenizers the model was trained with."
            )
        self.model = model
        self.pad_id = model.pad_id
        self.growing_cache = bool(growing_cache)
        if output_kernel is not None:
            if model.logits_layer is not model.decoder_embedding:
                raise ValueError(
                    f"`output_kernel` replaces the transposed token table of a tied output "
                    f"projection, but the model {model.name!r} has its own output kernel "
                    "(tie_embeddings='none'); drop `output_kernel`."
                )
            expected = (model.d_model, model.tgt_vocab_size)
            if tuple(output_kernel.shape) != expected:
                raise ValueError(
                    f"`output_kernel` must have shape {expected} (d_model, tgt_vocab_size), the "
                    f"transposed token table; got {tuple(output_kernel.shape)}. Make it with "
                    "`transposed_output_table(model)`."
                )
        self.output_kernel = output_kernel
        self.encoder_embedding = model.encoder_embedding
        self.decoder_embedding = model.decoder_embedding
        self.decoder_layers = model.decoder_layers
        self.target_sequence_length = model.decoder_embedding.sequence_length
        self.source_sequence_length = model.encoder_embedding.sequence_length
        self.vocab_size = model.tgt_vocab_size
        self.num_heads = model.num_heads
        self.key_dim = model.key_dim

    def encode(self, source_ids):
        """`Transformer.call_encoder`: `(outputs (batch, S, d_model), mask
        (batch, S))`."""
        return self.model.call_encoder(source_ids)

    def cross_caches(self, encoder_outputs):
        """`Transformer.compute_cross_attention_caches`."""
        return self.model.compute_cross_attention_caches(encoder_outputs)

    def empty_self_caches(self, batch_size, length, dtype):
        """Per decoder layer zero `(key (batch, heads, key_dim, length), value
        (batch, heads, length, key_dim))` caches; growing: `(key (batch,
        heads, 0, key_dim), value (batch, heads, 0, key_dim))`."""
        if self.growing_cache:
            return [
                empty_growing_cache(batch_size, self.num_heads, self.key_dim, dtype)
                for _ in self.decoder_layers
            ]
        return self.model.empty_self_attention_caches(batch_size, length, dtype)

    def cache_phases(self, length):
        """Slots of the self-attention caches in each phase of a search of
        up to `length` positions.

        Fixed-size caches (XLA, JAX, torch) start with `phase_lengths`'
        first size, and the search pads them with empty slots
        (`grow_self_caches`) when a step reaches the end: a step then
        writes, attends over and reorders the slots it can reach rather
        than all `length`, at the cost of one copy of the loop per phase in
        the compiled program. An empty slot's attention weight is exactly
        zero either way. Growing caches have one phase.

        Returns:
            list of int, increasing, the last `length`.
        """
        return [length] if self.growing_cache else phase_lengths(length)

    def grow_self_caches(self, self_caches, length):
        """`self_caches` (fixed-size, from `empty_self_caches`) padded with
        zero slots at the end to `length` slots
        (`Transformer.grow_self_attention_caches`)."""
        return self.model.grow_self_attention_caches(self_caches, length)

    def decoding_weights(self):
        """`Transformer.decoding_weights`: build them once, before the
        decoding loop, and pass them to every `decode_step`. With fixed-size
        caches (XLA, JAX, torch) a tied output projection multiplies by the
        transposed table in each step (`fold_tied_transpose`); the graph of
        growing caches takes a transposed copy once. With `output_kernel`
        the projection reads that copy, made before any search.

        Raises:
            ValueError: if the token table was quantized or given LoRA
                weights after `output_kernel` was copied from it.
        """
        weights = self.model.decoding_weights(
            fold_tied_transpose=not self.growing_cache or self.output_kernel is not None
        )
        if self.output_kernel is not None:
            table = weights["embedding"]
            if table is None:
                raise ValueError(
                    "The model's token table was quantized or given LoRA weights after "
                    "`output_kernel` was copied from it; build the TransformerParts (or the "
                    "Translator) again."
                )
            weights["logits"] = (ops.cast(self.output_kernel, table.dtype), None, False)
        return weights

    def decode_step(self, token_ids, index, self_caches, cross_caches, encoder_outputs_mask,
                    return_attention_scores=False, weights=None, beams_per_source=1):
        """One decoder position with the cache
        (`Transformer.call_decoder_with_cache`).

        Args:
            token_ids: int `(batch,)`, the tokens at position `index`, in
                `[0, vocab_size)` (not checked here: see `check_id_range`).
            index: scalar int, their position.
            self_caches: list of `(key, value)` from `empty_self_caches`.
            cross_caches: list of `(key, value)` from `cross_caches`.
            encoder_outputs_mask: bool `(sources, S)`.
            weights: `decoding_weights()`; computed here if omitted.
            beams_per_source: int, rows of `token_ids` per source (row of
                `cross_caches` and `encoder_outputs_mask`): `batch =
                sources * beams_per_source`.

        Returns:
            `(logits (batch, vocab) float32, new self_caches)`, plus the last
            layer's cross-attention weights `(batch, heads, S)` if asked.
        """
        return self.model.call_decoder_with_cache(
            token_ids, self_caches, index, cross_caches, encoder_outputs_mask,
            return_attention_scores=return_attention_scores, decoding_weights=weights,
            growing_cache=self.growing_cache, beams_per_source=beams_per_source,
        )

    def decode_uncached(self, source_ids, target_ids):
        """The full model on a whole prefix: logits `(batch, T, vocab)`."""
        return self.model(
            {"encoder_inputs": source_ids, "decoder_inputs": target_ids}, training=False
        )
