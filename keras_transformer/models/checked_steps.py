"""Token ids checked before a compiled `fit`/`evaluate`/`predict` step.

The model's layers check their ids (`check_id_range`), and that is enough
eagerly, on torch, and in a TensorFlow graph. Two compiled steps need the
check before them instead:

- TensorFlow with `jit_compile=True`: XLA compiles the `Assert` op to
  nothing and clamps the indices of a gather, so an id outside the
  vocabulary would read the first or last row of the table: a silently
  wrong loss, gradient or prediction.
- jax: the check inside `jax.jit` raises, but only after Keras's step has
  been given the model's variables as donated buffers, so the error leaves
  the model without its weights ("Array has been deleted").
"""

import contextlib
import warnings

import keras

from keras_transformer.layers.id_range import check_id_range
from keras_transformer.layers.id_range import check_label_ids
from keras_transformer.layers.positional_embedding import check_sequence_length
from keras_transformer.losses import check_label_shape


class CheckedXLASteps:
    """Mixin for a `keras.Model` that takes token ids: checks each batch
    before a compiled step, so that a bad id is a clear error and the model
    stays as it was.

    - tensorflow, `jit_compile=True`: `make_train_function` (and the test
      and predict ones) compile the model's step with XLA on its own,
      `tf.function(step, jit_compile=True)`, and build Keras's loop around
      it without XLA; there the batch is checked in the graph before the
      compiled step runs.
    - jax: the step function Keras builds draws its batches and checks
      them on the host before the jitted step; on a bad batch the model's
      variables keep the values of the last good step.
    - torch: `jit_compile=True` (`torch.compile`) falls back to False
      with a `UserWarning`, as it fails on the model.
    - elsewhere (torch, `run_eagerly=True`, tensorflow without XLA) and for
      a subclass or instance with its own step: Keras's steps, unchanged;
      the checks inside the model raise there. Under a tf.distribute
      strategy with XLA, Keras's step too (the optimizer's cross-replica
      step cannot run in a nested function), with a `UserWarning` that
      the ids are not checked there.

    The model provides `checked_id_inputs()`, `{input name: vocab_size}`
    for its id inputs in input order, and `checked_labels()`, `(vocab_size,
    pad_id)` for labels that must be ids (`pad_id` excepted), or None; and
    may provide `checked_input_lengths()`, `{input name: longest length}`,
    and `checked_label_input()`, the input whose `(batch, T)` the labels
    must have. A batch that fails these checks fails before the compiled
    step, with the library's message rather than one from inside XLA.

    Raises:
        tf.errors.InvalidArgumentError: (tensorflow, at run time) for an
            input or label id outside `[0, vocab_size)`.
        ValueError: (jax) the same, before the step runs.
    """

    def make_train_function(self, force=False):
        return self._make_checked("train", force, super().make_train_function)

    def make_test_function(self, force=False):
        return self._make_checked("test", force, super().make_test_function)

    def make_predict_function(self, force=False):
        return self._make_checked("predict", force, super().make_predict_function)

    def train_step(self, *args, **kwargs):
        return self._checked_step("train_step", *args, **kwargs)

    def test_step(self, *args, **kwargs):
        return self._checked_step("test_step", *args, **kwargs)

    def predict_step(self, *args, **kwargs):
        return self._checked_step("predict_step", *args, **kwargs)

    def checked_id_inputs(self):
        raise NotImplementedError

    def checked_labels(self):
        return None

    def checked_input_lengths(self):
        return {}

    def checked_label_input(self):
        return None

    # === Internals ===

    def _make_checked(self, kind, force, make):
        if self.jit_compile is True and keras.backend.backend() == "torch":
            # torch.compile of the step failed after minutes: torch 2.13's
            # dynamo raises KeyError 'inputs_mask' while it recompiles the
            # decoder's attention.
            warnings.warn(
                "jit_compile=True on torch compiles the step with torch.compile, which fails on "
                "this model (torch's dynamo raises KeyError: 'inputs_mask' while recompiling the "
                "decoder's attention); running with jit_compile=False. For a compiled step, use "
                "the jax or tensorflow backend.",
                stacklevel=4,
            )
            self.jit_compile = False
        if getattr(self, f"{kind}_function") is not None and not force:
            return make(force)
        steps = self.__dict__.setdefault("_xla_steps", {})
        steps.pop(f"{kind}_step", None)
        if not self._own_step(f"{kind}_step"):
            return make(force)
        backend = keras.backend.backend()
        if backend == "tensorflow":
            with self._xla_step_inside(f"{kind}_step"):
                return make(force)
        result = make(force)
        if backend == "jax":
            function = getattr(self, f"{kind}_function")
            setattr(self, f"{kind}_function", _checking_batches(function, self, kind))
        return result

    def _checked_step(self, name, *args, **kwargs):
        # Keras's steps take `(data)` on tensorflow and `(state, data)` on jax.
        compiled = self.__dict__.get("_xla_steps", {}).get(name)
        if compiled is None:
            return getattr(super(), name)(*args, **kwargs)
        (data,) = args
        return compiled(self._check_batch(data, labels=name != "predict_step"))

    def _check_batch(self, data, labels):
        """`data` with every id input (and label) checked against its
        vocabulary (on tensorflow graphs, as control dependencies)."""
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        sizes = self.checked_id_inputs()
        lengths = self.checked_input_lengths()

        def check(name, ids):
            if name in lengths:
                ids = check_sequence_length(ids, lengths[name], f"The model's `{name}`")
            return check_id_range(ids, sizes[name], f"`{name}`")

        if isinstance(x, dict):
            x = {k: check(k, v) if k in sizes else v for k, v in x.items()}
            named = x
        elif isinstance(x, (list, tuple)) and len(x) == len(sizes):
            x = type(x)(check(k, v) for v, k in zip(x, sizes))
            named = dict(zip(sizes, x))
        else:
            named = {}
        label_check = self.checked_labels() if labels else None
        leaves = keras.tree.flatten(y) if y is not None else []
        # One output: its labels, as an array or as the one leaf of a list or dict.
        if label_check is not None and len(leaves) == 1:
            checked = check_label_ids(leaves[0], *label_check)
            like = named.get(self.checked_label_input())
            if like is not None and len(leaves[0].shape) in (2, 3):
                checked = check_label_shape(checked, like, reference_name=f"`{self.checked_label_input()}`")
            if keras.backend.backend() == "tensorflow":
                import tensorflow as tf

                with tf.control_dependencies([checked]):
                    y = keras.tree.pack_sequence_as(y, [tf.identity(leaves[0])])
        if y is None and sample_weight is None:
            return (x,) if isinstance(data, tuple) else x
        return keras.utils.pack_x_y_sample_weight(x, y, sample_weight)

    def _own_step(self, name):
        """Whether `name` is this mixin's step (not a subclass's or an
        instance attribute's own), so that checking around Keras's is faithful."""
        return name not in self.__dict__ and getattr(type(self), name) is getattr(CheckedXLASteps, name)

    @contextlib.contextmanager
    def _xla_step_inside(self, name):
        """Keras builds its loop without XLA while `name` is compiled alone."""
        if self.run_eagerly or self.jit_compile is not True:
            yield
            return
        import tensorflow as tf

        if tf.distribute.has_strategy() or getattr(self, "_distribute_strategy", None) is not None:
            # The optimizer's cross-replica step (`merge_call`) may not run
            # inside a function nested in `strategy.run`: Keras's XLA step.
            warnings.warn(
                "With jit_compile=True under a tf.distribute strategy, the training step runs as "
                "Keras compiles it, all in XLA, where TensorFlow's checks do not run: an id "
                "outside the vocabulary would read the table's first or last row. Check the "
                "data (make_dataset's tokenizers give ids in range), or use jit_compile=False.",
                stacklevel=4,
            )
            yield
            return

        self._xla_steps[name] = tf.function(getattr(super(), name), jit_compile=True,
                                            reduce_retracing=True, autograph=False)
        self.jit_compile = False
        try:
            yield
        finally:
            self.jit_compile = True


def _checking_batches(function, model, kind):
    """Keras's jax step function `(state, iterator)` with the batches of
    the step (`steps_per_execution` of them) drawn and checked before the
    first jitted call; on a bad batch the model gets `state` back (Keras
    keeps the variables only in `state` during the loop) and the error
    rises."""

    def step(state, iterator):
        batches = []
        for _ in range(model.steps_per_execution):
            try:
                batches.append(next(iterator))
            except StopIteration:
                break
        if not batches:
            raise StopIteration
        try:
            for data in batches:
                model._check_batch(data, labels=kind != "predict")
        except Exception:
            _restore(model, kind, state)
            raise
        try:
            return function(state, iter(batches))
        except Exception:
            # Failed while traced (a shape no check above covers): `state`
            # was not donated yet, and is the model's only copy.
            if not _donated(state):
                _restore(model, kind, state)
            raise

    return step


def _donated(state):
    """Whether any array of a jax step's `state` was handed to a jitted step
    (donated buffers are deleted)."""
    return any(getattr(leaf, "is_deleted", lambda: False)() for leaf in keras.tree.flatten(state))


def _restore(model, kind, state):
    """Assigns a jax step's `state` tuple back to the model's variables."""
    groups = [model.trainable_variables, model.non_trainable_variables]
    if kind == "train":
        groups.append(model.optimizer.variables)
    if kind in ("train", "test"):
        groups.append(model.metrics_variables)
    for variables, values in zip(groups, state):
        for variable, value in zip(variables, values):
            variable.assign(value)
