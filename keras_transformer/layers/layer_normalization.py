"""Layer normalization (Ba et al., 2016): Keras's layer, under this package's name."""

import keras


@keras.saving.register_keras_serializable(package="keras_transformer")
class LayerNormalization(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization`, registered as
    `keras_transformer>LayerNormalization`.

    The same layer (arguments, variables `gamma` and `beta`, config,
    values): models saved by earlier versions of this package name this
    class, so it stays to load them. As in Keras, the arithmetic is float32
    whatever the compute dtype.

    Call arguments:
        inputs: float tensor `(..., d)`.

    Returns:
        A tensor of the shape of `inputs` in the layer's compute dtype.

    Example:
    >>> layer = LayerNormalization(epsilon=1e-6)
    >>> y = layer(np.array([[1.0, 2.0, 3.0]], "float32"))
    >>> [round(float(v), 3) for v in np.asarray(y)[0]]
    [-1.225, 0.0, 1.225]

    References:
        Ba, Kiros and Hinton (2016), "Layer Normalization"; Vaswani et al.
        (2017), section 3.1.
    """
