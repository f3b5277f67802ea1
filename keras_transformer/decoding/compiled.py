"""Decoding compiled once per input shape on jax.

On jax, `keras.ops.while_loop` is `jax.lax.while_loop`: called outside
`jax.jit`, it traces and compiles its loop again on every call (the loop
body is a new closure each time), and the encoder runs op by op. A search
called on batch after batch then spends most of its time compiling. Here
the whole search runs in one `jax.jit` that takes the model's variables as
arguments (`keras.StatelessScope`), kept per model and per search setting:
each shape of `source_ids` compiles once. The source length is padded with
the model's `pad_id` to a multiple of `LENGTH_BUCKET` (at most the
encoder's `sequence_length`) so that batches of nearby lengths share one
compiled search; padding is masked, so the outputs are those of the
unpadded batch.

Only `dynamic_decode` calls this; it is the jax switch of the one decoding
loop. Inside a caller's own trace (`jax.jit`, `jax.grad`, ...) the search
is traced into the caller's function instead.
"""

import keras
import numpy as np

# Source lengths are padded up to a multiple of this (see the module docstring).
LENGTH_BUCKET = 16

# The model attribute holding {search setting: (variable ids, jitted search)}.
# It is set past Keras's attribute tracking (the searches are not state to
# save), and lives and dies with the model (the searches refer to it).
_ATTRIBUTE = "_keras_transformer_compiled_searches"
# Searches kept per model; the oldest goes first beyond this.
MAX_SEARCHES = 32


def applies(source_ids):
    """Whether a search on `source_ids` runs compiled here: the jax backend,
    outside any trace of a caller (`jax.jit`, `jax.grad`, ...), whether or
    not `source_ids` itself is traced (NumPy ids inside a caller's
    `jax.jit` are constants of its trace; the weights may be traced)."""
    if keras.backend.backend() != "jax":
        return False
    import jax

    if isinstance(source_ids, jax.core.Tracer):
        return False
    # Inside a trace every new array is a tracer of that trace.
    return not isinstance(jax.numpy.zeros(()), jax.core.Tracer)


def bucketed_length(length, limit):
    """`length` rounded up to a multiple of `LENGTH_BUCKET`, at most
    `limit` (and never below `length`)."""
    padded = -(-length // LENGTH_BUCKET) * LENGTH_BUCKET
    return max(length, min(padded, limit))


def run_compiled(search, model, source_ids, setting, pad_id, source_limit, attention_axis=None):
    """`search(source_ids)` in a `jax.jit` kept for `(model, setting)`.

    Args:
        search: function of int32 `(batch, source_length)` ids that runs
            the search with `model`'s layers and returns a tuple of arrays.
        model: the `Transformer` whose variables `search` reads.
        source_ids: int `(batch, source_length)`, padded with `pad_id`.
        setting: hashable, everything else the search depends on (the
            strategy and its parameters, the special ids, the limits, the
            `TransformerParts`). A search is compiled again when the
            model's variables are other objects than when it was compiled
            (after `model.quantize`, say), and that older one is dropped.
        pad_id: int, the model's source padding id.
        source_limit: int, the longest source the encoder takes.
        attention_axis: index of an output whose last axis is the source
            (attention weights), cut back to the unpadded length.

    Returns:
        what `search` returns, as jax arrays.
    """
    import jax

    source_ids = np.asarray(source_ids) if not isinstance(source_ids, jax.Array) else source_ids
    length = int(source_ids.shape[1])
    padded = bucketed_length(length, source_limit)
    if padded > length:
        source_ids = jax.numpy.pad(
            jax.numpy.asarray(source_ids, "int32"), ((0, 0), (0, padded - length)),
            constant_values=pad_id,
        )
    variables = list(model.variables)
    identity = tuple(id(v) for v in variables)
    per_model = model.__dict__.get(_ATTRIBUTE)
    if per_model is None:
        per_model = {}
        object.__setattr__(model, _ATTRIBUTE, per_model)
    if setting not in per_model or per_model[setting][0] != identity:

        def pure(values, ids):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return tuple(search(ids))

        per_model.pop(setting, None)
        while len(per_model) >= MAX_SEARCHES:
            per_model.pop(next(iter(per_model)))
        per_model[setting] = (identity, jax.jit(pure))
    outputs = per_model[setting][1]([v.value for v in variables], source_ids)
    if attention_axis is not None and padded > length:
        outputs = list(outputs)
        outputs[attention_axis] = outputs[attention_axis][..., :length]
        outputs = tuple(outputs)
    return outputs
