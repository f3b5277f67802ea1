"""The encoder-decoder Transformer, assembled with the functional API."""

import keras

from keras_transformer.deprecation import renamed_argument
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.layer_normalization import LayerNormalization
from keras_transformer.layers.output_projection import OutputProjection
from keras_transformer.layers.positional_embedding import PositionalEmbedding
from keras_transformer.layers.transformer_decoder import TransformerDecoder
from keras_transformer.layers.transformer_encoder import TransformerEncoder
from keras_transformer.models.presets import get_preset

ENCODER_INPUTS = "encoder_inputs"
DECODER_INPUTS = "decoder_inputs"
# What `tie_embeddings` shares (OpenNMT-tf's EmbeddingsSharingLevel).
TIE_EMBEDDINGS = ("none", "target", "all")


def embedding_layers(model):
    """`(encoder_embedding, decoder_embedding, output_layer)` of a
    `build_transformer` model; tied weights make two or three of them one
    `PositionalEmbedding` (see `tie_embeddings`).

    Raises:
        ValueError: if `model` lacks the layers `build_transformer` names.
    """
    layers = {layer.name: layer for layer in model.layers}
    shared = layers.get("shared_embedding")
    encoder = layers.get("encoder_embedding", shared)
    decoder = layers.get("decoder_embedding", shared)
    output = layers.get("logits", decoder)
    if encoder is None or decoder is None:
        raise ValueError(
            "Decoding needs a model made by keras_transformer.build_transformer "
            "(layers encoder_embedding, decoder_embedding and logits, or "
            f"shared_embedding); {model.name!r} has {sorted(layers)}."
        )
    return encoder, decoder, output


class TransformerLayers:
    """The layers of a `build_transformer` model, in the order they run.

    The one place that knows `build_transformer`'s layer names; step-by-step
    decoding (`decoding.model_parts`) and the training fast path
    (`keras_transformer.fast_path`) both read the model through it.

    Attributes:
        encoder_embedding, decoder_embedding: `PositionalEmbedding` (one
            layer under `tie_embeddings="all"`).
        logits_layer: the `OutputProjection`, or the decoder embedding when
            it is tied to the output.
        encoder_embedding_dropout, decoder_embedding_dropout: their
            `keras.layers.Dropout` layers.
        encoder_layers, decoder_layers: lists of `TransformerEncoder` and
            `TransformerDecoder` blocks.
        encoder_final_norm, decoder_final_norm: `LayerNormalization` of
            pre-LN stacks, else None.

    Raises:
        ValueError: if `model` lacks the layers `build_transformer` names.
    """

    def __init__(self, model):
        self.encoder_embedding, self.decoder_embedding, self.logits_layer = (
            embedding_layers(model)
        )
        layers = {layer.name: layer for layer in model.layers}
        names = [layer.name for layer in model.layers]
        self.encoder_layers = [layers[n] for n in names if n.startswith("encoder_layer_")]
        self.decoder_layers = [layers[n] for n in names if n.startswith("decoder_layer_")]
        if not self.encoder_layers or not self.decoder_layers:
            raise ValueError(
                "Expected a model made by keras_transformer.build_transformer, with "
                f"layers encoder_layer_0... and decoder_layer_0...; {model.name!r} has "
                f"{sorted(layers)}."
            )
        self.encoder_embedding_dropout = layers.get("encoder_embedding_dropout")
        self.decoder_embedding_dropout = layers.get("decoder_embedding_dropout")
        self.encoder_final_norm = layers.get("encoder_final_norm")
        self.decoder_final_norm = layers.get("decoder_final_norm")


def check_sizes(**sizes):
    """The size checks of `build_transformer`, callable before building.

    Args:
        **sizes: `build_transformer`'s int arguments by name (any subset of
            the vocabulary sizes, layer counts, `d_model`, `num_heads`,
            `dff`, `sequence_length`).

    Raises:
        ValueError: for a size that is not positive, or `num_heads` that
            does not divide `d_model`.
    """
    for name, value in sizes.items():
        if value is None or int(value) <= 0:
            raise ValueError(
                f"build_transformer needs a positive `{name}`; got {value!r}."
            )
    d_model, num_heads = sizes.get("d_model"), sizes.get("num_heads")
    if d_model is not None and num_heads is not None and d_model % num_heads:
        raise ValueError(
            f"num_heads={num_heads} must divide d_model={d_model}; the paper "
            "uses d_model=512 with 8 heads (64 dimensions per head)."
        )


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

    Layer names are stable (`encoder_embedding`, `encoder_layer_{i}`,
    `decoder_embedding`, `decoder_layer_{i}`, `logits`, and
    `encoder_final_norm` / `decoder_final_norm` with `norm_first`);
    with tied embeddings the decoder embedding is also the output
    projection (no `logits` layer), and with `tie_embeddings="all"` one
    `shared_embedding` layer replaces both embeddings (`embedding_layers`
    finds them).

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
        A functional `keras.Model` taking `{"encoder_inputs": int32 (batch,
        src_len), "decoder_inputs": int32 (batch, tgt_len)}` and returning
        float32 logits `(batch, tgt_len, tgt_vocab_size)`.

    Raises:
        ValueError: for non-positive sizes, `num_heads` not dividing
            `d_model`, an unknown `tie_embeddings`, or `"all"` with two
            vocabulary sizes.

    Example:
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
    num_decoder_layers = num_layers if num_decoder_layers is None else num_decoder_layers
    sequence_length = renamed_argument(
        "build_transformer", "sequence_length", sequence_length, "max_length", max_length, 256)
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
    if tie_embeddings not in TIE_EMBEDDINGS:
        raise ValueError(
            f"tie_embeddings must be one of {TIE_EMBEDDINGS}; got {tie_embeddings!r}."
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
    encoder_inputs = keras.Input((None,), dtype="int32", name=ENCODER_INPUTS)
    decoder_inputs = keras.Input((None,), dtype="int32", name=DECODER_INPUTS)

    def embedding(vocab_size, name):
        return PositionalEmbedding(
            vocab_size, d_model, sequence_length, pad_id=pad_id, dtype=dtype, name=name
        )

    # Layers are made in the order of the paper's figure 1 (the decoder
    # embedding after the encoder): the order fixes the initial weights.
    if tie_embeddings == "all":
        encoder_embedding = embedding(src_vocab_size, "shared_embedding")
    else:
        encoder_embedding = embedding(src_vocab_size, "encoder_embedding")
    x = encoder_embedding(encoder_inputs)
    x = Dropout(dropout_rate, dtype=dtype, name="encoder_embedding_dropout")(x)
    for i in range(num_layers):
        x = TransformerEncoder(name=f"encoder_layer_{i}", **block_args)(x)
    if norm_first:
        x = LayerNormalization(
            epsilon=layer_norm_epsilon, dtype=dtype, name="encoder_final_norm"
        )(x)

    if tie_embeddings == "all":
        decoder_embedding = encoder_embedding
    else:
        decoder_embedding = embedding(tgt_vocab_size, "decoder_embedding")
    y = decoder_embedding(decoder_inputs)
    y = Dropout(dropout_rate, dtype=dtype, name="decoder_embedding_dropout")(y)
    for i in range(num_decoder_layers):
        y = TransformerDecoder(name=f"decoder_layer_{i}", **block_args)(y, x)
    if norm_first:
        y = LayerNormalization(
            epsilon=layer_norm_epsilon, dtype=dtype, name="decoder_final_norm"
        )(y)
    if tie_embeddings == "none":
        logits = OutputProjection(tgt_vocab_size, dtype=dtype, name="logits")(y)
    else:
        logits = decoder_embedding(y, reverse=True)
    return keras.Model(
        inputs={ENCODER_INPUTS: encoder_inputs, DECODER_INPUTS: decoder_inputs},
        outputs=logits,
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
