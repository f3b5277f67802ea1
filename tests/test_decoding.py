"""Greedy and beam search with the key/value cache.

Backend-neutral: `tests/test_backends.py` re-runs this file on jax and torch.
"""

import keras
import numpy as np
import pytest
from keras import ops

from conftest import to_numpy
from keras_transformer import TransformerParts
from keras_transformer import beam_search
from keras_transformer import build_transformer
from keras_transformer import greedy_search
from keras_transformer.decoding import length_penalty_factor

START, END, PAD = 2, 3, 0
SOURCES = np.array([[5, 6, 7, END, PAD, PAD], [8, 9, 10, 11, 12, END]], "int32")


@pytest.fixture(scope="module")
def parts():
    keras.utils.set_random_seed(0)
    model = build_transformer(
        30, 25, num_layers=2, d_model=16, num_heads=2, dff=32, dropout_rate=0.0, sequence_length=10
    )
    return TransformerParts(model)


def test_cached_step_logits_equal_uncached_full_pass(parts):
    """Cached decoding equals re-running the whole prefix (1e-5, float32)."""
    target = np.array([[START, 4, 5, 6, 7], [START, 9, 9, 8, 4]], "int32")
    full = to_numpy(parts.decode_uncached(SOURCES, target))
    encoder_outputs, mask = parts.encode(SOURCES)
    cross = parts.cross_caches(encoder_outputs)
    caches = parts.empty_self_caches(2, parts.target_sequence_length, "float32")
    for t in range(target.shape[1]):
        logits, caches = parts.decode_step(target[:, t], t, caches, cross, mask)
        np.testing.assert_allclose(to_numpy(logits), full[:, t], atol=1e-5)


def test_beams_share_their_sources_cross_attention_caches(parts):
    """A step of 3 hypotheses per source against the sources' own cross
    caches (`beams_per_source=3`) equals the step against caches copied for
    every hypothesis, attention weights included; and beam search hands
    `decode_step` one cross cache row per source, not per hypothesis."""
    beams = 3
    encoder_outputs, mask = parts.encode(SOURCES)
    cross = parts.cross_caches(encoder_outputs)
    copied = [tuple(ops.repeat(c, beams, axis=0) for c in pair) for pair in cross]
    rng = np.random.default_rng(0)
    tokens = [rng.integers(4, 25, 2 * beams).astype("int32") for _ in range(3)]
    shared_caches = copied_caches = parts.empty_self_caches(2 * beams, parts.target_sequence_length, "float32")
    for t, step_tokens in enumerate(tokens):
        logits, shared_caches, weights = parts.decode_step(
            step_tokens, t, shared_caches, cross, mask, return_attention_scores=True, beams_per_source=beams)
        want, copied_caches, want_weights = parts.decode_step(
            step_tokens, t, copied_caches, copied, ops.repeat(mask, beams, axis=0), return_attention_scores=True)
        np.testing.assert_allclose(to_numpy(logits), to_numpy(want), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(to_numpy(weights), to_numpy(want_weights), rtol=1e-6, atol=1e-6)

    seen = []

    class Recording(TransformerParts):
        def decode_step(self, token_ids, index, self_caches, cross_caches, mask, **settings):
            seen.append((int(ops.shape(token_ids)[0]), int(ops.shape(cross_caches[0][0])[0]),
                         int(ops.shape(mask)[0]), settings.get("beams_per_source")))
            return super().decode_step(token_ids, index, self_caches, cross_caches, mask, **settings)

    recording = Recording(parts.model)
    want_tokens, _ = beam_search(parts, SOURCES, start_id=START, end_id=END, beam_size=beams)
    got_tokens, _ = beam_search(recording, SOURCES, start_id=START, end_id=END, beam_size=beams)
    np.testing.assert_array_equal(to_numpy(got_tokens), to_numpy(want_tokens))
    assert seen and seen[0] == (2 * beams, 2, 2, beams)


def test_greedy_equals_uncached_argmax_decoding(parts):
    tokens, _ = greedy_search(parts, SOURCES, start_id=START, end_id=END)
    tokens = to_numpy(tokens)
    length = parts.target_sequence_length
    for row in range(2):
        prefix = [START]
        for _ in range(length):
            # The whole prefix through the uncached decoder, padded to one
            # width (one shape to compile on jax): under the causal mask the
            # padding after the prefix cannot change its last position.
            padded = np.array([prefix + [PAD] * (length - len(prefix))], "int32")
            logits = to_numpy(parts.decode_uncached(SOURCES[row : row + 1], padded))
            candidates = logits[0, len(prefix) - 1].copy()
            candidates[[PAD, START]] = -np.inf  # never outputs
            nxt = int(candidates.argmax())
            if len(prefix) == length:
                nxt = END  # forced at the limit
            prefix.append(nxt)
            if nxt == END:
                break
        want = prefix[1:] + [PAD] * (length + 1 - len(prefix))
        np.testing.assert_array_equal(tokens[row], want)


def test_c18_beam_batch_equals_solo_and_beam1_equals_greedy(parts):
    """C18: beam 4 over a batch of two lengths = each alone; beam 1 = greedy."""
    batch, batch_scores = beam_search(parts, SOURCES, start_id=START, end_id=END, beam_size=4)
    for row in range(2):
        solo, solo_scores = beam_search(
            parts, SOURCES[row : row + 1, : 4 if row == 0 else 6], start_id=START, end_id=END, beam_size=4
        )
        np.testing.assert_array_equal(to_numpy(batch)[row], to_numpy(solo)[0])
        np.testing.assert_allclose(to_numpy(batch_scores)[row], to_numpy(solo_scores)[0], atol=1e-4)
    greedy, _ = greedy_search(parts, SOURCES, start_id=START, end_id=END)
    beam1, _ = beam_search(parts, SOURCES, start_id=START, end_id=END, beam_size=1)
    np.testing.assert_array_equal(to_numpy(beam1)[:, 0], to_numpy(greedy))


class ScriptedParts:
    """A fake model: the next-token distribution depends only on the step.

    Steps 0-2 prefer tokens 4, 5, 6 (with 7 a close second); at step 3 the
    best continuation of every hypothesis is END (C20).
    """

    target_sequence_length = 8
    vocab_size = 10

    def __init__(self):
        table = np.full((self.target_sequence_length, self.vocab_size), -6.0, "float32")
        for step, (best, second) in enumerate([(4, 7), (5, 7), (6, 7)]):
            table[step, best], table[step, second], table[step, 8] = 0.0, -0.5, -1.0
        table[3:, END] = 0.0
        table[3:, 9] = -2.0
        table[:, PAD] = -50.0
        self.table = table

    def encode(self, source_ids):
        batch = ops.shape(source_ids)[0]
        return ops.zeros((batch, 1, 1)), ops.ones((batch, 1), "bool")

    def cross_caches(self, encoder_outputs):
        return [(encoder_outputs, encoder_outputs)]

    def empty_self_caches(self, batch, length, dtype):
        return [(ops.zeros((batch, 1)), ops.zeros((batch, 1)))]

    def decoding_weights(self):
        return None

    def decode_step(self, token_ids, index, caches, cross, mask, weights=None, beams_per_source=1):
        row = ops.take(ops.convert_to_tensor(self.table), index, axis=0)
        logits = ops.tile(ops.expand_dims(row, 0), (ops.shape(token_ids)[0], 1))
        return logits, caches


def test_c20_finished_beams_stop_and_are_distinct():
    """C20: nothing after the first END; beams distinct and sorted; scores fixed."""
    parts = ScriptedParts()
    tokens, scores = beam_search(
        parts, np.ones((1, 1), "int32"), start_id=START, end_id=END, beam_size=4, n_best=4,
        length_penalty=0.0,
    )
    tokens, scores = to_numpy(tokens)[0], to_numpy(scores)[0]
    assert tokens.shape == (4, 8)
    rows = []
    for row in tokens:
        ends = np.flatnonzero(row == END)
        assert len(ends) == 1, row
        assert (row[ends[0] + 1 :] == PAD).all()
        assert START not in row
        rows.append(tuple(row[: ends[0] + 1]))
    assert len(set(rows)) == 4
    assert (np.diff(scores) <= 1e-6).all()
    assert rows[0] == (4, 5, 6, END)
    # With alpha = 0 the score is the summed log-probability of the tokens.
    log_probs = np.log(np.exp(parts.table) / np.exp(parts.table).sum(-1, keepdims=True))
    for row, score in zip(rows, scores):
        want = sum(log_probs[t, token] for t, token in enumerate(row))
        assert abs(want - score) < 1e-4


class LogProbParts(ScriptedParts):
    """`ScriptedParts` whose steps are declared log-probabilities
    (`returns_log_probs`, as an ensemble's are): the searches must sum them
    as given, not log-softmax them again. Its rows are the log-softmax of
    `ScriptedParts.table` shifted by 1, so a second normalization would
    move every score by 1 a token."""

    returns_log_probs = True

    def __init__(self):
        super().__init__()
        table = self.table
        self.table = table - np.log(np.exp(table).sum(-1, keepdims=True)) + 1.0


def test_parts_that_return_log_probs_are_not_normalized_again():
    parts = LogProbParts()
    source = np.ones((1, 1), "int32")
    tokens, scores = greedy_search(parts, source, start_id=START, end_id=END)
    row = list(to_numpy(tokens)[0])
    row = row[: row.index(END) + 1]
    assert row == [4, 5, 6, END]
    want = sum(parts.table[t, token] for t, token in enumerate(row))  # 4 tokens: 4 more than normalized
    assert abs(float(to_numpy(scores).reshape(-1)[0]) - want) < 1e-4
    _, beam_scores = beam_search(parts, source, start_id=START, end_id=END, beam_size=2, length_penalty=0.0)
    assert abs(float(to_numpy(beam_scores).reshape(-1)[0]) - want) < 1e-4


class MarkovParts(ScriptedParts):
    """A fake model whose logits depend on the step and the last token
    only, `table[step, last_token]` (`(target_sequence_length, vocab, vocab)`).
    Counts its decoding steps (on backends whose loops run the body once
    per step; jax traces it once)."""

    def __init__(self, table):
        self.table = np.asarray(table, "float32")
        self.target_sequence_length, self.vocab_size = self.table.shape[:2]
        self.steps = 0

    def decode_step(self, token_ids, index, caches, cross, mask, weights=None, beams_per_source=1):
        self.steps += 1
        rows = ops.take(ops.convert_to_tensor(self.table), index, axis=0)
        return ops.take(rows, token_ids, axis=0), caches


def random_table(seed, length=9, vocab=12):
    """Random logits with END likelier at later steps, so that hypotheses
    finish at different steps."""
    rng = np.random.default_rng(seed)
    table = rng.normal(0.0, 1.5, (length, vocab, vocab))
    table[:, :, END] += np.linspace(-1.0, 2.0, length)[:, None]
    table[:, :, PAD] = -50.0
    return table


def reference_beam_search(table, beam_size, alpha, n_best):
    """NumPy beam search on a `MarkovParts` table that runs every hypothesis
    to its end or the limit (no early stop). Returns `(tokens, scores,
    steps)`, best first; `steps` is when every hypothesis had finished."""
    length, vocab = table.shape[0], table.shape[1]
    log_probs = table - np.log(np.exp(table).sum(-1, keepdims=True))

    def normalised(hyp):
        return hyp[1] / ((5.0 + len(hyp[0])) / 6.0) ** alpha

    beams, steps = [((), 0.0, False)], None  # (tokens, log P, finished)
    for t in range(length):
        candidates = []
        for tokens, score, finished in beams:
            if finished:
                candidates.append((tokens, score, True))
                continue
            last = tokens[-1] if tokens else START
            allowed = [END] if t + 1 >= length else [v for v in range(vocab) if v not in (PAD, START)]
            for v in allowed:
                candidates.append((tokens + (v,), score + log_probs[t, last, v], v == END))
        candidates.sort(key=lambda hyp: -normalised(hyp))
        beams = candidates[:beam_size]
        if steps is None and all(hyp[2] for hyp in beams):
            steps = t + 1
    best = sorted(beams, key=lambda hyp: -normalised(hyp))[:n_best]
    tokens = np.full((n_best, length), PAD, "int32")
    for row, hyp in enumerate(best):
        tokens[row, : len(hyp[0])] = hyp[0]
    return tokens, np.array([normalised(hyp) for hyp in best], "float32"), steps


BACKEND_GRID = [(0.0, 1, 1), (0.6, 3, 1), (2.0, 4, 2), (0.6, 4, 4)]


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("beam_size, n_best", [(1, 1), (3, 1), (4, 2), (4, 4)])
def test_beam_search_equals_reference_without_early_stop(alpha, beam_size, n_best):
    """Stopping once the n-best are beyond reach returns exactly what
    decoding every hypothesis to its end returns (NumPy reference), in no
    more steps than it takes every hypothesis to finish."""
    if keras.backend.backend() != "tensorflow" and (alpha, beam_size, n_best) not in BACKEND_GRID:
        pytest.skip("the whole grid runs on tensorflow; jax and torch run BACKEND_GRID, "
                    "which has each length penalty and each beam once (eager searches are slow there)")
    counting = keras.backend.backend() != "jax"
    fewer_steps = 0
    for seed in range(6):
        parts = MarkovParts(random_table(seed))
        tokens, scores = beam_search(
            parts, np.ones((1, 1), "int32"), start_id=START, end_id=END,
            beam_size=beam_size, n_best=n_best, length_penalty=alpha,
        )
        want_tokens, want_scores, all_finished = reference_beam_search(
            parts.table, beam_size, alpha, n_best
        )
        np.testing.assert_array_equal(to_numpy(tokens)[0], want_tokens)
        np.testing.assert_allclose(to_numpy(scores)[0], want_scores, atol=1e-4)
        if counting:
            assert parts.steps <= all_finished
            fewer_steps += parts.steps < all_finished
    if counting and n_best < beam_size and alpha <= 0.6:
        # The early stop was exercised (with alpha = 2 the bound
        # log P / lp(limit) is too loose for it to come before the end).
        assert fewer_steps > 0


def test_beam_search_stops_once_the_best_is_beyond_reach():
    """The best hypothesis (4, END) ends at step 2 with log P = -0.02;
    the runner-up (7, 7, ...) never ends and is already below it, so a
    1-best search stops after 2 steps, with or without length penalty.
    The 4-best must wait for the runners-up, forced to end at the limit."""
    if keras.backend.backend() == "jax":
        pytest.skip("jax's while_loop traces the body once: steps are not countable")
    length, vocab = 8, 10
    table = np.full((length, vocab, vocab), -6.0)
    table[0, START, 4], table[0, START, 7] = 0.0, -1.0
    table[:, 4, END] = 0.0
    table[:, 7, 7] = 0.0
    table[:, :, PAD] = -50.0
    for alpha in (0.0, 0.6):
        steps = {}
        for n_best in (1, 4):
            parts = MarkovParts(table)
            tokens, _ = beam_search(
                parts, np.ones((1, 1), "int32"), start_id=START, end_id=END, beam_size=4,
                n_best=n_best, length_penalty=alpha,
            )
            np.testing.assert_array_equal(to_numpy(tokens)[0, 0, :2], [4, END])
            steps[n_best] = parts.steps
        assert steps == {1: 2, 4: length}, (alpha, steps)


def test_length_penalty_is_gnmt_formula():
    value = to_numpy(length_penalty_factor(np.array([1, 7]), 0.6))
    np.testing.assert_allclose(value, [((5 + 1) / 6) ** 0.6, ((5 + 7) / 6) ** 0.6], rtol=1e-6)


def test_bad_beam_arguments(parts):
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(parts, SOURCES, start_id=START, end_id=END, beam_size=0)
    with pytest.raises(ValueError, match="n_best"):
        beam_search(parts, SOURCES, start_id=START, end_id=END, beam_size=2, n_best=3)
    for search in (greedy_search, beam_search):
        # Checked once per search (the per-step embedding no longer checks).
        with pytest.raises(ValueError, match=r"`start_id` must be a token id in \[0, 25\) \(the target vocabulary\); got 25"):
            search(parts, SOURCES, start_id=25, end_id=END)
        # An end id outside the vocabulary failed in a gather (tensorflow),
        # gave NaN scores (jax) or ran on (torch); a pad id of -1 blocked
        # the last id on torch; float sources were cut to integers; a
        # source without its batch axis failed deep in jax's encoder
        # (a new-user trial).
        for name, value in (("end_id", 25), ("end_id", -1), ("pad_id", 99), ("pad_id", -1)):
            with pytest.raises(ValueError, match=f"`{name}` must be (a token id in \\[0, 25\\).*|a whole number >= 0); got {value}"):
                search(parts, SOURCES, **{"start_id": START, "end_id": END, name: value})
        with pytest.raises(ValueError, match=r"`suppressed_ids` must be a token id in \[0, 25\).*; got 30"):
            search(parts, SOURCES, start_id=START, end_id=END, suppressed_ids=(4, 30))
        with pytest.raises(ValueError, match="`end_id` must be a whole number >= 0; got 3.5"):
            search(parts, SOURCES, start_id=START, end_id=3.5)
        with pytest.raises(TypeError, match="`source_ids` must be integer token ids; got float32"):
            search(parts, SOURCES.astype("float32") + 0.5, start_id=START, end_id=END)
        with pytest.raises(ValueError, match=r"shape \(batch, source_length\); got shape \(6,\).*`ids\[None\]`"):
            search(parts, SOURCES[0], start_id=START, end_id=END)
    for alpha in (-1.0, float("nan"), float("inf")):
        # NaN passed `alpha < 0` and ranked every hypothesis as NaN.
        with pytest.raises(ValueError, match="finite number >= 0"):
            beam_search(parts, SOURCES, start_id=START, end_id=END, length_penalty=alpha)


def test_greedy_cross_attention_weights(parts):
    """Attention weights per output token: rows sum to 1 over real source
    tokens, 0 on source padding, 0 after the end token; same tokens as without."""
    tokens, _, attention = greedy_search(parts, SOURCES, start_id=START, end_id=END, return_attention_scores=True)
    plain, _ = greedy_search(parts, SOURCES, start_id=START, end_id=END)
    np.testing.assert_array_equal(to_numpy(tokens), to_numpy(plain))
    tokens, attention = to_numpy(tokens), to_numpy(attention)
    assert attention.shape == (2, parts.target_sequence_length, parts.num_heads, SOURCES.shape[1])
    for row in range(2):
        n = int(np.flatnonzero(tokens[row] == END)[0]) + 1 if END in tokens[row] else parts.target_sequence_length
        real = SOURCES[row] != PAD
        np.testing.assert_allclose(attention[row, :n].sum(-1), 1.0, atol=1e-5)
        np.testing.assert_array_equal(attention[row, :, :, ~real], 0.0)
        np.testing.assert_array_equal(attention[row, n:], 0.0)


def test_jax_searches_compile_once_per_setting_and_padded_shape(parts):
    """On jax, a search called outside `jax.jit` runs in one compiled
    function per model, search setting and source shape, the source length
    padded to a multiple of 16 (at most the encoder's 10 here): sources of 6
    and 8 columns share one trace, another batch size or search traces
    again. Its outputs (tokens, scores, attention weights cut back to the
    source's own columns) equal the search traced in the caller's own
    `jax.jit`, which neither pads nor caches. Before, every call traced and
    compiled its loop again (beam 4 on an H200: 3.7 sentences a second
    against torch's 54.5)."""
    if keras.backend.backend() != "jax":
        pytest.skip("the compiled search is jax's")
    import jax

    from keras_transformer.decoding import compiled

    class Counting(TransformerParts):
        traces = 0

        def encode(self, source_ids):
            Counting.traces += 1
            return super().encode(source_ids)

    model = build_transformer(30, 25, num_layers=2, d_model=16, num_heads=2, dff=32, dropout_rate=0.0,
                              sequence_length=10)
    counting = Counting(model)
    wider = np.pad(SOURCES, ((0, 0), (0, 2)), constant_values=PAD)
    assert compiled.bucketed_length(6, 10) == 10 and compiled.bucketed_length(12, 10) == 12
    assert compiled.bucketed_length(17, 64) == 32

    tokens, scores, attention = greedy_search(counting, SOURCES, start_id=START, end_id=END,
                                              return_attention_scores=True)
    assert Counting.traces == 1
    again = greedy_search(counting, wider, start_id=START, end_id=END, return_attention_scores=True)
    assert Counting.traces == 1
    want = jax.jit(lambda ids: greedy_search(counting, ids, start_id=START, end_id=END,
                                             return_attention_scores=True))(SOURCES)
    assert Counting.traces == 2
    assert to_numpy(attention).shape == to_numpy(want[2]).shape == (2, 10, 2, 6)
    assert to_numpy(again[2]).shape == (2, 10, 2, 8)
    for got in ((tokens, scores, attention), again):
        np.testing.assert_array_equal(to_numpy(got[0]), to_numpy(want[0]))
        np.testing.assert_allclose(to_numpy(got[1]), to_numpy(want[1]), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(to_numpy(got[2])[..., :6], to_numpy(want[2]), atol=1e-6)

    beams = beam_search(counting, SOURCES, start_id=START, end_id=END, beam_size=3, n_best=2)
    assert Counting.traces == 3
    beam_search(counting, SOURCES, start_id=START, end_id=END, beam_size=3, n_best=2)
    beam_search(counting, wider, start_id=START, end_id=END, beam_size=3, n_best=2)
    assert Counting.traces == 3
    beam_search(counting, SOURCES[:1], start_id=START, end_id=END, beam_size=3, n_best=2)
    assert Counting.traces == 4
    want = jax.jit(lambda ids: beam_search(counting, ids, start_id=START, end_id=END, beam_size=3,
                                           n_best=2))(SOURCES)
    np.testing.assert_array_equal(to_numpy(beams[0]), to_numpy(want[0]))
    np.testing.assert_allclose(to_numpy(beams[1]), to_numpy(want[1]), rtol=1e-6, atol=1e-6)


def test_jax_compiled_search_pads_with_the_models_id_and_keeps_each_parts_object():
    """The compiled jax search (a review found these wrong): it pads sources
    with the model's `pad_id` (1 here), not the search's; a search inside
    the caller's own `jax.jit` with NumPy ids is traced there (the host-side
    id check failed on the traced weights); a `TransformerParts` subclass
    keeps its own compiled search per object (a second object with another
    bias got the first one's); `suppressed_ids` may hold None."""
    if keras.backend.backend() != "jax":
        pytest.skip("the compiled search is jax's")
    import jax

    keras.utils.set_random_seed(1)
    model = build_transformer(30, 25, num_layers=1, d_model=16, num_heads=2, dff=32, dropout_rate=0.0,
                              sequence_length=40, pad_id=1)
    parts = TransformerParts(model, pad_id=1)
    sources = np.array([[5, 6, 7, END, 1], [8, 9, 10, 11, END]], "int32")
    search = dict(start_id=START, end_id=END, pad_id=1, suppressed_ids=(None,))
    want = jax.jit(lambda ids: greedy_search(parts, ids, **search))(sources)  # traced: no padding
    got = greedy_search(parts, sources, **search)  # compiled: padded to 16 columns with 1
    np.testing.assert_array_equal(to_numpy(got[0]), to_numpy(want[0]))
    np.testing.assert_allclose(to_numpy(got[1]), to_numpy(want[1]), rtol=1e-6, atol=1e-6)

    variables = list(model.variables)

    def doubled(values):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return greedy_search(parts, sources, **search)

    inside = jax.jit(doubled)([v.value for v in variables])
    np.testing.assert_array_equal(to_numpy(inside[0]), to_numpy(want[0]))

    class Biased(TransformerParts):
        def __init__(self, model, token):
            super().__init__(model, pad_id=1)
            self.token = token

        def decode_step(self, *args, **kwargs):
            logits, *rest = super().decode_step(*args, **kwargs)
            return (logits + 100.0 * ops.one_hot(self.token, self.vocab_size), *rest)

    for token in (7, 9):
        tokens = to_numpy(greedy_search(Biased(model, token), sources, **search)[0])
        assert (tokens[:, :-1] == token).all(), (token, tokens)


def _teacher_forced_log_prob(model, source, output):
    """log P(output | source) under the full model, the output ending with
    END (and padded after it)."""
    end = int(np.flatnonzero(output == END)[0]) + 1
    decoder_inputs = np.array([[START, *output[: end - 1]]], "int32")
    logits = to_numpy(model({"encoder_inputs": source[None], "decoder_inputs": decoder_inputs}))[0]
    log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    return float(sum(log_probs[t, output[t]] for t in range(end)))


@pytest.mark.parametrize("raised", [(), (PAD,), (START,), (PAD, START, 1)])
def test_searches_never_output_pad_or_start_and_score_the_model_probability(raised):
    """Tiny random models (vocabularies 60 / 50), with the logits of `raised`
    ids pushed up by 4: no output holds pad (0) or start (2) before its end
    id (before the fix, 17 of 48 rows did, and greedy gave
    `[2, 2, ..., 3]` or `[0, ..., 0, 3]`); the unknown id (1) only when not
    suppressed. Greedy scores equal the teacher-forced log-probability of
    the output, and beam scores times the length penalty do too (1e-4)."""
    keras.utils.set_random_seed(1)
    model = build_transformer(60, 50, num_layers=1, d_model=16, num_heads=2, dff=32,
                              dropout_rate=0.0, sequence_length=10)
    kernel, bias = model.get_layer("logits").get_weights()
    bias[list(raised)] += 4.0
    model.get_layer("logits").set_weights([kernel, bias])
    parts = TransformerParts(model)
    rng = np.random.default_rng(0)
    sources = rng.integers(4, 60, (48, 6)).astype("int32")
    sources[:, -1] = END
    greedy, greedy_scores = (to_numpy(x) for x in greedy_search(parts, sources, start_id=START, end_id=END))
    beams, beam_scores = (to_numpy(x) for x in beam_search(
        parts, sources, start_id=START, end_id=END, beam_size=3, n_best=1, length_penalty=0.6,
        suppressed_ids=(1,)))
    for row in range(48):
        for tokens in (greedy[row], beams[row, 0]):
            end = int(np.flatnonzero(tokens == END)[0])
            assert not np.isin(tokens[:end], (PAD, START)).any(), tokens
            assert (tokens[end + 1:] == PAD).all()
        assert 1 not in beams[row, 0]
    for row in range(0, 48, 8):
        want = _teacher_forced_log_prob(model, sources[row], greedy[row])
        assert abs(greedy_scores[row] - want) < 1e-4, (row, greedy_scores[row], want)
        length = int(np.flatnonzero(beams[row, 0] == END)[0]) + 1
        want = _teacher_forced_log_prob(model, sources[row], beams[row, 0])
        got = beam_scores[row, 0] * float(to_numpy(length_penalty_factor(length, 0.6)))
        assert abs(got - want) < 1e-4, (row, got, want)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="a tensorflow graph fast path")
def test_growing_caches_give_the_fixed_caches_results(parts):
    """Issue 18: on tensorflow the Translator's caches grow by one position a
    step (`decoding.growing_cache`); steps, greedy and beam search in a
    graph traced for any batch and length give the fixed caches' values."""
    import tensorflow as tf

    growing = TransformerParts(parts.model, growing_cache=True)
    target = np.array([[START, 4, 5, 6, 7], [START, 9, 9, 8, 4]], "int32")
    encoder_outputs, mask = parts.encode(SOURCES)
    cross = parts.cross_caches(encoder_outputs)
    fixed_caches = parts.empty_self_caches(2, parts.target_sequence_length, "float32")
    grown = growing.empty_self_caches(2, parts.target_sequence_length, "float32")
    for t in range(target.shape[1]):
        want, fixed_caches = parts.decode_step(target[:, t], t, fixed_caches, cross, mask)
        got, grown = growing.decode_step(target[:, t], t, grown, cross, mask)
        np.testing.assert_allclose(to_numpy(got), to_numpy(want), atol=1e-5)
        assert tuple(grown[0][0].shape) == (2, parts.num_heads, t + 1, parts.key_dim)
        assert tuple(grown[0][1].shape) == (2, parts.num_heads, t + 1, parts.key_dim)

    # Beam search also drops the sentences that are done from the batch:
    # sources of several lengths with a length ratio end at different steps.
    varied = np.array([[5, END, 0, 0, 0, 0], [5, 6, 7, 8, 9, END], [8, 9, END, 0, 0, 0],
                       [4, 5, 6, END, 0, 0], [7, END, 0, 0, 0, 0]], "int32")
    spec = [tf.TensorSpec([None, None], tf.int32)]
    cases = (
        (greedy_search, SOURCES, {}),
        (beam_search, SOURCES, {"beam_size": 3, "n_best": 2}),
        (beam_search, varied, {"beam_size": 3, "n_best": 2, "length_ratio": 0.5, "length_offset": 1}),
        (beam_search, varied, {"beam_size": 4, "length_penalty": 1.0}),
    )
    for search, sources, kwargs in cases:
        results = [
            tf.function(lambda s, p=p: search(p, s, start_id=START, end_id=END, **kwargs), input_signature=spec)(sources)
            for p in (parts, growing)
        ]
        np.testing.assert_array_equal(to_numpy(results[1][0]), to_numpy(results[0][0]))
        np.testing.assert_allclose(to_numpy(results[1][1]), to_numpy(results[0][1]), atol=1e-5)
        eager = search(growing, sources, start_id=START, end_id=END, **kwargs)  # and in eager mode
        np.testing.assert_array_equal(to_numpy(eager[0]), to_numpy(results[0][0]))


def test_fixed_caches_grow_in_phases_with_one_phases_results(parts, monkeypatch):
    """Issue 18: fixed-size caches start at `FIRST_PHASE` slots and are
    padded (doubling) when a step reaches their end; greedy and beam search,
    with sentences that end in different phases, give the results of caches
    of every slot from the start, and the caches grow as planned."""
    from keras_transformer.decoding import model_parts

    class Recording(TransformerParts):
        def grow_self_caches(self, self_caches, length):
            grown = super().grow_self_caches(self_caches, length)
            self.grown.append((length, tuple(grown[0][0].shape), tuple(grown[0][1].shape)))
            return grown

    phased = Recording(parts.model)
    varied = np.array([[5, END, 0, 0, 0, 0], [5, 6, 7, 8, 9, END], [8, 9, END, 0, 0, 0],
                       [4, 5, 6, END, 0, 0], [7, END, 0, 0, 0, 0]], "int32")
    cases = (
        (greedy_search, SOURCES, {}),
        (beam_search, SOURCES, {"beam_size": 3, "n_best": 2}),
        (beam_search, varied, {"beam_size": 3, "n_best": 2, "length_ratio": 0.5, "length_offset": 1}),
        (beam_search, varied, {"beam_size": 4, "length_penalty": 1.0}),
    )
    heads, key_dim = parts.num_heads, parts.key_dim
    for search, sources, kwargs in cases:
        monkeypatch.setattr(model_parts, "FIRST_PHASE", parts.target_sequence_length)
        assert parts.cache_phases(10) == [10]
        want = search(parts, sources, start_id=START, end_id=END, **kwargs)
        monkeypatch.setattr(model_parts, "FIRST_PHASE", 2)
        assert phased.cache_phases(10) == [2, 4, 8, 10]
        phased.grown = []
        got = search(phased, sources, start_id=START, end_id=END, **kwargs)
        rows = len(sources) * kwargs.get("beam_size", 1)
        assert phased.grown == [(n, (rows, heads, key_dim, n), (rows, heads, n, key_dim)) for n in (4, 8, 10)]
        np.testing.assert_array_equal(to_numpy(got[0]), to_numpy(want[0]))
        # Scores near -12.7 are sums of float32 log-probabilities whose
        # attention reductions run over 4, 8 or 10 slots instead of 10: they
        # may differ by a few float32 spacings (9.5e-7 at 12.7; jax on an
        # AMX Xeon: 2.9e-6), which `rtol` allows.
        np.testing.assert_allclose(to_numpy(got[1]), to_numpy(want[1]), rtol=1e-6, atol=1e-6)
        if keras.backend.backend() == "tensorflow" and sources is SOURCES:
            # Compiled by XLA, as `Translator(jit_compile=True)` runs it
            # (greedy and one beam case: each XLA compile takes seconds): a
            # constant that greedy search carried unchanged through three
            # or more phase loops failed XLA's compilation ("Cannot find
            # body function while_2_body_..._const_0"; a new-user trial,
            # from sequence_length 33 on), and beam search gave none.
            import tensorflow as tf

            xla = tf.function(lambda s, f=search, kw=kwargs: f(phased, s, start_id=START, end_id=END, **kw),
                              jit_compile=True)(tf.constant(sources))
            np.testing.assert_array_equal(to_numpy(xla[0]), to_numpy(want[0]))
            np.testing.assert_allclose(to_numpy(xla[1]), to_numpy(want[1]), rtol=1e-6, atol=1e-6)
    # The outputs reach past the first phases.
    assert (to_numpy(want[0]) != PAD).sum(-1).max() > 4


def test_parts_fold_the_tied_transpose_with_fixed_caches_only():
    """Issue 18: fixed-size caches (XLA, JAX, torch) multiply by the tied
    table's transpose in each step; the tensorflow graph of growing caches
    takes one transposed copy (its plain product is the faster one)."""
    keras.utils.set_random_seed(0)
    model = build_transformer(30, 30, num_layers=1, d_model=8, num_heads=2, dff=16, dropout_rate=0.0,
                              sequence_length=10, tie_embeddings="all")
    assert TransformerParts(model).decoding_weights()["logits"][2] is True
    assert TransformerParts(model, growing_cache=True).decoding_weights()["logits"][2] is False


def _numpy_top_k(x, k):
    """Reference: the k largest of each row, ties to the lower index."""
    order = np.argsort(-x, axis=-1, kind="stable")[..., :k]
    return np.take_along_axis(x, order, axis=-1), order


@pytest.mark.parametrize("length", [12, 300, 1000, 8000])
def test_top_k_is_exact_ties_included(length):
    """`decoding.top_k.top_k` (on tensorflow, a two-stage block search for
    long rows) returns NumPy's stable ranking: values and indices, ties to
    the lower index, rows whose length is not a multiple of the block. (On
    jax and torch it is the backend's `top_k`, whose ties may come in any
    order: there the values and that the indices point at them.)"""
    from keras_transformer.decoding.top_k import top_k

    stable = keras.backend.backend() == "tensorflow"

    rng = np.random.default_rng(length)
    rows = [
        rng.normal(size=(5, length)),
        np.round(rng.normal(size=(5, length))),  # many ties
        np.zeros((2, length)),  # all tied: the lowest indices
        np.where(rng.random((3, length)) < 0.9, -np.inf, rng.normal(size=(3, length))),
    ]
    x = np.concatenate(rows).astype("float32")
    x[-1, -5:] = 7.0  # the best entries in the last, padded block
    for k in sorted({1, 4, 7, 12, min(length, 40)}):
        values, indices = top_k(x, k)
        want_values, want_indices = _numpy_top_k(x, k)
        np.testing.assert_array_equal(to_numpy(values), want_values)
        np.testing.assert_array_equal(np.take_along_axis(x, to_numpy(indices), axis=-1), want_values)
        if stable:
            np.testing.assert_array_equal(to_numpy(indices), want_indices)
    grouped = x[:12].reshape(3, 4, length)  # leading axes kept
    np.testing.assert_array_equal(to_numpy(top_k(grouped, 4)[0]), _numpy_top_k(grouped, 4)[0])


def _numpy_beam_step(t, log_probs, state, at_limit, end_id, pad_id, blocked, k, alpha):
    """One beam-search step as the paper's ranking states it, over all `k *
    vocab` continuations of each sentence (NumPy)."""
    from keras_transformer.decoding.limits import NEG_LOG_PROB

    sequences, scores, finished, lengths = (np.array(s) for s in state)
    n, _, vocab = log_probs.shape
    lp = log_probs.astype("float32").copy()
    lp[..., list(blocked)] = NEG_LOG_PROB
    ids = np.arange(vocab)
    lp = np.where(at_limit[:, None, None] & (ids != end_id), np.float32(NEG_LOG_PROB), lp)
    only_pad = np.where(ids == pad_id, np.float32(0.0), np.float32(NEG_LOG_PROB))
    lp = np.where(finished[..., None], only_pad, lp).astype("float32")
    total = (scores[..., None] + lp).astype("float32")
    new_length = np.where(finished, lengths, t + 1)
    penalty = np.power((5.0 + new_length.astype("float32")) / 6.0, np.float32(alpha)).astype("float32")
    normalised = (total / penalty[..., None]).astype("float32").reshape(n, k * vocab)
    index = np.argsort(-normalised, axis=1, kind="stable")[:, :k]
    parent, token = index // vocab, index % vocab
    new_scores = np.take_along_axis(total.reshape(n, -1), index, axis=1)
    new_finished = np.take_along_axis(finished, parent, axis=1) | (token == end_id)
    new_lengths = np.take_along_axis(new_length, parent, axis=1)
    sequences = np.take_along_axis(sequences, parent[..., None], axis=1)
    sequences[:, :, t] = token
    return token, parent, (sequences, new_scores, new_finished, new_lengths)


@pytest.mark.parametrize("vocab, beam_size, blocked", [(12, 4, (0, 2)), (6, 4, (0, 2, 5)), (700, 4, (0, 1, 2)),
                                                       (8000, 5, (0, 1, 3, 7))])
def test_beam_step_ranks_as_the_whole_vocabulary(vocab, beam_size, blocked):
    """`BeamSearch.step` ranks a few candidates per hypothesis; it picks
    what ranking all `beam_size * vocab` continuations picks (a NumPy
    reference), scores and ties included, on the states a search reaches:
    the first step (only beam 0 alive), finished hypotheses, sentences at
    their limit, hypotheses left with `NEG_LOG_PROB` by a limit, rounded
    log-probabilities full of ties, and vocabularies with fewer than
    `beam_size` allowed ids. (Ties rank lower ids first on tensorflow; on
    jax and torch, whose `top_k` orders ties as it likes, the chosen scores
    are compared.)"""
    from keras_transformer.decoding.limits import NEG_LOG_PROB
    from keras_transformer.decoding.strategies import BeamSearch

    if vocab > 1000 and keras.backend.backend() != "tensorflow":
        pytest.skip("the block top-k of long rows is tensorflow's; 700 covers the candidates here (CI time)")
    rng = np.random.default_rng(vocab)
    k, n, length, end_id, pad_id = beam_size, 6, 9, 3, 0
    for trial in range(12):
        strategy = BeamSearch(k, length_penalty=[0.0, 0.6, 1.0][trial % 3])
        logits = rng.normal(0.0, 3.0, (n, k, vocab))
        if trial % 2:
            logits = np.round(logits)
        log_probs = (logits - np.log(np.exp(logits).sum(-1, keepdims=True))).astype("float32")
        at_limit = rng.random(n) < 0.4
        if trial % 4 == 0:  # the first step
            t = 0
            scores = np.tile(np.array([0.0] + [NEG_LOG_PROB] * (k - 1), "float32"), (n, 1))
            finished = np.zeros((n, k), bool)
            lengths = np.zeros((n, k), "int32")
        else:
            t = int(rng.integers(1, length - 1))
            scores = -rng.random((n, k)).astype("float32") * 20
            finished = rng.random((n, k)) < 0.4
            lengths = np.where(finished, rng.integers(1, t + 1, (n, k)), t).astype("int32")
            # Hypotheses a limit left at NEG_LOG_PROB: the sentence is past its limit.
            scores = np.where((rng.random((n, k)) < 0.3) & at_limit[:, None] & ~finished,
                              np.float32(NEG_LOG_PROB), scores).astype("float32")
        sequences = rng.integers(0, vocab, (n, k, length)).astype("int32")
        state = (sequences, scores, finished, lengths)
        got = strategy.step(t, ops.convert_to_tensor(log_probs), tuple(ops.convert_to_tensor(s) for s in state),
                            ops.convert_to_tensor(at_limit), end_id, pad_id, blocked, None)
        want = _numpy_beam_step(t, log_probs, state, at_limit, end_id, pad_id, blocked, k, strategy.length_penalty)
        np.testing.assert_array_equal(np.sort(to_numpy(got[2][1]), axis=1), np.sort(want[2][1], axis=1))
        if keras.backend.backend() != "tensorflow":
            continue
        np.testing.assert_array_equal(to_numpy(got[0]), want[0], err_msg=f"tokens, trial {trial}")
        np.testing.assert_array_equal(to_numpy(got[1]), want[1], err_msg=f"parents, trial {trial}")
        for name, a, b in zip(("sequences", "scores", "finished", "lengths"), got[2], want[2]):
            np.testing.assert_array_equal(to_numpy(a), b, err_msg=f"{name}, trial {trial}")


def test_search_gathers_equal_keras_take_along_axis_and_take():
    """`take_along_last_axis` and `take_rows` (one gather each on
    TensorFlow) give Keras's `take_along_axis` and `take` on in-range
    indices of the shapes the searches use, for floats, ints and bools."""
    from keras_transformer.decoding.gather import take_along_last_axis
    from keras_transformer.decoding.gather import take_rows

    rng = np.random.default_rng(3)
    for shape, picks in (((4, 7), 3), ((2, 3, 9), 5)):
        for x in (rng.normal(size=shape).astype("float32"), rng.integers(0, 50, size=shape).astype("int32"),
                  rng.random(shape) > 0.5):
            indices = rng.integers(0, shape[-1], size=shape[:-1] + (picks,)).astype("int32")
            want = np.take_along_axis(x, indices, axis=-1)
            np.testing.assert_array_equal(to_numpy(take_along_last_axis(x, indices)), want)
            np.testing.assert_array_equal(to_numpy(ops.take_along_axis(x, indices, axis=-1)), want)
            rows = rng.integers(0, shape[0], size=6).astype("int32")
            np.testing.assert_array_equal(to_numpy(take_rows(x, rows)), x[rows])


@pytest.mark.parametrize("growing", [True, False])
def test_beam_search_step_reads_no_weight_and_packs_no_batch_shape(parts, growing):
    """On TensorFlow each op of the search's loop body runs every step, so
    the weights are read once before the loop (only the embedding lookup
    reads its table in it) and no reshape is built from the dynamic batch
    size (a `Pack` of a `Shape` slice, per reshape, per step): the body of
    this 2-layer model holds at most one `ReadVariableOp` and three `Pack`s
    (the beam step's candidate and zero shapes, the embedding's slice)."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("graph ops are TensorFlow's")
    import collections

    import tensorflow as tf

    search_parts = TransformerParts(parts.model, growing_cache=growing)
    search = tf.function(lambda source: beam_search(search_parts, source, start_id=START, end_id=END, beam_size=3))
    graph = search.get_concrete_function(tf.TensorSpec([None, None], tf.int32)).graph.as_graph_def()
    functions = {f.signature.name: f for f in graph.library.function}
    loops = [node for node in graph.node if node.op in ("While", "StatelessWhile")]
    assert len(loops) == 1
    body = collections.Counter(node.op for node in functions[loops[0].attr["body"].func.name].node_def)
    assert body["ReadVariableOp"] <= 1, body
    assert body["Pack"] <= 3, body
    assert body["MatMul"] + body["BatchMatMulV2"] >= 2 * 10  # the layers are in this body


@pytest.mark.filterwarnings("ignore:Layer .* does not have a `quantize` method")
def test_keras_quantized_model_decodes_through_its_quantized_layers():
    """After `model.quantize("int8")` the projections hold integer codes and a
    scale: the fused decoding matmuls must not read those codes as weights.
    The cached steps equal the quantized model's full pass, whose logits stay
    near the float model's (int8 rounding, not codes read as floats)."""
    keras.utils.set_random_seed(3)
    model = build_transformer(
        30, 25, num_layers=1, d_model=16, num_heads=2, dff=32, dropout_rate=0.0, sequence_length=10
    )
    target = np.array([[START, 4, 5, 6, 7], [START, 9, 9, 8, 4]], "int32")
    inputs = {"encoder_inputs": SOURCES, "decoder_inputs": target}
    float_logits = to_numpy(model(inputs))
    model.quantize("int8")
    assert model.decoder_layers[0].self_attention.quantized
    if keras.backend.backend() == "tensorflow":  # training reads float kernels
        from keras_transformer import fast_path

        assert "quantized" in fast_path.applies(model)
    quantized = TransformerParts(model)
    full = to_numpy(quantized.decode_uncached(SOURCES, target))
    spread = np.abs(float_logits).max()
    np.testing.assert_allclose(full, float_logits, atol=0.05 * spread)
    encoder_outputs, mask = quantized.encode(SOURCES)
    cross = quantized.cross_caches(encoder_outputs)
    caches = quantized.empty_self_caches(2, quantized.target_sequence_length, "float32")
    for t in range(target.shape[1]):
        logits, caches = quantized.decode_step(target[:, t], t, caches, cross, mask)
        np.testing.assert_allclose(to_numpy(logits), full[:, t], atol=1e-4 * spread)


def test_a_huge_length_ratio_caps_at_max_length(parts):
    """`ceil(ratio * source_length) + offset` overflowed int32 for a ratio of
    1e9: every limit became negative and every output empty (a new-user
    trial). Now it is capped at the positional limit, as no ratio is."""
    from keras_transformer.decoding.limits import decode_limits

    mask = SOURCES != PAD
    np.testing.assert_array_equal(to_numpy(decode_limits(mask, 9, length_ratio=1e9)), [9, 9])
    np.testing.assert_array_equal(to_numpy(decode_limits(mask, 9, length_ratio=0.5, length_offset=1)), [3, 4])
    for search in (greedy_search, beam_search):
        plain, plain_scores = search(parts, SOURCES, start_id=START, end_id=END)
        huge, huge_scores = search(parts, SOURCES, start_id=START, end_id=END, length_ratio=1e9)
        np.testing.assert_array_equal(to_numpy(huge), to_numpy(plain))
        np.testing.assert_allclose(to_numpy(huge_scores), to_numpy(plain_scores), atol=1e-6)
