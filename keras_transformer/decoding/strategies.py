"""Decoding strategies as objects: what a `Translator` searches with.

A strategy holds the search's own settings (beam size, length penalty,
how many hypotheses to return) and is called with the model's
`TransformerParts`, the source ids and the settings that belong to the
vocabulary and the output limit. `get` turns a name, a config dict or a
strategy into a strategy, as OpenNMT-tf's `utils/decoding.py` and Keras's
`get` functions do.

>>> get("beam", beam_size=5)
BeamSearch(beam_size=5, length_penalty=0.6, n_best=1)
>>> get({"name": "greedy"})
GreedySearch()
"""

from keras_transformer.decoding.beam_search import beam_search
from keras_transformer.decoding.beam_search import check_length_penalty
from keras_transformer.decoding.greedy import greedy_search


class SearchStrategy:
    """The interface of a decoding strategy.

    Calling one with `(parts, source_ids, *, start_id, end_id, pad_id,
    max_length, length_ratio, length_offset, suppressed_ids, n_best)`
    returns `(tokens, scores)`: int32 `(batch, n_best, max_length)` output
    ids (best first, the end token included, no start token) and float32
    `(batch, n_best)` scores. `n_best` (default: the strategy's own) must
    be at most `max_n_best`.
    """

    name = None

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
    """The most probable token at each step (`greedy_search`); one
    hypothesis per sentence, scored by its summed log-probability."""

    name = "greedy"

    def __call__(self, parts, source_ids, *, n_best=None, **settings):
        if n_best not in (None, 1):
            raise ValueError("Greedy search returns one hypothesis per sentence (n_best=1); "
                             "use BeamSearch(beam_size=N) for an n-best list.")
        tokens, scores = greedy_search(parts, source_ids, **settings)
        return tokens[:, None, :], scores[:, None]


class BeamSearch(SearchStrategy):
    """Beam search with the GNMT length penalty (`beam_search`).

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

    def __init__(self, beam_size=4, length_penalty=0.6, n_best=1):
        self.beam_size = int(beam_size)
        if self.beam_size < 2:
            raise ValueError(f"BeamSearch needs beam_size >= 2; got {beam_size}. A beam of 1 is "
                             "GreedySearch() (or Translator(beam_size=1)).")
        self.length_penalty = check_length_penalty(length_penalty)
        self.n_best = int(n_best)
        if not 1 <= self.n_best <= self.beam_size:
            raise ValueError(f"`n_best` must be in [1, beam_size={self.beam_size}]; got {n_best}.")

    @property
    def max_n_best(self):
        return self.beam_size

    def get_config(self):
        return {"beam_size": self.beam_size, "length_penalty": self.length_penalty, "n_best": self.n_best}

    def __call__(self, parts, source_ids, *, n_best=None, **settings):
        return beam_search(
            parts, source_ids, beam_size=self.beam_size, length_penalty=self.length_penalty,
            n_best=self.n_best if n_best is None else n_best, **settings,
        )


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
