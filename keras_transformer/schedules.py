"""Learning-rate schedules for training the Transformer."""

import math
import numbers

import keras
from keras import ops


def _check_positive(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(
            f"`{name}` must be a positive number. Received: "
            f"{name}={value!r} of type {type(value).__name__}."
        )
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"`{name}` must be a positive, finite number. Received: "
            f"{name}={value!r}."
        )


@keras.saving.register_keras_serializable(package="keras_transformer")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup followed by inverse-square-root decay ("Noam" schedule).

    The schedule of the paper (section 5.3, equation 3): the learning rate
    grows linearly for the first `warmup_steps` training steps and then
    decreases proportionally to the inverse square root of the step number,

        lrate = scale * d_model**-0.5 * min(step**-0.5,
                                            step * warmup_steps**-1.5)

    The peak, reached at `step == warmup_steps`, is
    `scale * (d_model * warmup_steps)**-0.5`.

    Training starts at step 1: the rate at `step` is the formula evaluated at
    `max(step, 1)`. A Keras optimizer calls its schedule with its
    `iterations` counter, which is 0 for the first update; that update gets
    the step-1 rate (never 0, and never the infinity that `rsqrt(0)` would
    give), and `schedule(warmup_steps)` is exactly the paper's peak.

    The step is cast to float32 inside `__call__`, so Python ints, int32,
    int64 and float tensors are all accepted (the TensorFlow optimizer passes
    an int64 variable). Only `keras.ops` is used, so the schedule runs on the
    TensorFlow, JAX and PyTorch backends.

    Args:
        d_model: positive number. The model (embedding) width; the rate is
            scaled by `d_model**-0.5`.
        warmup_steps: positive number. Steps of linear warmup. Defaults to
            4000, the paper's value.
        scale: positive number. Extra multiplier on the whole schedule
            (OpenNMT calls it the "learning rate" of the Noam schedule, often
            set to 2.0). Defaults to 1.0, the paper's schedule.

    Call arguments:
        step: scalar, any integer or float dtype (Python number or tensor).
            The optimizer step; values below 1 are treated as 1.

    Returns:
        A scalar float32 tensor, the learning rate at `step`.

    Raises:
        ValueError: if `d_model`, `warmup_steps` or `scale` is not a positive,
            finite number.

    Example:

    ```python
    schedule = WarmupSchedule(d_model=512, warmup_steps=4000)
    optimizer = keras.optimizers.Adam(
        learning_rate=schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9
    )
    float(schedule(4000))  # peak: 512**-0.5 * 4000**-0.5 = 0.000698771
    ```

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762),
          section 5.3 "Optimizer", equation 3.
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0):
        super().__init__()
        _check_positive("d_model", d_model)
        _check_positive("warmup_steps", warmup_steps)
        _check_positive("scale", scale)
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = scale

    def __call__(self, step):
        step = ops.cast(step, "float32")
        step = ops.maximum(step, 1.0)
        factor = float(self.scale) * float(self.d_model) ** -0.5
        decay = ops.rsqrt(step)
        warmup = step * (float(self.warmup_steps) ** -1.5)
        return ops.cast(factor * ops.minimum(decay, warmup), "float32")

    def get_config(self):
        return {
            "d_model": self.d_model,
            "warmup_steps": self.warmup_steps,
            "scale": self.scale,
        }
