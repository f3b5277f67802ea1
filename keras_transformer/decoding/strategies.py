"""Decoding strategies as objects: what a `Translator` searches with.

A strategy holds the search's own settings (beam size, length penalty,
how many hypotheses to return) and is called with the model's
`TransformerParts`, the source ids and the settings that belong to the
vocabulary and the output limit. Every strategy runs in one loop,
`search_loop.dynamic_decode`, and only picks each step's tokens. `get`
turns a name, a config dict or a strategy into a strategy, as
OpenNMT-tf's `utils/decoding.py` and Keras's `get` functions do.

>>> get("beam", beam_size=5)
BeamSearch(beam_size=5, length_penalty=0.6, n_best=1)
>>> get({"name": "greedy"})
GreedySearch()
"""

import math

from keras import ops

from keras_transformer.decoding.gather import take_along_last_axis
from keras_transformer.decoding.gather import take_rows
from keras_transformer.decoding.limits import NEG_LOG_PROB
from keras_transformer.decoding.limits import suppress_ids
from keras_transformer.decoding.search_loop import dynamic_decode
from keras_transformer.decoding.top_k import top_k
from keras_transformer.validation import check_count


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


class SearchStrategy:
    """The interface of a decoding strategy.

    Calling one with `(parts, source_ids, *, start_id, end_id, pad_id,
    max_length, length_ratio, length_offset, suppressed_ids, n_best)`
    returns `(tokens, scores)`: int32 `(batch, n_best, max_length)` output
    ids (best first, the end token included, no start token) and float32
    `(batch, n_best)` scores. `n_best` (default: the strategy's own) must
    be at most `max_n_best`.

    A strategy runs in `search_loop.dynamic_decode`, the one loop, through
    `beams`, `initial_state`, `step`, `settled` and `finalize` (described
    there).
    """

    name = None
    beams = 1
    drops_settled = False

    @property
    def max_n_best(self):
        return 1

    def get_config(self):
        return {}

    def __repr__(self):
        settings = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({settings})"

    def __eq__(self, other):
        return type(self) is type(other) and self.get_config() == other.get_config()


class GreedySearch(SearchStrategy):
    """The most probable token at each step; one hypothesis per sentence,
    scored by its summed log-probability (`greedy_search`). Only `pad_id`
    follows the end token."""

    name = "greedy"

    def __call__(self, parts, source_ids, *, n_best=None, **settings):
        if n_best not in (None, 1):
            raise ValueError("Greedy search returns one hypothesis per sentence (n_best=1); "
                             "use BeamSearch(beam_size=N) for an n-best list.")
        tokens, scores, _ = dynamic_decode(parts, source_ids, self, **settings)
        return tokens[:, None, :], scores[:, None]

    def initial_state(self, batch, length, pad_id, attention_shape):
        # The weights are carried through the loop only when asked for. No
        # placeholder otherwise: a constant carried unchanged through three
        # or more phase loops failed XLA's compilation ("Cannot find body
        # function while_2_body_..._const_0").
        state = (ops.full((batch, length), pad_id, "int32"), ops.zeros((batch,), "bool"),
                 ops.zeros((batch,), "float32"))
        if attention_shape:
            state += (ops.zeros((batch, length, *attention_shape), "float32"),)
        return state

    def step(self, t, log_probs, state, at_limit, end_id, pad_id, blocked, attention):
        tokens, finished, scores = state[:3]
        log_probs = suppress_ids(log_probs[:, 0], log_probs.shape[-1], blocked)
        positions = ops.arange(tokens.shape[1], dtype="int32")
        best = ops.cast(ops.argmax(log_probs, axis=-1), "int32")
        best = ops.where(at_limit, end_id, best)
        best = ops.where(finished, pad_id, best)
        gained = take_along_last_axis(log_probs, best[:, None])[:, 0]
        scores = scores + ops.where(finished, 0.0, gained)
        if attention is not None:
            weights = state[3]
            step_weights = ops.where(ops.reshape(finished, (-1, 1, 1)), 0.0, ops.cast(attention, "float32"))
            weights = ops.where(
                ops.reshape(ops.equal(positions, t), (1, -1, 1, 1)), ops.expand_dims(step_weights, 1), weights
            )
        # `where` on a position mask rather than `slice_update`: on tensorflow
        # the latter is an XLA op launched per call, the costliest op here.
        tokens = ops.where(ops.equal(positions, t)[None, :], best[:, None], tokens)
        finished = ops.logical_or(finished, ops.equal(best, end_id))
        return best[:, None], None, (tokens, finished, scores) + ((weights,) if attention is not None else ())

    def settled(self, state, limits):
        return state[1]

    def finalize(self, state):
        """`(tokens (batch, max_length), scores (batch,), attention)`; the
        attention is None unless the search was asked for it."""
        tokens, _, scores = state[:3]
        return tokens, scores, state[3] if len(state) > 3 else None


class BeamSearch(SearchStrategy):
    """Beam search with the GNMT length penalty (`beam_search`).

    Each sentence keeps `beam_size` hypotheses ranked by `log P(y) / lp(y)`
    with `lp = ((5 + |y|) / 6) ** length_penalty`, applied per hypothesis
    to its own length. A hypothesis that produced the end token is
    finished: it is never extended, its score stays fixed, and only
    `pad_id` follows. A sentence is settled when its `n_best` finished
    hypotheses score above the best any alive one can still reach, `log P
    / lp(limit)` (tensor2tensor's stopping rule), so the outputs are those
    of decoding every hypothesis to its end.

    Args:
        beam_size: int >= 2 (a beam of 1 is `GreedySearch`).
        length_penalty: float `alpha` >= 0 (0.6 in the paper, section 6.1).
        n_best: int in `[1, beam_size]`, hypotheses returned per sentence
            unless a call asks for another number.

    Raises:
        ValueError: for a beam below 2, an `n_best` outside `[1,
            beam_size]` or a negative or non-finite `length_penalty`.
    """

    name = "beam"
    drops_settled = True

    def __init__(self, beam_size=4, length_penalty=0.6, n_best=1):
        if check_count(beam_size, "beam_size") < 2:
            raise ValueError(f"BeamSearch needs beam_size >= 2; got {beam_size}. A beam of 1 is "
                             "GreedySearch() (or Translator(beam_size=1)).")
        self._configure(beam_size, length_penalty, n_best)

    def _configure(self, beam_size, length_penalty, n_best):
        self.beam_size = check_count(beam_size, "beam_size")
        self.n_best = check_count(n_best, "n_best")
        if not 1 <= self.n_best <= self.beam_size:
            raise ValueError(f"`n_best` must be in [1, beam_size={self.beam_size}]; got {n_best}.")
        self.length_penalty = check_length_penalty(length_penalty)

    @classmethod
    def any_size(cls, beam_size, length_penalty=0.6, n_best=1):
        """A beam search that also takes `beam_size=1` (greedy decoding
        with beam search's scores), as `beam_search` does."""
        check_count(beam_size, "beam_size")
        strategy = cls.__new__(cls)
        strategy._configure(beam_size, length_penalty, n_best)
        return strategy

    @property
    def beams(self):
        return self.beam_size

    @property
    def max_n_best(self):
        return self.beam_size

    def get_config(self):
        return {"beam_size": self.beam_size, "length_penalty": self.length_penalty, "n_best": self.n_best}

    def __call__(self, parts, source_ids, *, n_best=None, **settings):
        strategy = self if n_best is None else type(self).any_size(self.beam_size, self.length_penalty, n_best)
        if self.beam_size > parts.vocab_size:
            raise ValueError(f"`beam_size`={self.beam_size} exceeds the vocabulary size {parts.vocab_size}.")
        return dynamic_decode(parts, source_ids, strategy, **settings)

    def initial_state(self, batch, length, pad_id, attention_shape):
        if attention_shape:
            raise ValueError("Beam search returns no attention weights; use greedy search for them.")
        k = self.beam_size
        # Only beam 0 is alive at first, so the k beams start out distinct.
        scores = ops.tile(
            ops.expand_dims(ops.concatenate([ops.zeros((1,)), ops.full((k - 1,), NEG_LOG_PROB)]), 0),
            (batch, 1),
        )
        return (ops.full((batch, k, length), pad_id, "int32"), scores,
                ops.zeros((batch, k), "bool"), ops.zeros((batch, k), "int32"))

    def step(self, t, log_probs, state, at_limit, end_id, pad_id, blocked, attention):
        sequences, scores, finished, lengths = state
        n, k, vocab = ops.shape(scores)[0], self.beam_size, log_probs.shape[-1]
        # The search ranks all `k * vocab` continuations of a sentence. Only
        # a few per hypothesis can be among its `k` best, so the scores are
        # computed for those candidates alone: the top `k + len(blocked)`
        # log-probabilities of each hypothesis (at least `k` of them not
        # blocked), the end and pad ids (the only tokens of a hypothesis at
        # its limit or finished) and the `k + 1` lowest ids (the
        # `NEG_LOG_PROB` entries the full ranking would take, lowest id
        # first, when a sentence has fewer than `k` possible continuations).
        # They are ranked in id order with the formulas of the full
        # ranking, so the picks, ties included, are the same.
        _, best = top_k(log_probs, min(k + len(blocked), vocab))
        always = sorted({i for i in (end_id, pad_id, *range(k + 1)) if 0 <= i < vocab})
        ids = ops.concatenate([best, ops.broadcast_to(ops.convert_to_tensor(always, "int32"), (n, k, len(always)))], -1)
        ids = ops.sort(ids, axis=-1)
        repeated = ops.concatenate([ops.zeros((n, k, 1), "bool"), ops.equal(ids[..., 1:], ids[..., :-1])], -1)
        candidates = ids.shape[-1]
        log_probs = take_along_last_axis(log_probs, ids)  # (n, k, candidates)
        if blocked:
            is_blocked = ops.any(ops.equal(ops.expand_dims(ids, -1), ops.convert_to_tensor(blocked, "int32")), -1)
            log_probs = ops.where(is_blocked, NEG_LOG_PROB, log_probs)
        at_limit = ops.reshape(at_limit, (-1, 1, 1))
        log_probs = ops.where(ops.logical_and(at_limit, ops.not_equal(ids, end_id)), NEG_LOG_PROB, log_probs)
        only_pad = ops.where(ops.equal(ids, pad_id), 0.0, NEG_LOG_PROB)
        log_probs = ops.where(ops.expand_dims(finished, -1), only_pad, log_probs)
        total = ops.expand_dims(scores, -1) + log_probs  # (n, k, candidates)
        new_length = ops.where(finished, lengths, t + 1)
        normalised = total / ops.expand_dims(length_penalty_factor(new_length, self.length_penalty), -1)
        normalised = ops.where(repeated, float("-inf"), normalised)  # an id listed twice counts once
        _, index = ops.top_k(ops.reshape(normalised, (-1, k * candidates)), k)
        index = ops.cast(index, "int32")
        parent = index // candidates
        token = take_along_last_axis(ops.reshape(ids, (-1, k * candidates)), index)
        scores = take_along_last_axis(ops.reshape(total, (-1, k * candidates)), index)
        was_finished = take_along_last_axis(finished, parent)
        lengths = take_along_last_axis(new_length, parent)
        finished = ops.logical_or(was_finished, ops.equal(token, end_id))
        # Rows of the flattened hypotheses: a plain gather, where
        # `take_along_axis` broadcasts and transposes the index.
        length = sequences.shape[-1]
        rows = ops.reshape(ops.expand_dims(ops.arange(n, dtype="int32") * k, 1) + parent, (-1,))
        sequences = ops.reshape(take_rows(ops.reshape(sequences, (-1, length)), rows), (-1, k, length))
        # `where` on a position mask: cheaper than `slice_update` on tensorflow.
        positions = ops.arange(length, dtype="int32")
        sequences = ops.where(
            ops.reshape(ops.equal(positions, t), (1, 1, -1)), ops.expand_dims(token, -1), sequences
        )
        return token, parent, (sequences, scores, finished, lengths)

    def settled(self, state, limits):
        _, scores, finished, lengths = state
        limit_penalty = ops.expand_dims(length_penalty_factor(limits, self.length_penalty), 1)
        reachable = ops.max(ops.where(finished, 2 * NEG_LOG_PROB, scores / limit_penalty), axis=1)
        # A relative margin of 1e-5, against float rounding: it can only
        # make the search run longer, never change its outputs.
        threshold = ops.expand_dims(reachable + 1e-5 * ops.abs(reachable), 1)
        final = scores / length_penalty_factor(lengths, self.length_penalty)
        beyond_reach = ops.logical_and(finished, ops.greater(final, threshold))
        return ops.sum(ops.cast(beyond_reach, "int32"), axis=1) >= self.n_best

    def finalize(self, state):
        """`(tokens (batch, n_best, max_length), scores (batch, n_best))`,
        best first, the scores length-normalised."""
        sequences, scores, _, lengths = state
        normalised = scores / length_penalty_factor(lengths, self.length_penalty)
        best_scores, order = ops.top_k(normalised, self.n_best)
        best = ops.take_along_axis(sequences, ops.expand_dims(ops.cast(order, "int32"), -1), axis=1)
        return best, best_scores


STRATEGIES = {"greedy": GreedySearch, "beam": BeamSearch}


def get(identifier, **settings):
    """A strategy from a name (`"greedy"`, `"beam"`) with `settings`, a dict
    `{"name": ..., **settings}`, or a strategy (returned as is).

    Raises:
        ValueError: for an unknown name (the message lists the known ones),
            or settings the strategy does not take.
    """
    if isinstance(identifier, SearchStrategy):
        if settings:
            raise ValueError(f"settings {sorted(settings)} given with a strategy object; set them on it.")
        return identifier
    if isinstance(identifier, dict):
        settings = {**{k: v for k, v in identifier.items() if k != "name"}, **settings}
        identifier = identifier.get("name")
    if identifier not in STRATEGIES:
        raise ValueError(f"Unknown decoding strategy {identifier!r}; use one of {sorted(STRATEGIES)}.")
    import inspect

    parameters = inspect.signature(STRATEGIES[identifier].__init__).parameters.values()
    known = {p.name for p in parameters if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ValueError(f"{identifier!r} search: unknown settings {unknown}; it takes "
                         f"{sorted(known) or 'none'}.")
    return STRATEGIES[identifier](**settings)
