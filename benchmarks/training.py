"""Training speed: this library against KerasHub blocks and the TF tutorial's way.

    python benchmarks/training.py            # both workloads (about 10 minutes on 2 cores)
    python benchmarks/training.py --quick    # smoke run: few steps

Config "bench-small": vocabularies 8,000, d_model 256, 4 heads, dff 1,024,
3 + 3 layers, dropout 0.1, maximum length 40, batch 64, Adam. Contenders,
built at that config in one process and trained step by step in turn on the
same batches (round robin, so machine noise hits all alike):

1. `ours`: `build_transformer` with `MaskedSparseCategoricalCrossentropy`
   and `MaskedAccuracy`;
2. `keras_hub`: `TokenAndPositionEmbedding` + `TransformerEncoder` /
   `TransformerDecoder` from KerasHub, as the keras-io KerasHub translation
   example builds it (loss with `ignore_class=0`);
3. `tutorial`: the TF tutorial's design: `keras.layers.MultiHeadAttention`
   with `use_causal_mask=True`, post-LN blocks, sinusoidal positions.

Workloads: `random` (identical batches, lengths 8-40, padded to 40) and
`multi30k` (real En->De batches from `$MULTI30K_DIR`; `ours` uses its
length-bucketed pipeline with 1,536 tokens per side (64 x 24; about 1,350
real target tokens a step, against about 1,070 in the peers' plain padded
batches of 64, of which 59% is padding); the same model is
also timed, in the same round robin, on the batches `keras-transformer
train` makes by default, 4,096 tokens per side, in `train`'s default
precision on this machine (`--precision auto`: `mixed_bfloat16` on a CPU
with bfloat16 instructions, else float32): the row `ours @ train default`,
not compared with the peers).

Reported per contender: non-padding target tokens/s (median of the timed
steps after warm-up), step time, useful FLOP/s as a share of the float32
matmul peak measured in the same run (the best of three timings of a 2048^3
product; the rate of one of the model's own matmul shapes and the bfloat16
rate of the 2048^3 product are printed beside it), and the ratio of
`ours` to each peer. On tensorflow without XLA, `ours` trains with the
fast path as `train` does (`keras_transformer.fast_path`: position-wise
layers and logits on the real tokens only, fused CPU kernels where they
build; `KERAS_TRANSFORMER_FAST_PATH=0` times the plain Keras layers
instead, `KERAS_TRANSFORMER_FUSED_KERNELS=0` the fast path without its
kernels); the peers compute every padded position.
FLOPs are counted as 3x the forward matmul FLOPs of the non-padding tokens
(2 per multiply-add; projections, feed-forward, logits, and the attention
score and value products over the real lengths), each on the tokens it runs
on: the encoder and the decoder's cross-attention keys and values per source
token, the rest of the decoder and the logits per target token; softmax,
LayerNorm and embedding lookups are not counted.
"""

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_transformer import MaskedAccuracy, MaskedSparseCategoricalCrossentropy  # noqa: E402
from keras_transformer.precision import cpu_has_bfloat16, resolve_precision  # noqa: E402
from keras_transformer import Adam  # noqa: E402
from keras_transformer import build_transformer  # noqa: E402
from keras_transformer import fast_path  # noqa: E402
from keras_transformer.layers import sinusoidal_encoding  # noqa: E402
from keras_transformer.training import TrainingConfig  # noqa: E402

VOCAB, D_MODEL, HEADS, DFF, LAYERS, MAX_LEN, BATCH = 8000, 256, 4, 1024, 3, 40, 64
# `keras-transformer train`'s default batch: tokens per side.
TRAIN_TOKENS = TrainingConfig.tokens_per_batch
TRAIN_DEFAULT = f"ours @ train default ({TRAIN_TOKENS} tokens/side)"


def build_ours(jit_compile="auto", dtype=None):
    model = build_transformer(VOCAB, VOCAB, LAYERS, D_MODEL, HEADS, DFF, 0.1, MAX_LEN, dtype=dtype)
    model.compile(Adam(1e-4), MaskedSparseCategoricalCrossentropy(label_smoothing=0.0),
                  metrics=[MaskedAccuracy()], jit_compile=jit_compile)
    # As `train` does: the TensorFlow fast path (its fused CPU kernels built
    # where they build), unless KERAS_TRANSFORMER_FAST_PATH=0.
    wanted = os.environ.get("KERAS_TRANSFORMER_FAST_PATH", "1") != "0"
    if wanted and fast_path.applies(model, jit_compile=model.jit_compile) is None:
        fast_path.describe()
        fast_path.attach(model)
    return model


def build_keras_hub():
    import keras_hub

    enc_in = keras.Input((None,), dtype="int32", name="encoder_inputs")
    dec_in = keras.Input((None,), dtype="int32", name="decoder_inputs")
    x = keras_hub.layers.TokenAndPositionEmbedding(VOCAB, MAX_LEN, D_MODEL, mask_zero=True)(enc_in)
    for _ in range(LAYERS):
        x = keras_hub.layers.TransformerEncoder(DFF, HEADS, dropout=0.1)(x)
    y = keras_hub.layers.TokenAndPositionEmbedding(VOCAB, MAX_LEN, D_MODEL, mask_zero=True)(dec_in)
    for _ in range(LAYERS):
        y = keras_hub.layers.TransformerDecoder(DFF, HEADS, dropout=0.1)(y, encoder_sequence=x)
    logits = keras.layers.Dense(VOCAB)(y)
    model = keras.Model({"encoder_inputs": enc_in, "decoder_inputs": dec_in}, logits)
    model.compile(keras.optimizers.Adam(1e-4),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0),
                  metrics=["accuracy"])
    return model


class TutorialPositionalEmbedding(keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.embedding = keras.layers.Embedding(VOCAB, D_MODEL, mask_zero=True)
        self.table = sinusoidal_encoding(MAX_LEN, D_MODEL)

    def compute_mask(self, inputs, mask=None):
        return self.embedding.compute_mask(inputs)

    def call(self, x):
        length = keras.ops.shape(x)[1]
        return self.embedding(x) * D_MODEL**0.5 + keras.ops.convert_to_tensor(self.table)[None, :length]


def build_tutorial():
    def ffn(x):
        y = keras.layers.Dense(DFF, activation="relu")(x)
        y = keras.layers.Dropout(0.1)(keras.layers.Dense(D_MODEL)(y))
        return keras.layers.LayerNormalization()(keras.layers.Add()([x, y]))

    enc_in = keras.Input((None,), dtype="int32", name="encoder_inputs")
    dec_in = keras.Input((None,), dtype="int32", name="decoder_inputs")
    x = keras.layers.Dropout(0.1)(TutorialPositionalEmbedding()(enc_in))
    for _ in range(LAYERS):
        a = keras.layers.MultiHeadAttention(HEADS, D_MODEL // HEADS, dropout=0.1)(x, x)
        x = ffn(keras.layers.LayerNormalization()(keras.layers.Add()([x, a])))
    y = keras.layers.Dropout(0.1)(TutorialPositionalEmbedding()(dec_in))
    for _ in range(LAYERS):
        a = keras.layers.MultiHeadAttention(HEADS, D_MODEL // HEADS, dropout=0.1)(y, y, use_causal_mask=True)
        y = keras.layers.LayerNormalization()(keras.layers.Add()([y, a]))
        c = keras.layers.MultiHeadAttention(HEADS, D_MODEL // HEADS, dropout=0.1)(y, x)
        y = ffn(keras.layers.LayerNormalization()(keras.layers.Add()([y, c])))
    logits = keras.layers.Dense(VOCAB)(y)
    model = keras.Model({"encoder_inputs": enc_in, "decoder_inputs": dec_in}, logits)
    model.compile(keras.optimizers.Adam(1e-4), MaskedSparseCategoricalCrossentropy(label_smoothing=0.0))
    return model


def useful_flops(src_lengths, tgt_lengths):
    """3 x forward matmul FLOPs of the real tokens of one batch (see module doc)."""
    d, f = D_MODEL, DFF
    # Per source token: the encoder's Q, K, V, O and feed-forward, and each
    # decoder layer's cross-attention K and V (projected from the encoder's
    # output). Per target token: the decoder's self-attention Q, K, V, O,
    # cross-attention Q and O, feed-forward, and the logits.
    src_token = LAYERS * (2 * 4 * d * d + 2 * 2 * d * f) + LAYERS * 2 * 2 * d * d
    tgt_token = LAYERS * (2 * 6 * d * d + 2 * 2 * d * f) + 2 * d * VOCAB
    total = 0
    for s, t in zip(src_lengths, tgt_lengths):
        attention = LAYERS * (2 * 2 * s * s * d + 2 * 2 * t * t * d / 2 + 2 * 2 * t * s * d)
        total += s * src_token + t * tgt_token + attention
    return 3 * total


def matmul_rate(m, k, n, seconds=3.0, windows=3, dtype="float32"):
    """FLOP/s of one `(m, k) @ (k, n)` matmul in `dtype`, repeated: the best
    of `windows` timings that share `seconds` (other work on the machine
    slows one window; a lone sample once read half the peak)."""
    import tensorflow as tf

    a = tf.cast(tf.random.normal((m, k)), dtype)
    b = tf.cast(tf.random.normal((k, n)), dtype)
    f = tf.function(lambda: tf.matmul(a, b))
    f().numpy()
    rates = []
    for _ in range(windows):
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / windows:
            f().numpy()
            count += 1
        rates.append(count * 2 * m * k * n / (time.perf_counter() - start))
    return max(rates)


def matmul_peak(seconds=3.0):
    """The machine's float32 matmul peak: a 2048 x 2048 x 2048 product."""
    return matmul_rate(2048, 2048, 2048, seconds)


def random_batches(n, rng):
    batches = []
    for _ in range(n):
        src_len = rng.integers(8, MAX_LEN + 1, BATCH)
        tgt_len = rng.integers(8, MAX_LEN + 1, BATCH)
        src = np.zeros((BATCH, MAX_LEN), "int32")
        dec = np.zeros((BATCH, MAX_LEN), "int32")
        lab = np.zeros((BATCH, MAX_LEN), "int32")
        for i in range(BATCH):
            src[i, : src_len[i]] = rng.integers(4, VOCAB, src_len[i])
            tokens = rng.integers(4, VOCAB, tgt_len[i])
            dec[i, 0] = 2
            dec[i, 1 : tgt_len[i]] = tokens[:-1]
            lab[i, : tgt_len[i]] = tokens
        batches.append(({"encoder_inputs": src, "decoder_inputs": dec}, lab))
    return batches


def multi30k_batches(n, directory):
    """Per contender: ours bucketed by length, the peers padded to MAX_LEN."""
    from keras_transformer.data import make_dataset
    from keras_transformer.tokenizers import train_subword_tokenizer

    en, de = f"{directory}/train.en.gz", f"{directory}/train.de.gz"
    src_tok = train_subword_tokenizer(en, VOCAB, max_sentences=10000)
    tgt_tok = train_subword_tokenizer(de, VOCAB, max_sentences=10000)
    ours = make_dataset(en, de, src_tok, tgt_tok, sequence_length=MAX_LEN, tokens_per_batch=BATCH * 24, seed=0)
    default = make_dataset(en, de, src_tok, tgt_tok, sequence_length=MAX_LEN, tokens_per_batch=TRAIN_TOKENS, seed=0)
    plain = make_dataset(en, de, src_tok, tgt_tok, sequence_length=MAX_LEN, batch_size=BATCH, seed=0)

    def take(ds, pad):
        out = []
        for x, y in ds.take(n):
            x = {k: v.numpy() for k, v in x.items()}
            y = y.numpy()
            if pad:
                x = {k: np.pad(v, [(0, 0), (0, MAX_LEN - v.shape[1])]) for k, v in x.items()}
                y = np.pad(y, [(0, 0), (0, MAX_LEN - y.shape[1])])
            out.append((x, y))
        return out

    return {"ours": take(ours, False), TRAIN_DEFAULT: take(default, False), "peers": take(plain, True)}


def run(models, batches_for, steps, warmup, peak):
    times = {name: [] for name in models}
    tokens = {name: [] for name in models}
    flops = {name: [] for name in models}
    padding = {name: [] for name in models}
    for step in range(warmup + steps):
        for name, model in models.items():
            x, y = batches_for(name)[step % len(batches_for(name))]
            start = time.perf_counter()
            model.train_on_batch(x, y)
            elapsed = time.perf_counter() - start
            if step >= warmup:
                real_t = (y != 0).sum(1)
                real_s = (x["encoder_inputs"] != 0).sum(1)
                times[name].append(elapsed)
                tokens[name].append(real_t.sum() / elapsed)
                flops[name].append(useful_flops(real_s, real_t) / elapsed)
                padding[name].append(1 - (real_t.sum() + real_s.sum()) / (y.size + x["encoder_inputs"].size))
    rows = {}
    for name in models:
        rows[name] = dict(
            tokens_per_s=statistics.median(tokens[name]),
            step_ms=statistics.median(times[name]) * 1000,
            peak_share=statistics.median(flops[name]) / peak,
            padding=statistics.mean(padding[name]),
        )
    return rows


def report(title, rows):
    print(f"\n== {title}")
    width = max(10, *(len(name) for name in rows))
    print(f"{'contender':{width}} {'tokens/s':>10} {'step ms':>9} {'% matmul peak':>14} {'padding':>8}")
    for name, r in rows.items():
        print(f"{name:{width}} {r['tokens_per_s']:10.0f} {r['step_ms']:9.0f} {100 * r['peak_share']:13.1f}% {100 * r['padding']:7.1f}%")
    if any(r["peak_share"] > 1 for r in rows.values()):
        print(PEAK_WARNING)
    for name in rows:
        if not name.startswith("ours"):
            print(f"ours / {name}: x{rows['ours']['tokens_per_s'] / rows[name]['tokens_per_s']:.2f} tokens/s")


PEAK_WARNING = "warning: a share above 100% means the peak was measured low (a busy machine?); run again"
BUILDERS = {"ours": build_ours, "keras_hub": build_keras_hub, "tutorial": build_tutorial}


def peak_rss_mb():
    """This process's peak resident memory (VmHWM), in MiB.

    Not `getrusage`'s `ru_maxrss`: that survives `exec`, so a worker started
    from a big parent would report the parent's peak.
    """
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(args):
    """One contender alone in this process: speed and peak memory (JSON line)."""
    keras.utils.set_random_seed(0)
    if args.name == "ours":
        jit = {"on": True, "off": False}.get(args.jit, "auto")
        model = build_ours(jit_compile=jit, dtype=args.dtype)
    else:
        model = BUILDERS[args.name]()
    before = peak_rss_mb()
    batches = random_batches(args.steps + args.warmup, np.random.default_rng(0))
    rows = run({args.name: model}, lambda name: batches, args.steps, args.warmup, 1.0)
    row = rows[args.name]
    row["flops_per_s"] = row.pop("peak_share")
    row["peak_rss_mb"] = peak_rss_mb()
    row["rss_before_training_mb"] = before
    print("RESULT " + json.dumps(row), flush=True)


# (label, backend, contender, jit, dtype[, environment]) run each in a process
# of its own.
ALONE = [
    ("ours tensorflow", "tensorflow", "ours", "off", None),
    ("ours tf, no kernels", "tensorflow", "ours", "off", None, {"KERAS_TRANSFORMER_FUSED_KERNELS": "0"}),
    ("ours tf, no fast path", "tensorflow", "ours", "off", None, {"KERAS_TRANSFORMER_FAST_PATH": "0"}),
    ("ours tensorflow+XLA", "tensorflow", "ours", "on", None),
    ("ours tensorflow bf16", "tensorflow", "ours", "off", "mixed_bfloat16"),
    ("ours jax (XLA)", "jax", "ours", "auto", None),
    ("ours torch", "torch", "ours", "off", None),
    ("keras_hub tensorflow", "tensorflow", "keras_hub", "auto", None),
    ("tutorial tensorflow", "tensorflow", "tutorial", "auto", None),
]


def alone(steps, warmup, peak):
    print(f"\n== each alone in its own process (identical random batches; {steps} timed steps)")
    print(f"{'run':24} {'tokens/s':>9} {'step ms':>8} {'% peak':>7} {'peak RSS MB':>12}")
    above_peak = False
    for label, backend, name, jit, dtype, *environment in ALONE:
        if name not in BUILDERS:  # keras_hub, when it is not installed
            continue
        command = [sys.executable, __file__, "--worker", name, "--jit", jit,
                   "--steps", str(steps), "--warmup", str(warmup)]
        if dtype:
            command += ["--dtype", dtype]
        env = dict(os.environ, KERAS_BACKEND=backend, **(environment[0] if environment else {}))
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode or not lines:
            print(f"{label:24} failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(lines[-1][len("RESULT "):])
        print(f"{label:24} {r['tokens_per_s']:9.0f} {r['step_ms']:8.0f} "
              f"{100 * r['flops_per_s'] / peak:6.1f}% {r['peak_rss_mb']:12.0f}", flush=True)
        above_peak = above_peak or r["flops_per_s"] > peak
    if above_peak:
        print(PEAK_WARNING)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--jit", default="auto", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    steps, warmup = (3, 1) if args.quick else (15, 3)
    if args.worker:
        args.name = args.worker
        args.steps, args.warmup = args.steps or steps, args.warmup or warmup
        return worker(args)
    keras.utils.set_random_seed(0)
    peak = matmul_peak(1.0 if args.quick else 3.0)
    # The model's own matmuls are smaller: the feed-forward input projection
    # of a batch's ~1,536 real tokens is what "% of peak" is up against.
    shaped = matmul_rate(1536, D_MODEL, DFF, 1.0 if args.quick else 3.0)
    print(f"backend {keras.backend.backend()}; float32 matmul peak {peak / 1e9:.1f} GFLOP/s "
          f"(2048^3); {shaped / 1e9:.1f} GFLOP/s ({100 * shaped / peak:.0f}%) at the "
          f"feed-forward shape 1536x{D_MODEL} @ {D_MODEL}x{DFF}")
    bf16 = matmul_rate(2048, 2048, 2048, 1.0 if args.quick else 3.0, dtype="bfloat16")
    print(f"bfloat16 matmul 2048^3: {bf16 / 1e9:.1f} GFLOP/s (CPU bfloat16 instructions: "
          f"{'yes' if cpu_has_bfloat16() else 'no'}); every share below is of the float32 peak")
    if keras.backend.backend() == "tensorflow":
        on = os.environ.get("KERAS_TRANSFORMER_FAST_PATH", "1") != "0"
        print(f"training path of ours: {fast_path.describe() if on else 'plain Keras layers (KERAS_TRANSFORMER_FAST_PATH=0)'}")
    if importlib.util.find_spec("keras_hub") is None:
        print("keras_hub is not installed: its blocks are left out of the race (pip install keras-hub)")
        del BUILDERS["keras_hub"]
    models = {name: build() for name, build in BUILDERS.items()}
    batches = random_batches(steps + warmup, np.random.default_rng(0))
    report("identical random batches", run(models, lambda name: batches, steps, warmup, peak))
    directory = os.environ.get("MULTI30K_DIR", "../shared/data/multi30k")
    if os.path.exists(f"{directory}/train.en.gz"):
        real = multi30k_batches(steps + warmup, directory)
        # The same `ours` model, also stepped on the `train` default batches.
        # `train`'s default precision on this machine ("auto"): a model of
        # its own when that is mixed precision.
        precision = resolve_precision("auto", D_MODEL)
        default_model = models["ours"] if precision == "float32" else build_ours(dtype=precision)
        contenders = dict(models, **{f"{TRAIN_DEFAULT}, {precision}": default_model})
        def batches_for(name):
            if name.startswith(TRAIN_DEFAULT):
                return real[TRAIN_DEFAULT]
            return real["ours" if name == "ours" else "peers"]

        rows = run(contenders, batches_for, steps, warmup, peak)
        report("Multi30k batches, each contender's own pipeline", rows)
    else:
        print(f"\n(no Multi30k at {directory}: real-batch workload skipped)")
    alone(steps, warmup, peak)


if __name__ == "__main__":
    main()
