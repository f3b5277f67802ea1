"""Several Transformers decoded as one: an ensemble of their predictions.

`EnsembleParts` takes the `TransformerParts` of models that share their
vocabularies (the same source and target tokenizers) and is a
`TransformerParts` to every search (`greedy_search`, `beam_search`,
`dynamic_decode`): each model encodes the source and decodes the shared
prefix with its own caches, and a step's log-probabilities are those of the
mean of the models' distributions,

    log p(y | x, y<t) = log (1/M) sum_m p_m(y | x, y<t),

the ensemble of Sutskever et al. (2014). It averages
predictions, not weights: averaging the weights of one run's checkpoints is
`keras-transformer average`. Ensembles of independently trained models
translate better than any of their members, at the members' summed cost a
step; they are also the usual teacher of sequence-level knowledge
distillation (Kim & Rush, 2016; Freitag et al., 2017): a student trained on
an ensemble's translations of the training sources.

The members may differ in depth, width and heads; they must agree on the
source and target vocabularies and the padding id. Attention weights are
not defined for an ensemble (`return_attention_scores`).
"""

import math

from keras import ops

from keras_transformer.decoding.model_parts import TransformerParts


class EnsembleParts:
    """The `TransformerParts` of several models, decoded as one.

    Args:
        members: list of two or more `TransformerParts` (or `Transformer`
            models, wrapped with `pad_id` and `growing_cache`), with equal
            source and target vocabulary sizes and the same `pad_id`.
        pad_id: int, the source padding id, for models given as models.
        growing_cache: bool, for models given as models
            (`TransformerParts`).

    Raises:
        ValueError: for fewer than two members, members that disagree on
            a vocabulary size, `pad_id` or cache layout.

    Example:
    >>> import keras
    >>> from keras_transformer import build_transformer
    >>> from keras_transformer.decoding import EnsembleParts, greedy_search
    >>> keras.utils.set_random_seed(0)
    >>> models = [build_transformer(40, 40, num_layers=n, d_model=16, num_heads=2, dff=32,
    ...                             sequence_length=8) for n in (1, 2)]
    >>> ensemble = EnsembleParts(models)
    >>> tokens, scores = greedy_search(ensemble, [[5, 6, 2]], start_id=1, end_id=2, max_length=4)
    >>> tuple(tokens.shape)
    (1, 4)
    """

    # `decode_step` returns normalized log-probabilities, which the searches
    # take as they are (a `TransformerParts` returns logits).
    returns_log_probs = True

    def __init__(self, members, pad_id=0, growing_cache=False):
        members = [
            m if isinstance(m, TransformerParts) else TransformerParts(m, pad_id=pad_id, growing_cache=growing_cache)
            for m in members
        ]
        if len(members) < 2:
            raise ValueError(f"An ensemble needs two or more models; got {len(members)}. "
                             "Decode a single model with its own TransformerParts.")
        first = members[0]
        for i, member in enumerate(members[1:], 1):
            for what, a, b in (
                ("source vocabulary size", first.encoder_embedding.vocab_size, member.encoder_embedding.vocab_size),
                ("target vocabulary size", first.vocab_size, member.vocab_size),
                ("pad_id", first.pad_id, member.pad_id),
                ("growing_cache", first.growing_cache, member.growing_cache),
            ):
                if a != b:
                    raise ValueError(
                        f"Ensemble member {i} has {what} {b!r} but member 0 has {a!r}: the models of "
                        "an ensemble must share their tokenizers (train them on the same corpus "
                        "with the same vocabulary settings) and be decoded with one cache layout."
                    )
        self.members = members
        self.pad_id = first.pad_id
        self.growing_cache = first.growing_cache
        self.output_kernel = None
        self.encoder_embedding = first.encoder_embedding
        self.decoder_embedding = first.decoder_embedding
        self.vocab_size = first.vocab_size
        self.num_heads = first.num_heads
        self.key_dim = first.key_dim
        # The shortest limits of all: no member reads past its positions.
        self.target_sequence_length = min(m.target_sequence_length for m in members)
        self.source_sequence_length = min(m.source_sequence_length for m in members)
        self._widths = [int(m.model.d_model) for m in members]
        self._layers = [len(m.decoder_layers) for m in members]

    @property
    def decoder_layers(self):
        """Every member's decoder layers, member by member."""
        return [layer for m in self.members for layer in m.decoder_layers]

    def _split_caches(self, caches):
        """A flat list of per-layer caches -> one list per member."""
        out, start = [], 0
        for count in self._layers:
            out.append(list(caches[start:start + count]))
            start += count
        return out

    def encode(self, source_ids):
        """Every member's encoder: `(outputs (batch, S, sum of d_model),
        mask (batch, S))`, the members' outputs side by side on the last
        axis (the mask is the same for all: it marks the non-pad ids)."""
        encoded = [m.encode(source_ids) for m in self.members]
        return ops.concatenate([outputs for outputs, _ in encoded], axis=-1), encoded[0][1]

    def _member_outputs(self, encoder_outputs):
        bounds = [sum(self._widths[:i]) for i in range(len(self._widths) + 1)]
        return [encoder_outputs[..., bounds[i]:bounds[i + 1]] for i in range(len(self.members))]

    def cross_caches(self, encoder_outputs):
        """Every member's cross-attention caches, member by member."""
        return [cache for m, outputs in zip(self.members, self._member_outputs(encoder_outputs))
                for cache in m.cross_caches(outputs)]

    def empty_self_caches(self, batch_size, length, dtype):
        """Every member's empty self-attention caches, member by member."""
        return [cache for m in self.members for cache in m.empty_self_caches(batch_size, length, dtype)]

    def cache_phases(self, length):
        """The members' phases (`TransformerParts.cache_phases`: the same
        for every member)."""
        return self.members[0].cache_phases(length)

    def grow_self_caches(self, self_caches, length):
        """Every member's caches padded to `length` slots."""
        return [cache for m, caches in zip(self.members, self._split_caches(self_caches))
                for cache in m.grow_self_caches(caches, length)]

    def decoding_weights(self):
        """Every member's `decoding_weights()`, in a list."""
        return [m.decoding_weights() for m in self.members]

    def decode_step(self, token_ids, index, self_caches, cross_caches, encoder_outputs_mask,
                    return_attention_scores=False, weights=None, beams_per_source=1):
        """One position of every member; see `TransformerParts.decode_step`.

        Returns:
            `(log_probs (batch, vocab) float32, new self_caches)`: the log
            of the members' mean distribution (normalized: the searches
            take it as it is, `returns_log_probs`).

        Raises:
            ValueError: for `return_attention_scores=True`.
        """
        if return_attention_scores:
            raise ValueError("An ensemble has no one set of attention weights; plot or align "
                             "with a single model's Translator.")
        weights = weights or self.decoding_weights()
        log_probs, new_caches = [], []
        for m, member_weights, own, cross in zip(self.members, weights, self._split_caches(self_caches),
                                                  self._split_caches(cross_caches)):
            logits, caches = m.decode_step(token_ids, index, own, cross, encoder_outputs_mask,
                                           weights=member_weights, beams_per_source=beams_per_source)
            log_probs.append(ops.log_softmax(logits, axis=-1))
            new_caches.extend(caches)
        mean = ops.logsumexp(ops.stack(log_probs, axis=0), axis=0) - math.log(len(self.members))
        return mean, new_caches

    def decode_uncached(self, source_ids, target_ids):
        """Every member on a whole prefix: the log of the members' mean
        distribution, float32 `(batch, T, vocab)`."""
        log_probs = [ops.log_softmax(ops.cast(m.decode_uncached(source_ids, target_ids), "float32"), axis=-1)
                     for m in self.members]
        return ops.logsumexp(ops.stack(log_probs, axis=0), axis=0) - math.log(len(self.members))
