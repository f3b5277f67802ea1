"""The training benchmark's FLOP count, checked against the model's own weights."""

import importlib.util
import pathlib

import numpy as np

from keras_transformer import build_transformer

_BENCHMARK = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "training.py"


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("_training_benchmark", _BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_useful_flops_counts_every_kernel_on_the_tokens_it_sees():
    bench = _load_benchmark()
    model = build_transformer(
        bench.VOCAB, bench.VOCAB, bench.LAYERS, bench.D_MODEL, bench.HEADS, bench.DFF,
        0.1, bench.MAX_LEN,
    )
    per_source = per_target = 0
    for weight in model.weights:
        if not weight.path.endswith("/kernel"):
            continue
        macs = int(np.prod(weight.shape))
        # The encoder runs on source tokens, and so do the decoder's
        # cross-attention keys and values (projections of the encoder output).
        on_source = weight.path.startswith("encoder_") or weight.path.split("/")[1:3] in (
            ["cross_attention", "key"],
            ["cross_attention", "value"],
        )
        if on_source:
            per_source += 2 * macs
        else:
            per_target += 2 * macs
    assert per_target > 2 * bench.D_MODEL * bench.VOCAB  # the logits are in it

    src, tgt = np.array([7, 40, 1]), np.array([12, 3, 20])
    d, layers = bench.D_MODEL, bench.LAYERS
    attention = sum(
        layers * (2 * 2 * s * s * d + 2 * 2 * t * t * d / 2 + 2 * 2 * t * s * d)
        for s, t in zip(src, tgt)
    )
    expected = 3 * (per_source * src.sum() + per_target * tgt.sum() + attention)
    np.testing.assert_allclose(bench.useful_flops(src, tgt), expected, rtol=1e-12)
