"""Adam (Kingma & Ba, 2015) with one fused kernel per variable on TensorFlow."""

import keras

from keras_transformer.validation import check_positive
from keras_transformer.validation import check_rate

_FUSED_DTYPES = ("float16", "bfloat16", "float32", "float64")


@keras.saving.register_keras_serializable(package="keras_transformer")
class Adam(keras.optimizers.Adam):
    """`keras.optimizers.Adam`, updating each variable in one kernel on TensorFlow.

    The same optimizer (arguments, config, slot variables, values): for
    each variable, with `t` the step counted from 1,

        m <- m + (g - m) (1 - beta_1)
        v <- v + (g^2 - v) (1 - beta_2)
        variable <- variable - lr sqrt(1 - beta_2^t) / (1 - beta_1^t) * m / (sqrt(v) + epsilon)

    Keras runs this as about twelve elementwise operations per variable,
    each a pass over memory; on the tensorflow backend this class runs it
    as TensorFlow's fused `ResourceApplyAdam` kernel, one pass (XLA compiles
    the same kernel under `jit_compile`). Other backends, `amsgrad=True`, and
    variables of other dtypes use Keras's own update: on jax the same
    values; on torch Keras's generic update, because Keras swaps in its
    torch-native Adam for `keras.optimizers.Adam` itself only (the same
    formula, equal up to float32 rounding). Weight decay, gradient
    clipping, gradient accumulation, EMA and loss scaling are Keras's and
    apply as they do there, but for one thing: with
    `gradient_accumulation_steps=k`, `iterations` counts optimizer updates
    (one per `k` batches), and the learning-rate schedule and the bias
    correction's `t` follow it, so that `k` accumulated batches of `n` train
    as one batch of `k * n` (Keras's own Adam counts batches: the warm-up
    would end `k` times early).

    Args:
        As `keras.optimizers.Adam`: `learning_rate` (float or
        `keras.optimizers.schedules.LearningRateSchedule`, e.g.
        `WarmupSchedule`), `beta_1`, `beta_2`, `epsilon`, `amsgrad`, and
        the base optimizer's keyword arguments.

    Raises:
        ValueError: for `beta_1` or `beta_2` outside `[0, 1)`, or an
            `epsilon` that is not a finite number > 0.

    Example:

    ```python
    optimizer = keras_transformer.optimizers.Adam(
        keras_transformer.WarmupSchedule(d_model=512, warmup_steps=4000),
        beta_1=0.9, beta_2=0.98, epsilon=1e-9,  # the paper's, section 5.3
    )
    ```

    References:
        Kingma and Ba (2015), "Adam: A Method for Stochastic Optimization",
        algorithm 1 with the efficiency note of section 2 (the epsilon-hat
        form above); Vaswani et al. (2017), section 5.3.
    """

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7, amsgrad=False,
                 **kwargs):
        # Keras takes any value: a beta of 1.5 diverges, a beta of 1 divides
        # by 1 - beta^t = 0.
        super().__init__(learning_rate, beta_1=check_rate(beta_1, "beta_1"),
                         beta_2=check_rate(beta_2, "beta_2"), epsilon=check_positive(epsilon, "epsilon"),
                         amsgrad=amsgrad, **kwargs)

    @property
    def iterations(self):
        """Optimizer updates so far: the batches seen, or with
        `gradient_accumulation_steps=k` the batches divided by `k`."""
        if self.gradient_accumulation_steps:
            return self._iterations // self.gradient_accumulation_steps
        return self._iterations

    def _get_current_learning_rate(self):
        if isinstance(self._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
            return self._learning_rate(self.iterations)
        return super()._get_current_learning_rate()

    def update_step(self, gradient, variable, learning_rate):
        if (
            keras.backend.backend() != "tensorflow"
            or self.amsgrad
            or keras.backend.standardize_dtype(variable.dtype) not in _FUSED_DTYPES
        ):
            return super().update_step(gradient, variable, learning_rate)
        import tensorflow as tf

        index = self._get_variable_index(variable)
        if isinstance(variable, keras.Variable):
            variable = variable.value
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)

        def constant(value):
            # tf.constant keeps a Python float exact in float64 (a cast of
            # one would round it to float32 first).
            if isinstance(value, (int, float)):
                return tf.constant(value, dtype)
            return tf.cast(value, dtype)

        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle,
            m=self._momentums[index].value.handle,
            v=self._velocities[index].value.handle,
            beta1_power=tf.pow(constant(self.beta_1), step),
            beta2_power=tf.pow(constant(self.beta_2), step),
            lr=constant(learning_rate),
            beta1=constant(self.beta_1),
            beta2=constant(self.beta_2),
            epsilon=constant(self.epsilon),
            # A sparse (IndexedSlices) gradient, from an embedding lookup,
            # becomes dense: Adam decays every row's moments each step.
            grad=constant(tf.convert_to_tensor(gradient)),
        )
