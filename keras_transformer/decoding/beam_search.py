"""Beam search with a key/value cache and the GNMT length penalty."""

import math

from keras import ops

from keras_transformer.decoding.growing_cache import relax_batch
from keras_transformer.decoding.limits import decode_limits
from keras_transformer.decoding.limits import NEG_LOG_PROB
from keras_transformer.decoding.limits import flatten_caches
from keras_transformer.decoding.limits import suppress_ids
from keras_transformer.decoding.limits import unflatten_caches
from keras_transformer.layers.id_range import check_id_range

_NEG = NEG_LOG_PROB


def length_penalty_factor(length, alpha):
    """GNMT length penalty `((5 + length) / 6) ** alpha` (Wu et al., 2016, eq. 14)."""
    return ops.power((5.0 + ops.cast(length, "float32")) / 6.0, alpha)


def check_length_penalty(length_penalty):
    """The GNMT `alpha` as a python float.

    Raises:
        ValueError: unless it is a finite number >= 0 (NaN would rank every
            hypothesis as NaN and return garbage).
    """
    value = float(length_penalty)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(
            "`length_penalty` must be a finite number >= 0 (0.6 in the paper; 0 "
            f"ranks by raw log-probability); got {length_penalty}."
        )
    return value


def beam_search(
    parts,
    source_ids,
    *,
    start_id,
    end_id,
    pad_id=0,
    beam_size=4,
    length_penalty=0.6,
    n_best=1,
    max_length=None,
    length_ratio=None,
    length_offset=10,
    suppressed_ids=(),
):
    """Beam search over a batch, `beam_size` hypotheses per sentence.

    Each sentence keeps `beam_size` hypotheses ranked by
    `log P(y) / lp(y)` with the GNMT penalty `lp = ((5 + |y|) / 6) ** alpha`
    (`alpha = length_penalty`; 0 ranks by raw log-probability), applied per
    hypothesis to its own length. The encoder output, its padding mask and
    the cross-attention keys/values are repeated once per beam. A
    hypothesis that produced `end_id` is finished: it is never extended,
    its score stays fixed, and only `pad_id` follows. The end token
    is forced at the limit of `decode_limits`. `pad_id`, `start_id` and
    `suppressed_ids` are never candidates (`suppress_ids`); scores are the
    model's log-probabilities, not renormalized without them.

    Decoding stops as soon as no sentence's `n_best` can change: when each
    has `n_best` finished hypotheses that score above the best any alive
    one can still reach, `log P / lp(limit)` (its log-probability only
    falls as it grows, and `lp` rises up to the sentence's limit), as in
    tensor2tensor's beam search. The outputs are those of decoding every
    hypothesis to its end; a batch no longer runs until its slowest
    runner-up finishes.

    Args:
        parts: `TransformerParts` of the model.
        source_ids: int32 `(batch, source_length)`, padded with `pad_id`.
        start_id, end_id, pad_id: special token ids.
        beam_size: int >= 1; `beam_size=1` gives greedy decoding.
        length_penalty: float `alpha` >= 0 (0.6 in Wu et al. and in the
            Transformer paper, section 6.1).
        n_best: int in [1, beam_size], hypotheses returned per sentence.
        max_length, length_ratio, length_offset, suppressed_ids: see
            `greedy_search`.

    Returns:
        `(tokens, scores)`: int32 `(batch, n_best, max_length)` ids sorted
        best first (end token included, no start token), and float32
        `(batch, n_best)` length-normalised log-probabilities.

    Raises:
        ValueError: for `beam_size < 1`, `n_best` outside `[1, beam_size]`,
            a `length_penalty` that is negative or not finite, or `beam_size`
            above the vocabulary.

    References:
        Vaswani et al. (2017), section 6.1; Wu et al. (2016), "Google's
        Neural Machine Translation System", section 7.
    """
    beam_size, n_best = int(beam_size), int(n_best)
    if beam_size < 1:
        raise ValueError(f"`beam_size` must be at least 1; got {beam_size}.")
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"`n_best` must be in [1, beam_size={beam_size}]; got {n_best}.")
    length_penalty = check_length_penalty(length_penalty)
    vocab = parts.vocab_size
    if beam_size > vocab:
        raise ValueError(f"`beam_size`={beam_size} exceeds the vocabulary size {vocab}.")
    source_ids = ops.convert_to_tensor(source_ids, "int32")
    blocked = (pad_id, start_id, *suppressed_ids)
    length = (parts.target_sequence_length if max_length is None
              else min(int(max_length), parts.target_sequence_length))
    k = beam_size
    # With growing caches (shapes may change from step to step), sentences
    # whose `n_best` are final leave the batch: later steps run on the others
    # only, and their results wait in the `out_*` tensors.
    compact = bool(getattr(parts, "growing_cache", False))
    encoder_outputs, encoder_outputs_mask = parts.encode(source_ids)
    batch = ops.shape(source_ids)[0]
    limits = decode_limits(encoder_outputs_mask, length, length_ratio, length_offset)
    # Repeat per beam: row b*k + j is beam j of sentence b.
    cross = flatten_caches([
        (ops.repeat(key, k, axis=0), ops.repeat(value, k, axis=0))
        for key, value in parts.cross_caches(encoder_outputs)
    ])
    encoder_outputs_mask = ops.repeat(encoder_outputs_mask, k, axis=0)
    caches = flatten_caches(parts.empty_self_caches(batch * k, length, encoder_outputs.dtype))
    weights = parts.decoding_weights()  # once, outside the loop
    positions = ops.arange(length, dtype="int32")

    vocab_ids = ops.arange(vocab, dtype="int32")
    only_pad = ops.where(ops.equal(vocab_ids, pad_id), 0.0, _NEG)  # (V,)
    is_end = ops.equal(vocab_ids, end_id)

    sequences = ops.full((batch, k, length), pad_id, "int32")
    # Only beam 0 is alive at first, so the k beams start out distinct.
    scores = ops.tile(
        ops.expand_dims(ops.concatenate([ops.zeros((1,)), ops.full((k - 1,), _NEG)]), 0),
        (batch, 1),
    )
    finished = ops.zeros((batch, k), "bool")
    lengths = ops.zeros((batch, k), "int32")
    last = check_id_range(ops.full((batch * k,), start_id, "int32"), parts.vocab_size, "`start_id`")

    def settled(scores, finished, lengths, limits):
        """bool `(batch,)`: the sentence's `n_best` are final."""
        limit_penalty = ops.expand_dims(length_penalty_factor(limits, length_penalty), 1)
        reachable = ops.max(ops.where(finished, 2 * _NEG, scores / limit_penalty), axis=1)
        # A relative margin of 1e-5, against float rounding: it can only
        # make the search run longer, never change its outputs.
        threshold = ops.expand_dims(reachable + 1e-5 * ops.abs(reachable), 1)
        final = scores / length_penalty_factor(lengths, length_penalty)
        beyond_reach = ops.logical_and(finished, ops.greater(final, threshold))
        return ops.sum(ops.cast(beyond_reach, "int32"), axis=1) >= n_best

    def step(t, last, sequences, scores, finished, lengths, caches, cross, encoder_outputs_mask, limits):
        """One position for every alive sentence: the new state."""
        n = ops.shape(scores)[0]
        logits, new_caches = parts.decode_step(
            last, t, unflatten_caches(caches), unflatten_caches(cross), encoder_outputs_mask, weights=weights
        )
        log_probs = suppress_ids(ops.log_softmax(logits, axis=-1), vocab, blocked)
        log_probs = ops.reshape(log_probs, (n, k, vocab))
        at_limit = ops.reshape(ops.greater_equal(t + 1, limits), (n, 1, 1))
        log_probs = ops.where(ops.logical_and(at_limit, ops.logical_not(is_end)), _NEG, log_probs)
        log_probs = ops.where(ops.expand_dims(finished, -1), only_pad, log_probs)
        total = ops.expand_dims(scores, -1) + log_probs  # (n, k, V)
        new_length = ops.where(finished, lengths, t + 1)
        normalised = total / ops.expand_dims(length_penalty_factor(new_length, length_penalty), -1)
        _, index = ops.top_k(ops.reshape(normalised, (n, k * vocab)), k)
        index = ops.cast(index, "int32")
        parent = index // vocab
        token = index % vocab
        scores = ops.take_along_axis(ops.reshape(total, (n, k * vocab)), index, axis=1)
        was_finished = ops.take_along_axis(finished, parent, axis=1)
        lengths = ops.take_along_axis(new_length, parent, axis=1)
        finished = ops.logical_or(was_finished, ops.equal(token, end_id))
        sequences = ops.take_along_axis(sequences, ops.expand_dims(parent, -1), axis=1)
        # `where` on a position mask: cheaper than `slice_update` on tensorflow.
        sequences = ops.where(
            ops.reshape(ops.equal(positions, t), (1, 1, -1)), ops.expand_dims(token, -1), sequences
        )
        rows = ops.expand_dims(ops.arange(n, dtype="int32") * k, 1) + parent  # (n, k)
        return token, sequences, scores, finished, lengths, flatten_caches(new_caches), rows

    if not compact:

        def cond(t, last, sequences, scores, finished, lengths, *caches):
            return ops.logical_and(
                t < length, ops.logical_not(ops.all(settled(scores, finished, lengths, limits)))
            )

        def body(t, last, sequences, scores, finished, lengths, *caches):
            token, sequences, scores, finished, lengths, new_caches, rows = step(
                t, last, sequences, scores, finished, lengths, caches, cross, encoder_outputs_mask, limits
            )
            rows = ops.reshape(rows, (-1,))
            new_caches = [ops.take(cache, rows, axis=0) for cache in new_caches]
            return (t + 1, ops.reshape(token, (-1,)), sequences, scores, finished, lengths, *new_caches)

        outputs = ops.while_loop(
            cond,
            body,
            (ops.convert_to_tensor(0, "int32"), last, sequences, scores, finished, lengths, *caches),
        )
        sequences, scores, lengths = outputs[2], outputs[3], outputs[5]
    else:
        num_caches, num_cross = len(caches), len(cross)

        def split(state):
            t, last, sequences, scores, finished, lengths, alive, out_seq, out_scores, out_lengths = state[:10]
            rest = state[10:]
            return (t, last, sequences, scores, finished, lengths, alive, out_seq, out_scores, out_lengths,
                    list(rest[:num_caches]), list(rest[num_caches:num_caches + num_cross]),
                    rest[num_caches + num_cross], rest[num_caches + num_cross + 1])

        def cond(t, *state):
            return ops.logical_and(t < length, ops.shape(state[1])[0] > 0)

        def body(*state):
            (t, last, sequences, scores, finished, lengths, alive, out_seq, out_scores, out_lengths,
             caches, cross, encoder_outputs_mask, limits) = split(state)
            token, sequences, scores, finished, lengths, new_caches, rows = step(
                t, last, sequences, scores, finished, lengths, caches, cross, encoder_outputs_mask, limits
            )
            done = ops.logical_or(settled(scores, finished, lengths, limits), t + 1 >= length)
            # Results of the sentences that are done; the others go on.
            where_done = ops.expand_dims(alive, 1)
            out_seq = ops.where(ops.reshape(done, (-1, 1, 1)), sequences, ops.take(out_seq, alive, axis=0))
            out_seq = ops.scatter_update(state[7], where_done, out_seq)
            out_scores = ops.scatter_update(
                out_scores, where_done, ops.where(ops.expand_dims(done, 1), scores, ops.take(out_scores, alive, axis=0))
            )
            out_lengths = ops.scatter_update(
                out_lengths, where_done, ops.where(ops.expand_dims(done, 1), lengths, ops.take(out_lengths, alive, axis=0))
            )
            keep = ops.reshape(ops.where(ops.logical_not(done)), (-1,))
            keep = ops.cast(keep, "int32")
            beam_rows = ops.reshape(ops.take(rows, keep, axis=0), (-1,))
            kept_rows = ops.reshape(ops.expand_dims(keep * k, 1) + ops.arange(k, dtype="int32"), (-1,))
            return (
                t + 1,
                ops.reshape(ops.take(token, keep, axis=0), (-1,)),
                ops.take(sequences, keep, axis=0),
                ops.take(scores, keep, axis=0),
                ops.take(finished, keep, axis=0),
                ops.take(lengths, keep, axis=0),
                ops.take(alive, keep, axis=0),
                out_seq, out_scores, out_lengths,
                *[ops.take(cache, beam_rows, axis=0) for cache in new_caches],
                *[ops.take(c, kept_rows, axis=0) for c in cross],
                ops.take(encoder_outputs_mask, kept_rows, axis=0),
                ops.take(limits, keep, axis=0),
            )

        alive = ops.arange(batch, dtype="int32")
        shrinking = [relax_batch(x) for x in (last, sequences, scores, finished, lengths, alive)]
        outputs = ops.while_loop(
            cond,
            body,
            (ops.convert_to_tensor(0, "int32"), *shrinking, sequences, scores, lengths,
             *caches, *[relax_batch(c) for c in cross], relax_batch(encoder_outputs_mask), relax_batch(limits)),
        )
        sequences, scores, lengths = outputs[7], outputs[8], outputs[9]
    normalised = scores / length_penalty_factor(lengths, length_penalty)
    best_scores, order = ops.top_k(normalised, n_best)
    best = ops.take_along_axis(sequences, ops.expand_dims(ops.cast(order, "int32"), -1), axis=1)
    return best, best_scores
