"""The one decoding loop that every search strategy runs in.

`dynamic_decode` encodes the sources once, then runs the decoder one
position per step against the key/value caches, and hands each step's
log-probabilities to a strategy (`strategies.GreedySearch`,
`strategies.BeamSearch`), which picks the next tokens and says which
hypothesis each comes from; the loop reorders the caches accordingly. This
is the shape of OpenNMT-tf's `utils/decoding.py` (`dynamic_decode` over a
`DecodingStrategy`).

A strategy is an object with:

- `beams`: hypotheses per sentence (rows of the decoder batch);
- `initial_state(batch, length, pad_id, attention_shape)`: a tuple of
  tensors whose first axis is the sentence;
- `step(t, log_probs, state, at_limit, end_id, pad_id, blocked,
  attention)`: with `log_probs` float32 `(n, beams, vocab)` (the model's),
  `at_limit` bool `(n,)` (the sentence's last allowed token), `blocked` a
  sorted tuple of the ids never to pick (`pad_id`, `start_id` and the
  suppressed ids: the strategy gives them `NEG_LOG_PROB`, see
  `limits.suppress_ids`) and `attention` the last layer's cross-attention
  weights or None,
  returns `(tokens (n, beams), parent (n, beams) or None, state)`: the next
  tokens and, for each, the beam it extends (None: the same one);
- `settled(state, limits)`: bool `(n,)`, the sentence's result is final;
- `finalize(state)`: the search's outputs;
- `drops_settled`: bool, whether settled sentences may leave the batch.

With growing caches (`decoding.growing_cache`: tensorflow without XLA),
shapes may change from step to step, so a sentence whose result is final
can leave the batch: later steps run on the others only, and the final
states wait in a copy of the state, indexed by sentence. Beam search does
this (a settled sentence would go on costing `beam_size` rows); greedy
search does not (a finished sentence costs one row, less than the gathers
that would drop it).
"""

import numpy as np
from keras import ops

from keras_transformer.decoding import compiled
from keras_transformer.decoding.gather import take_rows
from keras_transformer.decoding.growing_cache import relax_batch
from keras_transformer.decoding.limits import decode_limits
from keras_transformer.decoding.limits import flatten_caches
from keras_transformer.decoding.limits import unflatten_caches
from keras_transformer.decoding.model_parts import TransformerParts
from keras_transformer.layers.id_range import check_id_range
from keras_transformer.layers.id_range import check_integer_ids
from keras_transformer.validation import check_count


def check_search_arguments(parts, source_ids, start_id, end_id, pad_id, suppressed_ids=()):
    """Raises, before any op, for sources or special ids a search cannot
    use: float ids were cut to integers, a source without its batch axis
    failed deep in jax's encoder, and an `end_id` or `pad_id` outside the
    target vocabulary was never produced or blocked another id (TensorFlow
    failed in a gather, jax gave NaN scores, torch ran on).

    Raises:
        TokenIdTypeError: (a TypeError) for sources that are not integers.
        ValueError: for sources not of shape `(batch, source_length)`, or a
            special or suppressed id that is not a whole number in
            `[0, parts.vocab_size)`.
    """
    check_integer_ids(source_ids, "`source_ids`")
    shape = getattr(source_ids, "shape", None)
    try:
        rank = np.ndim(source_ids) if shape is None else len(shape)
    except (TypeError, ValueError):  # a graph tensor of unknown rank: the encoder checks it
        rank = None
    if rank is not None and rank != 2:
        raise ValueError(
            f"`source_ids` must be ids of shape (batch, source_length); got shape {tuple(np.shape(source_ids) if shape is None else shape)}. "
            "For one sentence, add a batch axis (`ids[None]`)."
        )
    vocab = parts.vocab_size
    named = [("start_id", start_id), ("end_id", end_id), ("pad_id", pad_id)]
    named += [("suppressed_ids", i) for i in suppressed_ids if i is not None]
    for name, value in named:
        if check_count(value, name, minimum=0) >= vocab:
            raise ValueError(f"`{name}` must be a token id in [0, {vocab}) (the target vocabulary); got {value!r}.")


def output_length(parts, max_length):
    """The output-token cap: `max_length`, at most the decoder's
    `sequence_length` (its default)."""
    if max_length is None:
        return parts.target_sequence_length
    return min(int(max_length), parts.target_sequence_length)


def dynamic_decode(
    parts,
    source_ids,
    strategy,
    *,
    start_id,
    end_id,
    pad_id=0,
    max_length=None,
    length_ratio=None,
    length_offset=10,
    suppressed_ids=(),
    return_attention_scores=False,
):
    """Decode `source_ids` with `strategy`, one position a step.

    Args:
        parts: `TransformerParts` of the model.
        source_ids: int `(batch, source_length)`, padded with `pad_id`.
        strategy: what picks the tokens (see the module docstring).
        start_id, end_id, pad_id: special token ids; `pad_id`, `start_id`
            and `suppressed_ids` are never picked (`suppress_ids`).
        max_length: int, most output tokens (`output_length`).
        length_ratio, length_offset: per-sentence limits
            (`decode_limits`); the end token is forced at the limit.
        return_attention_scores: bool, hand the strategy the last decoder
            layer's cross-attention weights each step.

    Returns:
        `strategy.finalize(state)`. On jax, outside a caller's `jax.jit`,
        the search runs compiled once per input shape
        (`decoding.compiled`).
    """
    check_search_arguments(parts, source_ids, start_id, end_id, pad_id, suppressed_ids)
    if compiled.applies(source_ids) and hasattr(parts, "model"):
        # A `TransformerParts` is its model and cache layout; a subclass, or
        # one with its own `output_kernel` (a tensor the compiled search
        # holds), may hold more, so its searches are kept per object.
        plain = type(parts) is TransformerParts and parts.output_kernel is None
        parts_key = (type(parts), bool(getattr(parts, "growing_cache", False))) \
            if plain else ("object", id(parts))
        setting = (
            parts_key, type(strategy), tuple(sorted(vars(strategy).items())), int(start_id),
            int(end_id), int(pad_id), max_length, length_ratio, length_offset,
            tuple(int(i) for i in suppressed_ids if i is not None), bool(return_attention_scores),
        )

        def search(ids):
            return dynamic_decode(
                parts, ids, strategy, start_id=start_id, end_id=end_id, pad_id=pad_id,
                max_length=max_length, length_ratio=length_ratio, length_offset=length_offset,
                suppressed_ids=suppressed_ids, return_attention_scores=return_attention_scores,
            )

        # Checked here, where the ids are known, so that a bad id raises
        # ValueError as in an eager search (in the compiled search it
        # would surface as a jax runtime error); the special ids are
        # checked above.
        embedding = parts.encoder_embedding
        check_id_range(np.asarray(source_ids), embedding.vocab_size, f"The inputs of {embedding.name}")
        attention_axis = 2 if return_attention_scores else None  # GreedySearch.finalize
        return compiled.run_compiled(search, parts.model, source_ids, setting, parts.pad_id,
                                     parts.source_sequence_length, attention_axis)
    source_ids = ops.convert_to_tensor(source_ids, "int32")
    blocked = tuple(sorted({int(i) for i in (pad_id, start_id, *suppressed_ids) if i is not None}))
    vocab = parts.vocab_size
    length = output_length(parts, max_length)
    k = strategy.beams
    compact = bool(getattr(parts, "growing_cache", False)) and strategy.drops_settled
    encoder_outputs, encoder_outputs_mask = parts.encode(source_ids)
    batch = ops.shape(source_ids)[0]
    limits = decode_limits(encoder_outputs_mask, length, length_ratio, length_offset)
    # Row b*k + j of the decoder batch is beam j of sentence b; the beams of
    # a sentence share its cross-attention caches and source mask.
    cross = flatten_caches(parts.cross_caches(encoder_outputs))
    # Fixed-size caches may grow in phases (`TransformerParts.cache_phases`).
    phases = parts.cache_phases(length) if hasattr(parts, "cache_phases") else [length]
    caches = flatten_caches(parts.empty_self_caches(batch * k, phases[0], encoder_outputs.dtype))
    weights = parts.decoding_weights()  # once, outside the loop
    attention_shape = (parts.num_heads, ops.shape(source_ids)[1]) if return_attention_scores else None
    state = tuple(strategy.initial_state(batch, length, pad_id, attention_shape))
    last = check_id_range(ops.full((batch * k,), start_id, "int32"), vocab, "`start_id`")
    num_state, num_caches, num_cross = len(state), len(caches), len(cross)

    def step(t, last, state, caches, cross, encoder_outputs_mask, limits):
        """One position for every sentence in the batch: the new tokens,
        state, caches (not yet reordered) and the cache rows to take."""
        attention_setting = {"return_attention_scores": True} if return_attention_scores else {}
        outputs = parts.decode_step(
            last, t, unflatten_caches(caches), unflatten_caches(cross), encoder_outputs_mask,
            weights=weights, beams_per_source=k, **attention_setting,
        )
        # Parts that return log-probabilities already (an ensemble's mean
        # distribution) are not normalized a second time.
        scores = outputs[0] if getattr(parts, "returns_log_probs", False) else ops.log_softmax(outputs[0], axis=-1)
        log_probs = ops.reshape(scores, (-1, k, vocab))
        attention = outputs[2] if return_attention_scores else None
        tokens, parent, state = strategy.step(
            t, log_probs, state, ops.greater_equal(t + 1, limits), end_id, pad_id, blocked, attention
        )
        rows = None  # the cache row each new row continues
        if parent is not None:
            n = ops.shape(parent)[0]
            rows = ops.reshape(ops.expand_dims(ops.arange(n, dtype="int32") * k, 1) + parent, (-1,))
        return tokens, tuple(state), flatten_caches(outputs[1]), rows

    if not compact:

        def cond(t, last, *rest):
            settled = strategy.settled(rest[:num_state], limits)
            return ops.logical_and(t < length, ops.logical_not(ops.all(settled)))

        def body(t, last, *rest):
            tokens, state, new_caches, rows = step(
                t, last, rest[:num_state], rest[num_state:], cross, encoder_outputs_mask, limits
            )
            if rows is not None:
                new_caches = [take_rows(cache, rows) for cache in new_caches]
            return (t + 1, ops.reshape(tokens, (-1,)), *state, *new_caches)

        # One loop per cache phase, over caches of one static size, padded
        # with empty slots for the next phase: a step reads and reorders
        # the slots its phase can reach, not all `length` of them.
        outputs = (ops.convert_to_tensor(0, "int32"), last, *state, *caches)
        for i, size in enumerate(phases):
            if i > 0:
                grown = parts.grow_self_caches(unflatten_caches(outputs[2 + num_state:]), size)
                outputs = (*outputs[:2 + num_state], *flatten_caches(grown))

            def phase_cond(t, last, *rest, size=size):
                return ops.logical_and(t < size, cond(t, last, *rest))

            outputs = ops.while_loop(phase_cond, body, outputs)
        return strategy.finalize(tuple(outputs[2:2 + num_state]))

    def split(loop_vars):
        t, last, alive = loop_vars[:3]
        rest = loop_vars[3:]
        state, rest = rest[:num_state], rest[num_state:]
        out, rest = rest[:num_state], rest[num_state:]
        caches, rest = rest[:num_caches], rest[num_caches:]
        cross, rest = rest[:num_cross], rest[num_cross:]
        return t, last, alive, state, out, caches, cross, rest[0], rest[1]

    def cond(t, last, *rest):
        return ops.logical_and(t < length, ops.shape(last)[0] > 0)

    # This path runs on tensorflow only (growing caches): `tf.gather` is
    # `ops.take` without its handling of negative indices (six more ops).
    import tensorflow as tf

    def body(*loop_vars):
        t, last, alive, state, out, caches, cross, encoder_outputs_mask, limits = split(loop_vars)
        tokens, state, new_caches, rows = step(t, last, state, caches, cross, encoder_outputs_mask, limits)
        done = ops.logical_or(strategy.settled(state, limits), t + 1 >= length)
        tokens = ops.reshape(tokens, (-1,))

        def all_go_on():
            # Most steps: nobody leaves, so only the caches are reordered
            # (by parent hypothesis); the source side, the stored final
            # states and the sentence order stay as they are.
            kept_caches = new_caches if rows is None else [tf.gather(cache, rows) for cache in new_caches]
            return (tokens, alive, *state, *out, *kept_caches, *cross, encoder_outputs_mask, limits)

        def some_leave():
            # The final states of the sentences that are done; the others go on.
            where_alive = ops.expand_dims(alive, 1)
            new_out = []
            for value, stored in zip(state, out):
                done_here = ops.reshape(done, (-1,) + (1,) * (len(value.shape) - 1))
                merged = ops.where(done_here, value, tf.gather(stored, alive))
                new_out.append(ops.scatter_update(stored, where_alive, merged))
            keep = ops.cast(ops.reshape(ops.where(ops.logical_not(done)), (-1,)), "int32")
            kept_rows = ops.reshape(ops.expand_dims(keep * k, 1) + ops.arange(k, dtype="int32"), (-1,))
            cache_rows = kept_rows if rows is None else tf.gather(rows, kept_rows)
            return (
                ops.reshape(tf.gather(ops.reshape(tokens, (-1, k)), keep), (-1,)),
                tf.gather(alive, keep),
                *[tf.gather(value, keep) for value in state],
                *new_out,
                *[tf.gather(cache, cache_rows) for cache in new_caches],
                *[tf.gather(c, keep) for c in cross],
                tf.gather(encoder_outputs_mask, keep),
                tf.gather(limits, keep),
            )

        return (t + 1, *tf.cond(ops.any(done), some_leave, all_go_on))

    alive = ops.arange(batch, dtype="int32")
    outputs = ops.while_loop(
        cond,
        body,
        (ops.convert_to_tensor(0, "int32"), relax_batch(last), relax_batch(alive),
         *[relax_batch(value) for value in state], *state, *caches,
         *[relax_batch(c) for c in cross], relax_batch(encoder_outputs_mask), relax_batch(limits)),
    )
    return strategy.finalize(tuple(outputs[3 + num_state:3 + 2 * num_state]))
