"""Models saved by earlier versions, as plain functional models, made
`Transformer`s.

Before `Transformer`, `build_transformer` returned a plain functional
`keras.Model`; a `.keras` file saved then loads as one. Its layers carry
the same names and its weights the same paths, so `as_transformer`
rebuilds the model as a `Transformer` from the layers' settings and copies
the weights by path. This module is the one place that reads a model by its
layer names.
"""

import keras

from keras_transformer.models.transformer import Transformer


def copy_weights(source, target):
    """Assign `source`'s weights to `target`'s, matched by variable path.

    Raises:
        ValueError: if the two models' weight paths or shapes differ.
    """
    values = {variable.path: variable for variable in source.weights}
    paths = [variable.path for variable in target.weights]
    if sorted(values) != sorted(paths):
        missing = sorted(set(paths) - set(values))[:5]
        extra = sorted(set(values) - set(paths))[:5]
        raise ValueError(
            f"The models' weights differ: {source.name!r} lacks {missing} and has "
            f"{extra} besides; copy weights between models of one architecture."
        )
    for variable in target.weights:
        value = values[variable.path]
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(
                f"Weight {variable.path}: shape {tuple(value.shape)} in {source.name!r}, "
                f"{tuple(variable.shape)} in {target.name!r}."
            )
        variable.assign(value)


def as_transformer(model):
    """`model` as a `Transformer`.

    A `Transformer` is returned as is. A plain functional model that an
    earlier `build_transformer` made (loaded from a `.keras` file saved
    before `Transformer` existed) is rebuilt as a `Transformer` with its
    settings, read from its layers, and its weights, copied by path.

    Args:
        model: a `Transformer`, or a functional `keras.Model` with
            `build_transformer`'s layer names.

    Returns:
        `Transformer`.

    Raises:
        ValueError: if `model` is neither.

    Example:
    >>> import keras
    >>> model = Transformer(50, 50, num_layers=1, d_model=8, num_heads=2,
    ...                     dff=16, sequence_length=8)
    >>> as_transformer(model) is model
    True
    >>> old = keras.Model(model.inputs, model.outputs)  # as earlier versions built it
    >>> type(as_transformer(old)).__name__
    'Transformer'
    """
    if isinstance(model, Transformer):
        return model
    layers = {layer.name: layer for layer in getattr(model, "layers", [])}
    shared = layers.get("shared_embedding")
    encoder = layers.get("encoder_embedding", shared)
    decoder = layers.get("decoder_embedding", shared)
    encoder_blocks = [name for name in layers if name.startswith("encoder_layer_")]
    decoder_blocks = [name for name in layers if name.startswith("decoder_layer_")]
    if encoder is None or decoder is None or not encoder_blocks or not decoder_blocks:
        raise ValueError(
            "Expected a keras_transformer Transformer (from build_transformer), or a model "
            "an earlier build_transformer made (layers encoder_embedding or "
            "shared_embedding, encoder_layer_0..., decoder_layer_0...); "
            f"{getattr(model, 'name', model)!r} has {sorted(layers)}."
        )
    block = layers["encoder_layer_0"].get_config()
    tie = "all" if shared is not None else "none" if "logits" in layers else "target"
    rebuilt = Transformer(
        encoder.vocab_size,
        decoder.vocab_size,
        num_layers=len(encoder_blocks),
        num_decoder_layers=len(decoder_blocks),
        d_model=encoder.d_model,
        num_heads=block["num_heads"],
        dff=block["dff"],
        dropout_rate=block["dropout_rate"],
        attention_dropout_rate=block["attention_dropout_rate"],
        activation_dropout_rate=block["activation_dropout_rate"],
        sequence_length=encoder.sequence_length,
        tie_embeddings=tie,
        pad_id=encoder.pad_id or 0,
        norm_first=block["norm_first"],
        layer_norm_epsilon=block["layer_norm_epsilon"],
        activation=keras.activations.deserialize(block["activation"]),
        dtype=encoder.dtype_policy,
        name=model.name,
    )
    copy_weights(model, rebuilt)
    return rebuilt
