"""Decoding speed: cached beam/greedy search against re-running decoders.

    python benchmarks/decoding.py            # full run (several minutes on 2 cores)
    python benchmarks/decoding.py --quick    # smoke run

Contenders, all on one model (d_model 256, 4 heads, dff 1024, 3 + 3
layers; the end token's logit is pushed down so every output is exactly 40
tokens) and on the same random sources of 20 tokens, in one process:

- `cached`: this library's beam / greedy search with the key/value cache,
  in process, through the very function that is exported
  (`Translator.serve_ids`);
  `cached_xla`: the same compiled with XLA (`Translator(jit_compile=True)`);
- `saved_model` / `saved_model_xla`: the same searches through exported
  SavedModels (`translate_ids` signature), loaded with `tf.saved_model.load`;
- `uncached`: the same search, but the decoder re-runs on the whole prefix
  at every step (encoder once);
- `keras_hub`: KerasHub's `BeamSampler` / `GreedySampler` with the
  `next(prompt, cache, index)` function of the keras-io translation example
  (the whole model on the whole padded prompt at every step, no cache).

Reported: latency in ms per sentence at batch 1, throughput in sentences/s at
batch 32, and the ratios between contenders (each SavedModel against the
in-process search it was exported from). Timing is the median of
repeated calls after a warm-up call (tracing and compilation excluded).
Every function is traced for inputs of any batch and length
(`[None, None]`), as a server runs it.
"""

import argparse
import importlib.util
import os
import statistics
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras import ops  # noqa: E402

from keras_transformer import Translator, build_transformer  # noqa: E402
from keras_transformer.data.synthetic import make_synthetic_corpus  # noqa: E402
from keras_transformer.decoding import TransformerParts, beam_search, greedy_search  # noqa: E402
from keras_transformer.export import export_translator  # noqa: E402
from keras_transformer.tokenizers import END_ID, START_ID, train_subword_tokenizer  # noqa: E402

OUTPUT_TOKENS = 40
SOURCE_TOKENS = 20
# Every contender is traced for any batch and length, as a server sees them.
IDS = [tf.TensorSpec([None, None], tf.int32)]


class UncachedParts(TransformerParts):
    """Decoding parts that re-run the decoder stack on the whole prefix.

    The "cache" is only the token history; every step embeds and decodes all
    tokens so far (the encoder still runs once), as implementations without
    a key/value cache do.
    """

    def cross_caches(self, encoder_outputs):
        return [(encoder_outputs, encoder_outputs)]

    def cache_phases(self, length):
        return [length]  # one history of every position: nothing to grow

    def empty_self_caches(self, batch_size, length, dtype):
        history = ops.zeros((batch_size, length), "int32")
        return [(history, history)]

    def decoding_weights(self):
        return None

    def decode_step(self, token_ids, index, self_caches, cross_caches, encoder_outputs_mask,
                    beams_per_source=1, **kwargs):
        history = ops.slice_update(self_caches[0][0], [0, index], ops.expand_dims(token_ids, 1))
        encoder_outputs = cross_caches[0][0]
        if beams_per_source > 1:  # a beam search's rows share their source's row: repeat it
            encoder_outputs = ops.repeat(encoder_outputs, beams_per_source, axis=0)
            encoder_outputs_mask = ops.repeat(encoder_outputs_mask, beams_per_source, axis=0)
        x = self.decoder_embedding(history[:, : index + 1])
        for layer in self.decoder_layers:
            x = layer(x, encoder_outputs, encoder_outputs_mask=encoder_outputs_mask)
        kernel, bias = self.model.logits_layer.output_weights()
        logits = ops.matmul(x[:, -1, :], kernel)
        logits = logits if bias is None else logits + bias
        return logits, [(history, history)]


def keras_hub_decoder(model, beam_size):
    """The keras-io example's decoding: the whole model on the whole prompt."""
    import keras_hub

    sampler = keras_hub.samplers.BeamSampler(num_beams=beam_size) if beam_size > 1 else keras_hub.samplers.GreedySampler()

    @tf.function(input_signature=IDS)
    def decode(source_ids):
        batch = tf.shape(source_ids)[0]

        def next(prompt, cache, index):
            # BeamSampler flattens (batch, beams); repeat the source to match.
            repeat = tf.shape(prompt)[0] // batch
            source = tf.repeat(source_ids, repeat, axis=0)
            logits = model({"encoder_inputs": source, "decoder_inputs": prompt}, training=False)
            return logits[:, index - 1, :], None, cache

        prompt = tf.concat(
            [tf.fill((batch, 1), START_ID), tf.zeros((batch, OUTPUT_TOKENS), tf.int32)], axis=1
        )
        return sampler(next, prompt, index=1, stop_token_ids=[END_ID])

    return decode


def timed(fn, arg, repeats):
    fn(arg)  # warm-up: tracing and compilation
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(arg)
        if isinstance(out, dict):
            out = list(out.values())[0]
        np.asarray(out)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small batch and one repeat")
    args = parser.parse_args()
    repeats, big_batch = (1, 4) if args.quick else (3, 32)
    has_keras_hub = importlib.util.find_spec("keras_hub") is not None
    if not has_keras_hub:
        print("keras_hub is not installed: its sampler is left out of the race (pip install keras-hub)")

    en, de = make_synthetic_corpus(3000, seed=0)
    src_tok, tgt_tok = train_subword_tokenizer(en, 600), train_subword_tokenizer(de, 700)
    keras.utils.set_random_seed(0)
    model = build_transformer(
        src_tok.vocab_size, tgt_tok.vocab_size, num_layers=3, d_model=256, num_heads=4,
        dff=1024, dropout_rate=0.1, sequence_length=OUTPUT_TOKENS + 1,
    )
    kernel, bias = model.get_layer("logits").get_weights()
    bias[END_ID] = -1e4  # never end early: every output has OUTPUT_TOKENS tokens
    model.get_layer("logits").set_weights([kernel, bias])
    uncached = UncachedParts(model)
    rng = np.random.default_rng(0)

    def sources(batch):
        ids = rng.integers(4, src_tok.vocab_size, (batch, SOURCE_TOKENS)).astype("int32")
        ids[:, -1] = END_ID
        return tf.constant(ids)

    export_dir = tempfile.mkdtemp()
    contenders = {}
    for beam in (4, 1):
        def search(p, beam=beam):
            if beam == 1:
                return tf.function(lambda s: greedy_search(p, s, start_id=START_ID, end_id=END_ID, max_length=OUTPUT_TOKENS)[0], input_signature=IDS)
            return tf.function(lambda s: beam_search(p, s, start_id=START_ID, end_id=END_ID, beam_size=beam, max_length=OUTPUT_TOKENS)[0], input_signature=IDS)

        group = {}
        for suffix, jit in (("", False), ("_xla", True)):
            translator = Translator(model, src_tok, tgt_tok, beam_size=beam, max_length=OUTPUT_TOKENS, jit_compile=jit)
            path = export_translator(translator, os.path.join(export_dir, f"beam{beam}{suffix}"))
            saved = tf.saved_model.load(path).signatures["translate_ids"]
            # In process: the very function that is exported (same signature).
            group["cached" + suffix] = lambda s, t=translator: t.serve_ids(s)["target_ids"]
            group["saved_model" + suffix] = lambda s, saved=saved: saved(source_ids=s)["target_ids"]
        group["uncached"] = search(uncached)
        if has_keras_hub:
            group["keras_hub"] = keras_hub_decoder(model, beam)
        contenders[beam] = group

    print(f"{'search':8} {'contender':12} {'ms/sentence @1':>15} {'sentences/s @' + str(big_batch):>18}")
    results = {}
    for beam, group in contenders.items():
        name = f"beam{beam}" if beam > 1 else "greedy"
        for label, fn in group.items():
            latency = timed(fn, sources(1), repeats) * 1000
            throughput = big_batch / timed(fn, sources(big_batch), repeats)
            results[(name, label)] = (latency, throughput)
            print(f"{name:8} {label:12} {latency:15.1f} {throughput:18.2f}", flush=True)
    print("\nRatios (> 1 means the first is faster):")
    pairs = (
        ("cached", "uncached"), ("cached_xla", "uncached"), ("cached", "keras_hub"),
        ("cached_xla", "keras_hub"), ("cached", "saved_model"), ("cached_xla", "saved_model_xla"),
        ("cached", "cached_xla"),
    )
    for name in ("beam4", "greedy"):
        for first, second in pairs:
            if (name, second) not in results:  # keras_hub, when it is not installed
                continue
            a, b = results[(name, first)], results[(name, second)]
            print(f"{name:8} {first:11} / {second:16} latency x{b[0] / a[0]:5.2f}  throughput x{a[1] / b[1]:5.2f}")

if __name__ == "__main__":
    main()
