"""Beam search with a key/value cache and the GNMT length penalty."""

from keras_transformer.decoding.strategies import BeamSearch
from keras_transformer.decoding.strategies import check_length_penalty  # noqa: F401 (public here too)
from keras_transformer.decoding.strategies import length_penalty_factor  # noqa: F401 (public here too)


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
    """Beam search over a batch, `beam_size` hypotheses per sentence:
    `BeamSearch` in the one decoding loop (`search_loop.dynamic_decode`).

    Each sentence keeps `beam_size` hypotheses ranked by
    `log P(y) / lp(y)` with the GNMT penalty `lp = ((5 + |y|) / 6) ** alpha`
    (`alpha = length_penalty`; 0 ranks by raw log-probability), applied per
    hypothesis to its own length. The beams of a sentence share its encoder
    output, padding mask and cross-attention keys/values. A
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
            a `length_penalty` that is negative or not finite, `beam_size`
            above the vocabulary, sources not of shape `(batch,
            source_length)`, or `start_id`, `end_id`, `pad_id` or a suppressed
            id outside `[0, vocab_size)`.
        TypeError: for sources that are not integer ids.

    References:
        Vaswani et al. (2017), section 6.1; Wu et al. (2016), "Google's
        Neural Machine Translation System", section 7.
    """
    strategy = BeamSearch.any_size(beam_size, length_penalty, n_best)
    return strategy(
        parts, source_ids, start_id=start_id, end_id=end_id, pad_id=pad_id, max_length=max_length,
        length_ratio=length_ratio, length_offset=length_offset, suppressed_ids=suppressed_ids,
    )
