"""Dropout (Srivastava et al., 2014): Keras's layer, under this package's name."""

import keras


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout`, registered as `keras_transformer>Dropout`.

    The same layer (arguments, config, no variables, values): models saved
    by earlier versions of this package name this class, so it stays to
    load them. Every dropout of the Transformer is one of these layers; the
    training fast path (`keras_transformer.fast_path.ops.dropout`) reads
    its `rate` and seed generator.

    Call arguments:
        inputs: float tensor, any shape.
        training: bool, dropout only in training.

    Returns:
        A tensor of the shape and dtype of `inputs`.

    Example:
    >>> import numpy as np
    >>> layer = Dropout(0.5)
    >>> tuple(layer(np.ones((2, 3), "float32"), training=False).shape)
    (2, 3)

    References:
        Srivastava et al. (2014), "Dropout"; Vaswani et al. (2017),
        section 5.4 (residual dropout, P_drop = 0.1).
    """
