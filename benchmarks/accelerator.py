"""Accelerator check: mixed-precision `fit`, training throughput and cached decoding on a GPU.

    # here, with TensorFlow: token ids, weights and CPU reference outputs of a trained run
    python benchmarks/accelerator.py prepare --run runs/multi30k-en-de --out gpu_inputs
    # on the GPU machine (jax and torch, each in its own process; TensorFlow not needed)
    python benchmarks/accelerator.py check --inputs gpu_inputs --out results

`prepare` tokenizes Multi30k train and val with the run's SentencePiece
models (fixed segmentation), writes the run's model as a config and a
weights file, and decodes the first val sentences on this CPU with the jax
backend (greedy, and beam 4 at length penalty 0.6): the reference ids the
accelerator's decoding is compared with.

`check` runs, per backend (`--backends`, default jax then torch), in its
own process:

1. **Same weights, same answers**: float32 logits of 8 val pairs against
   the CPU's (largest absolute difference), and the share of greedy and
   beam-4 outputs whose ids equal the CPU's.
2. **Decoding speed and quality**: val translated greedily (batch 128) and
   with beam 4 (batch 32, length penalty 0.6), sentences a second (a
   second pass: the first, which compiles, is timed apart), and BLEU (sacreBLEU 13a,
   SentencePiece's own detokenization) against the references.
3. **`model.fit` in each precision** (`float32`, `mixed_float16`,
   `mixed_bfloat16`): the run's architecture from fresh weights, the
   paper's schedule and masked, label-smoothed loss, on the train ids in
   batches of `--batch-size` pairs: real target tokens a second over the
   epochs after the first (which compiles), and val loss after each epoch,
   so the precisions' curves can be compared (a NaN or a curve far above
   float32's is a fault).

Each stage is skipped once `--budget` seconds have passed, and the results
are written to `<out>/<backend>.json` after each stage, so a stopped run
still reports. Timings are the accelerator's, not this machine's; see
docs/benchmarks.md for the figures measured.
"""

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LENGTH = 64  # sequence_length of the Multi30k runs
REFERENCE_SENTENCES = 64  # val sentences decoded on the CPU as the reference
LOGIT_PAIRS = 8
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")


def _read(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def _pad(rows, length):
    out = np.zeros((len(rows), length), "int32")
    for i, row in enumerate(rows):
        row = row[:length]
        out[i, : len(row)] = row
    return out


def token_arrays(src_tok, tgt_tok, src_lines, tgt_lines, length=LENGTH):
    """The rows `make_dataset` trains on, with the fixed segmentation.

    As `make_dataset` packs them: source ids cut to `length - 1` plus the
    end id; the start id plus target ids cut to `length - 1`, and those ids
    plus the end id; pairs with an empty side dropped.

    Returns:
        `(source, decoder_inputs, labels, kept)`: int32 `(n, length)` arrays
        padded with 0, and the indices of the `n` pairs kept.
    """
    src_ids = src_tok.tokenize(src_lines).to_list()
    tgt_ids = tgt_tok.tokenize(tgt_lines).to_list()
    kept = [i for i, (s, t) in enumerate(zip(src_ids, tgt_ids)) if s and t]
    room = length - 1
    return (_pad([src_ids[i][:room] + [src_tok.end_id] for i in kept], length),
            _pad([[tgt_tok.start_id] + tgt_ids[i][:room] for i in kept], length),
            _pad([tgt_ids[i][:room] + [tgt_tok.end_id] for i in kept], length), kept)


def prepare(args):
    """Token ids, weights and the CPU's reference outputs, into `args.out`."""
    os.environ["KERAS_BACKEND"] = "tensorflow"
    from keras_transformer.training import load_run

    os.makedirs(args.out, exist_ok=True)
    model, src_tok, tgt_tok, config = load_run(args.run, args.which)
    src, tgt = args.pair.split("-")
    arrays = {}
    for split in ("train", "val"):
        src_lines = _read(os.path.join(args.data, f"{split}.{src}.gz"))
        tgt_lines = _read(os.path.join(args.data, f"{split}.{tgt}.gz"))
        source, decoder_inputs, labels, keep = token_arrays(src_tok, tgt_tok, src_lines, tgt_lines)
        arrays[f"{split}_source"] = source
        arrays[f"{split}_decoder_inputs"] = decoder_inputs
        arrays[f"{split}_labels"] = labels
        if split == "val":
            with open(os.path.join(args.out, "val_references.txt"), "w", encoding="utf-8") as f:
                f.write("\n".join(tgt_lines[i] for i in keep) + "\n")
    np.savez_compressed(os.path.join(args.out, "ids.npz"), **arrays)
    model.save_weights(os.path.join(args.out, "model.weights.h5"))
    with open(os.path.join(args.out, "model.json"), "w") as f:
        json.dump({"config": model.get_config(), "start_id": int(tgt_tok.start_id),
                   "end_id": int(tgt_tok.end_id), "pad_id": 0,
                   "d_model": int(config["model"]["d_model"]),
                   "label_smoothing": float(config["training"].get("label_smoothing", 0.1)),
                   "dropout_rate": float(config["model"]["dropout_rate"])}, f)
    shutil.copy(os.path.join(args.run, "target.model"), os.path.join(args.out, "target.model"))
    # The reference: the jax backend on this CPU (its own process).
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    subprocess.run([sys.executable, __file__, "reference", "--inputs", args.out], env=env, check=True)


def _load_model(inputs, dtype=None, fresh=False):
    import keras

    from keras_transformer.models import Transformer

    with open(os.path.join(inputs, "model.json")) as f:
        meta = json.load(f)
    config = dict(meta["config"])
    if dtype is not None:
        config["dtype"] = dtype
    model = Transformer.from_config(config)
    x = {"encoder_inputs": np.ones((1, 4), "int32"), "decoder_inputs": np.ones((1, 4), "int32")}
    model(x)
    if not fresh:
        model.load_weights(os.path.join(inputs, "model.weights.h5"))
    return model, meta, keras


def _decode(model, meta, source, beam_size=None, length_penalty=0.6, batch=32):
    from keras_transformer.decoding import TransformerParts, beam_search, greedy_search

    parts = TransformerParts(model)
    outputs = []
    for i in range(0, len(source), batch):
        chunk = source[i: i + batch]
        width = max(1, int((chunk != 0).sum(axis=1).max()))
        chunk = chunk[:, :width]
        if beam_size is None:
            ids, _ = greedy_search(parts, chunk, start_id=meta["start_id"], end_id=meta["end_id"])
        else:
            ids, _ = beam_search(parts, chunk, start_id=meta["start_id"], end_id=meta["end_id"],
                                 beam_size=beam_size, length_penalty=length_penalty)
        import keras

        ids = keras.ops.convert_to_numpy(ids)
        if ids.ndim == 3:  # beam search: (batch, n_best, length)
            ids = ids[:, 0]
        for row in ids:
            row = [int(t) for t in row]
            outputs.append(row[: row.index(meta["end_id"])] if meta["end_id"] in row else
                           [t for t in row if t != 0])
    return outputs


def reference(args):
    """CPU outputs of the prepared weights (run by `prepare` in a jax process)."""
    ids = np.load(os.path.join(args.inputs, "ids.npz"))
    model, meta, keras = _load_model(args.inputs)
    n = REFERENCE_SENTENCES
    x = {"encoder_inputs": ids["val_source"][:LOGIT_PAIRS],
         "decoder_inputs": ids["val_decoder_inputs"][:LOGIT_PAIRS]}
    logits = keras.ops.convert_to_numpy(model(x, training=False))
    greedy = _decode(model, meta, ids["val_source"][:n])
    beam = _decode(model, meta, ids["val_source"][:n], beam_size=4)
    np.save(os.path.join(args.inputs, "reference_logits.npy"), logits.astype("float32"))
    with open(os.path.join(args.inputs, "reference.json"), "w") as f:
        json.dump({"greedy": greedy, "beam4": beam}, f)
    print(f"reference: logits {logits.shape}, {n} greedy and beam-4 outputs")


def _device_name(backend):
    if backend == "jax":
        import jax

        return [str(d) for d in jax.devices()]
    if backend == "torch":
        import torch

        return [torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"]
    return []


def _bleu(hypothesis_ids, references, sp_model):
    import sacrebleu
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=sp_model)
    hypotheses = [sp.decode(row) for row in hypothesis_ids]
    return round(sacrebleu.corpus_bleu(hypotheses, [references]).score, 2), hypotheses[:3]


def check_worker(args):
    backend = os.environ["KERAS_BACKEND"]
    started = time.perf_counter()
    out_path = os.path.join(args.out, f"{backend}.json")
    results = {"backend": backend, "devices": _device_name(backend), "stages": {}}

    def save():
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)

    def time_left():
        return args.budget - (time.perf_counter() - started)

    save()
    ids = np.load(os.path.join(args.inputs, "ids.npz"))
    with open(os.path.join(args.inputs, "val_references.txt"), encoding="utf-8") as f:
        references = f.read().splitlines()
    sp_model = os.path.join(args.inputs, "target.model")
    import keras

    keras.utils.set_random_seed(0)

    def same():
        model, meta, _ = _load_model(args.inputs)
        with open(os.path.join(args.inputs, "reference.json")) as f:
            ref = json.load(f)
        x = {"encoder_inputs": ids["val_source"][:LOGIT_PAIRS],
             "decoder_inputs": ids["val_decoder_inputs"][:LOGIT_PAIRS]}
        logits = keras.ops.convert_to_numpy(model(x, training=False))
        want = np.load(os.path.join(args.inputs, "reference_logits.npy"))
        n = REFERENCE_SENTENCES
        greedy = _decode(model, meta, ids["val_source"][:n])
        beam = _decode(model, meta, ids["val_source"][:n], beam_size=4)
        results["stages"]["same_answers"] = {
            "logits_max_abs_difference": float(np.max(np.abs(logits - want))),
            "logits_max_abs": float(np.max(np.abs(want))),
            "greedy_equal": f"{sum(a == b for a, b in zip(greedy, ref['greedy']))}/{n}",
            "beam4_equal": f"{sum(a == b for a, b in zip(beam, ref['beam4']))}/{n}",
        }
        print(backend, "same_answers", results["stages"]["same_answers"], flush=True)
        save()

    def decode():
        if time_left() < 60:
            return
        model, meta, _ = _load_model(args.inputs)
        source = ids["val_source"][:args.decode_sentences or None]
        wanted = references[:len(source)]
        stage = {}
        for name, beam_size, batch in (("greedy", None, 128), ("beam4", 4, 32)):
            # The first pass compiles (jax: once per padded shape); the second is timed.
            t0 = time.perf_counter()
            _decode(model, meta, source, beam_size=beam_size, batch=batch)
            first = time.perf_counter() - t0
            t0 = time.perf_counter()
            outputs = _decode(model, meta, source, beam_size=beam_size, batch=batch)
            seconds = time.perf_counter() - t0
            bleu, sample = _bleu(outputs, wanted, sp_model)
            stage[name] = {"batch": batch, "first_pass_s": round(first, 2), "sentences": len(source),
                           "seconds": round(seconds, 2),
                           "sentences_per_s": round(len(source) / seconds, 1), "val_bleu": bleu,
                           "sample": sample}
            print(backend, "decode", name, {k: v for k, v in stage[name].items() if k != "sample"}, flush=True)
            results["stages"]["decode"] = stage
            save()
            if time_left() < 60:
                break
        if time_left() > 60:
            one = source[:8]
            _decode(model, meta, one, beam_size=4, batch=1)
            t0 = time.perf_counter()
            _decode(model, meta, one, beam_size=4, batch=1)
            stage["beam4_batch1_ms_per_sentence"] = round(1000 * (time.perf_counter() - t0) / len(one), 1)
            results["stages"]["decode"] = stage
            print(backend, "decode batch 1 beam 4 ms/sentence", stage["beam4_batch1_ms_per_sentence"], flush=True)
            save()

    def fit_stage():
        import keras_transformer as kt

        fit = {}
        n, m = args.max_train_pairs, args.max_train_pairs and args.max_train_pairs // 4
        x = {"encoder_inputs": ids["train_source"][:n], "decoder_inputs": ids["train_decoder_inputs"][:n]}
        y = ids["train_labels"][:n]
        val = ({"encoder_inputs": ids["val_source"][:m], "decoder_inputs": ids["val_decoder_inputs"][:m]},
               ids["val_labels"][:m])
        steps = len(y) // args.batch_size
        real_tokens = int((y[: steps * args.batch_size] != 0).sum())
        for precision in args.precisions:
            if time_left() < 90:
                fit[precision] = "skipped: out of time"
                break
            keras.config.set_dtype_policy(precision)
            keras.utils.set_random_seed(0)
            model, meta, _ = _load_model(args.inputs, dtype=precision, fresh=True)
            model.compile(
                optimizer=kt.Adam(kt.WarmupSchedule(d_model=meta["d_model"], warmup_steps=args.warmup_steps,
                                                    scale=2.0),
                                  beta_1=0.9, beta_2=0.98, epsilon=1e-9),
                loss=kt.MaskedSparseCategoricalCrossentropy(label_smoothing=meta["label_smoothing"]),
                metrics=[kt.MaskedAccuracy()],
            )
            epoch_seconds, val_losses = [], []

            class Clock(keras.callbacks.Callback):
                def on_epoch_begin(self, epoch, logs=None):
                    self.t0 = time.perf_counter()

                def on_epoch_end(self, epoch, logs=None):
                    epoch_seconds.append(time.perf_counter() - self.t0)
                    val_losses.append(round(float(logs["val_loss"]), 4))
                    if time_left() < 60:
                        self.model.stop_training = True

            t0 = time.perf_counter()
            history = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, shuffle=True,
                                validation_data=val, validation_batch_size=256, verbose=0,
                                callbacks=[Clock()])
            timed = epoch_seconds[1:]
            fit[precision] = {
                "policy": model.dtype_policy.name,
                "compute_dtype": model.compute_dtype,
                "batch_size": args.batch_size, "steps_per_epoch": steps,
                "epochs": len(epoch_seconds),
                "epoch_seconds": [round(s, 2) for s in epoch_seconds],
                "train_loss": [round(float(v), 4) for v in history.history["loss"]],
                "val_loss": val_losses,
                "target_tokens_per_s": round(real_tokens / (sum(timed) / len(timed))) if timed else None,
                "total_s": round(time.perf_counter() - t0, 1),
            }
            print(backend, "fit", precision, fit[precision], flush=True)
            results["stages"]["fit"] = fit
            save()
        keras.config.set_dtype_policy("float32")

    stages = {"same": same, "fit": fit_stage, "decode": decode}
    for name in args.stages:
        try:
            stages[name]()
        except Exception as error:  # report and go on to the next stage
            import traceback

            traceback.print_exc()
            results["stages"][name + "_error"] = f"{type(error).__name__}: {error}"[:2000]
            save()
    results["seconds"] = round(time.perf_counter() - started, 1)
    save()


def check(args):
    os.makedirs(args.out, exist_ok=True)
    for backend in args.backends:
        env = dict(os.environ, KERAS_BACKEND=backend)
        env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
        command = [sys.executable, __file__, "worker", "--inputs", args.inputs, "--out", args.out,
                   "--budget", str(args.budget), "--batch-size", str(args.batch_size),
                   "--epochs", str(args.epochs), "--warmup-steps", str(args.warmup_steps),
                   "--max-train-pairs", str(args.max_train_pairs or 0), "--decode-sentences",
                   str(args.decode_sentences or 0),
                   "--stages", *args.stages, "--precisions", *args.precisions]
        try:
            subprocess.run(command, env=env, timeout=args.budget + 60)
        except subprocess.TimeoutExpired:
            print(f"{backend}: stopped after {args.budget + 60} s", flush=True)
    for backend in args.backends:
        path = os.path.join(args.out, f"{backend}.json")
        if os.path.exists(path):
            with open(path) as f:
                print(json.dumps(json.load(f), indent=1))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["prepare", "check", "reference", "worker"])
    parser.add_argument("--run", help="prepare: a run folder written by `train`")
    parser.add_argument("--which", default="averaged", choices=["best", "last", "averaged"])
    parser.add_argument("--data", default=os.environ.get("MULTI30K_DIR", "../shared/data/multi30k"))
    parser.add_argument("--pair", help="prepare: the run's language pair, such as en-de (default: the one "
                                       "its training files name)")
    parser.add_argument("--inputs", default="gpu_inputs")
    parser.add_argument("--out", default="results")
    parser.add_argument("--backends", nargs="+", default=["jax", "torch"])
    parser.add_argument("--stages", nargs="+", default=["same", "fit", "decode"])
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS))
    parser.add_argument("--budget", type=float, default=200, help="seconds per backend")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--warmup-steps", type=int, default=400)
    parser.add_argument("--max-train-pairs", type=int, default=0, help="0: all (a CPU smoke run: a few hundred)")
    parser.add_argument("--decode-sentences", type=int, default=0, help="0: all of val")
    args = parser.parse_args(argv)
    args.max_train_pairs = args.max_train_pairs or None
    if args.command == "prepare":
        args.out = args.out if args.out != "results" else "gpu_inputs"
        if not args.run:
            parser.error("prepare needs --run, a run folder written by `keras-transformer train`")
        from keras_transformer.languages import model_languages

        trained = model_languages(args.run)
        # A pair other than the run's made references and sources of the
        # wrong languages without a word (a new-user trial).
        if trained is not None and args.pair not in (None, "-".join(trained)):
            parser.error(f"{args.run} was trained {'-'.join(trained)} and --pair is {args.pair}: "
                         f"pass --pair {'-'.join(trained)}, or leave it out")
        args.pair = args.pair or ("-".join(trained) if trained else None)
        if args.pair is None:
            parser.error(f"the training files of {args.run} name no language pair: pass --pair, such as en-de")
        prepare(args)
    elif args.command == "reference":
        reference(args)
    elif args.command == "worker":
        check_worker(args)
    else:
        check(args)


if __name__ == "__main__":
    main()
