"""Learning-rate schedules for training the Transformer."""

import math
import numbers

import keras
import numpy as np
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
        total_steps, cooldown_steps: optional positive integers, given
            together (`cooldown_steps <= total_steps`): a cooldown, which is
            not in the paper. The rate above is then multiplied by
            `clip((total_steps - step) / cooldown_steps, 0, 1)`: unchanged
            until `total_steps - cooldown_steps`, then falling linearly to
            0 at `total_steps` (and 0 after it), the decay phase of
            warmup-stable-decay schedules (Hägele et al., 2024), for a run
            whose length is known. Default None: no cooldown, the rate
            never reaches 0.

    Call arguments:
        step: scalar, any integer or float dtype (Python number or tensor).
            The optimizer step; values below 1 are treated as 1.

    Returns:
        A scalar float32 tensor, the learning rate at `step`.

    Raises:
        ValueError: if `d_model`, `warmup_steps` or `scale` is not a positive,
            finite number, if together they give a rate of 0 or inf in
            float32 at step 1 or at the peak, or `total_steps` / `cooldown_steps` are not both
            None or both positive integers with `cooldown_steps <=
            total_steps`.

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
        - [Hägele et al., 2024](https://arxiv.org/abs/2405.18392), "Scaling
          Laws and Compute-Optimal Training Beyond Fixed Training
          Durations": the linear cooldown.
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0, total_steps=None, cooldown_steps=None):
        super().__init__()
        _check_positive("d_model", d_model)
        _check_positive("warmup_steps", warmup_steps)
        _check_positive("scale", scale)
        # The rate at step 1 and at its peak (step `warmup_steps`) must be
        # finite and positive in float32: d_model=1e300 gave 0 at every step,
        # d_model=1e-300 inf.
        try:
            factor = float(scale) * float(d_model) ** -0.5
            rates = (factor * min(1.0, float(warmup_steps) ** -1.5),
                     factor * max(1.0, float(warmup_steps)) ** -0.5)
        except (OverflowError, ZeroDivisionError):
            rates = (math.inf,)
        with np.errstate(over="ignore"):
            in_float32 = [float(np.float32(rate)) for rate in rates]
        if not all(0.0 < rate < math.inf for rate in in_float32):
            raise ValueError(
                f"WarmupSchedule(d_model={d_model!r}, warmup_steps={warmup_steps!r}, scale={scale!r}) "
                "gives learning rates of 0 or inf in float32 (section 5.3's "
                "scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)); use the "
                "model's d_model and a warmup of some steps."
            )
        if (total_steps is None) != (cooldown_steps is None):
            raise ValueError(
                "`total_steps` and `cooldown_steps` go together (the cooldown ends at "
                f"`total_steps`); got total_steps={total_steps!r}, cooldown_steps={cooldown_steps!r}."
            )
        if total_steps is not None:
            for name, value in (("total_steps", total_steps), ("cooldown_steps", cooldown_steps)):
                if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                    raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}.")
            if cooldown_steps > total_steps:
                raise ValueError(
                    f"`cooldown_steps` ({cooldown_steps}) must not exceed `total_steps` ({total_steps}): "
                    "the cooldown is the end of the run."
                )
            total_steps, cooldown_steps = int(total_steps), int(cooldown_steps)
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = scale
        self.total_steps = total_steps
        self.cooldown_steps = cooldown_steps

    def __call__(self, step):
        step = ops.cast(step, "float32")
        step = ops.maximum(step, 1.0)
        factor = float(self.scale) * float(self.d_model) ** -0.5
        decay = ops.rsqrt(step)
        warmup = step * (float(self.warmup_steps) ** -1.5)
        rate = factor * ops.minimum(decay, warmup)
        if self.cooldown_steps is not None:
            left = (float(self.total_steps) - step) / float(self.cooldown_steps)
            rate = rate * ops.clip(left, 0.0, 1.0)
        return ops.cast(rate, "float32")

    def get_config(self):
        config = {
            "d_model": self.d_model,
            "warmup_steps": self.warmup_steps,
            "scale": self.scale,
        }
        if self.cooldown_steps is not None:  # configs without a cooldown stay as they were
            config.update(total_steps=self.total_steps, cooldown_steps=self.cooldown_steps)
        return config
