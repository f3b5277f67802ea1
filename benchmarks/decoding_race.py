"""Decoding race on Multi30k: our SavedModel and Translator against CTranslate2.

    python benchmarks/decoding_race.py                        # the shipped en-de model
    python benchmarks/decoding_race.py --saved-model DIR --saved-model DIR2
    python benchmarks/decoding_race.py --quick                # smoke run

The same weights decode the same test_2016_flickr sentences, strings in and
strings out (SentencePiece included), beam 4 with the GNMT length penalty
0.6, in these contenders:

- `saved_model`: each `--saved-model` through its `serving_default`
  signature (`tf.saved_model.load`), as TF Serving runs it, with the search
  it was exported with (its name then says which beam and penalty, when
  they are not beam 4 and 0.6: a shipped model's search is chosen on val);
- `saved_model_now`: the first SavedModel exported again by this version of
  the library (its weights and tokenizers; beam 4, 0.6), the same way;
  `saved_model_int8` the same with int8 weight storage;
  `saved_model_now_float32` (when the first is float16-stored) the same
  weight values stored as float32, which spares the per-call weight casts;
  `saved_model_now_xla` the same exported with `--jit-compile` (the search
  compiled by XLA, as TF Serving runs it with
  `--xla_cpu_compilation_enabled=true`; each new batch size and source
  length, padded to a multiple of 8, compiles once, in the first round);
  `saved_model_now_xla_1x1` that on one inter-op and one intra-op thread,
  and `..._xla_old_runtime` that with XLA's older CPU runtime (below);
  `saved_model_now_hybrid` the same with `--xla-max-batch-size` (XLA for
  batches up to that size, the plain graph above);
  `saved_model_now_1thread` the same with one TensorFlow thread for ops and
  one inside them (TF Serving's `--tensorflow_inter_op_parallelism=1
  --tensorflow_intra_op_parallelism=1`): less thread hand-off per small op;
  `saved_model_now_2searches_2x1` exported with `--parallel-searches 2`
  (two search loops of half a batch each), run with two inter-op threads
  and one intra-op thread; `saved_model_now_hybrid_2searches_2x1` the same
  with XLA up to `--xla-max-batch-size`, and `..._xla_old_runtime` that with
  `XLA_FLAGS=--xla_cpu_use_thunk_runtime=false` (XLA's older CPU runtime);
  `..._onednn_off`: the one-thread, two-search and hybrid two-search ones
  with `TF_ENABLE_ONEDNN_OPTS=0` (TensorFlow turns oneDNN on by default on
  CPUs with AVX-512; TF Serving reads the same variable);
- `translator`: the in-process `Translator` rebuilt on the first SavedModel's
  weights (`loading.translator_from_saved_model`), through `Translator.serve`;
- `ct2_float32`, `ct2_int8`: the first SavedModel converted with
  `export_ctranslate2` (float32, and int8 weights), through
  `CTranslate2Translator` with CTranslate2's length penalty 0.4 (its
  `length ** alpha` form ranks the shipped model's hypotheses as our GNMT
  penalty 0.6 does), on as many threads as the machine has CPUs;
  `ct2_float32_1thread` the float32 one on one thread.

`--only REGEX` races the contenders whose names match (CTranslate2 float32
on all CPUs and on one thread, the yardstick, always runs), and builds only
their models. The ratios are to CTranslate2 float32 on its faster thread
setting at each batch size.

Each contender runs in its own process (runtimes' thread pools compete when
they share one), started and warmed up before timing; timed passes are
interleaved: every round times each contender in turn at batch 32 (all
sentences) and at batch 1 (the first `--batch1-sentences`). Printed: the
median ms per sentence of each, the ratios to CTranslate2 float32, and the
cased BLEU / chrF of each contender's output on those sentences (the
batch-32 outputs), so that speed is never bought with quality unnoticed.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CT2_LENGTH_PENALTY = 0.4
BEAM_SIZE = 4
LENGTH_PENALTY = 0.6  # GNMT alpha of every contender exported or rebuilt here


# ---------------------------------------------------------------- worker side

def _load(kind, path):
    """`translate(list of str) -> list of str` for one contender."""
    if kind.startswith("saved_model"):
        import tensorflow as tf
        import tensorflow_text  # noqa: F401

        if "@" in kind:  # "@INTERxINTRA": TF Serving's --tensorflow_{inter,intra}_op_parallelism
            inter, intra = (int(n) for n in kind.split("@")[1].split("x"))
            tf.config.threading.set_inter_op_parallelism_threads(inter)
            tf.config.threading.set_intra_op_parallelism_threads(intra)

        serve = tf.saved_model.load(path).signatures["serving_default"]
        return lambda lines: [t.decode("utf-8") for t in serve(text=tf.constant(lines))["translation"].numpy()]
    if kind == "translator":
        import tensorflow as tf

        from keras_transformer.loading import translator_from_saved_model

        translator = translator_from_saved_model(path, beam_size=BEAM_SIZE, length_penalty=LENGTH_PENALTY)
        return lambda lines: [t.decode("utf-8") for t in translator.serve(tf.constant(lines))["translation"].numpy()]
    if kind.startswith("ct2_"):
        from keras_transformer.ctranslate2_export import CTranslate2Translator

        compute_type, _, threads = kind[len("ct2_"):].partition("@")
        ct2 = CTranslate2Translator(path, compute_type=compute_type, intra_threads=int(threads or os.cpu_count()))
        return lambda lines: ct2.translate(lines, beam_size=BEAM_SIZE, length_penalty=CT2_LENGTH_PENALTY)
    raise ValueError(kind)


def worker(kind, path, sentences_file, batch1):
    """Answer `time BATCH` and `outputs` requests on stdin, one JSON line each."""
    import time

    with open(sentences_file, encoding="utf-8") as f:
        lines = f.read().split("\n")
    translate = _load(kind, path)
    translate(lines[:32])  # warm-up: tracing, thread pools
    translate(lines[:1])
    print("ready", flush=True)
    for request in sys.stdin:
        command = request.split()
        if command[0] == "time":
            batch = int(command[1])
            todo = lines if batch > 1 else lines[:batch1]
            start = time.perf_counter()
            for i in range(0, len(todo), batch):
                translate(todo[i : i + batch])
            print(json.dumps({"ms_per_sentence": 1000 * (time.perf_counter() - start) / len(todo)}), flush=True)
        elif command[0] == "outputs":
            out = []
            for i in range(0, len(lines), 32):
                out.extend(translate(lines[i : i + 32]))
            print(json.dumps(out), flush=True)
        elif command[0] == "quit":
            return


# ---------------------------------------------------------------- race side

class Contender:
    def __init__(self, name, kind, path, sentences_file, batch1, env=None):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   **(env or {}))
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--worker", kind, path, sentences_file, str(batch1)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        )
        self._expect("ready")

    def _expect(self, word):
        line = self.process.stdout.readline()
        if line.strip() != word:
            raise RuntimeError(f"{self.name} did not start: {line!r} (run the worker by hand to see why)")

    def ask(self, request):
        self.process.stdin.write(request + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self):
        self.process.stdin.write("quit\n")
        self.process.stdin.flush()
        self.process.wait(timeout=60)


def main():
    from keras_transformer.cli import _positive_int as positive_int

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saved-model", action="append",
                        help="SavedModel(s) to race (default: saved_models/multi30k-en-de); the first "
                             "is also converted for the translator and CTranslate2 contenders")
    parser.add_argument("--data", default=os.environ.get("MULTI30K_DIR", os.path.join(REPO, "..", "shared", "data", "multi30k")))
    parser.add_argument("--sentences", type=positive_int, help="test sentences at batch 32 (default: 512)")
    parser.add_argument("--batch1-sentences", type=positive_int, help="of which timed at batch 1 (default: 64)")
    parser.add_argument("--rounds", type=positive_int, help="interleaved rounds (default: 3)")
    parser.add_argument("--xla-max-batch-size", type=int, default=4,
                        help="the hybrid contender's largest XLA batch")
    parser.add_argument("--quick", action="store_true",
                        help="64 sentences, 8 at batch 1, one round (where not given)")
    parser.add_argument("--only", help="a regular expression: race only the contenders whose names it "
                                       "matches (and ct2_float32 on all CPUs and on one thread, the yardstick)")
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, path, sentences_file, batch1 = args.worker
        return worker(kind, path, sentences_file, int(batch1))
    # --quick sets what is not given (it overrode an explicit --rounds).
    for name, full, quick in (("sentences", 512, 64), ("batch1_sentences", 64, 8), ("rounds", 3, 1)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.batch1_sentences > args.sentences:
        parser.error(f"--batch1-sentences {args.batch1_sentences} is more than --sentences {args.sentences}")
    try:
        import ctranslate2  # noqa: F401 -- the yardstick, before any worker starts
    except ImportError:
        parser.error("the race's yardstick is CTranslate2, which is not installed: "
                     "pip install \"keras-transformer[ctranslate2]\"")

    from keras_transformer.ctranslate2_export import export_ctranslate2
    from keras_transformer.data.text_files import read_lines
    from keras_transformer.evaluation import corpus_scores
    from keras_transformer.languages import model_languages

    saved_models = args.saved_model or [os.path.join(REPO, "saved_models", "multi30k-en-de")]
    first = saved_models[0]
    # The languages the export records (the folder's name said them before: "my-model" read as my -> model).
    languages = model_languages(first)
    if languages is None:
        parser.error(f"{first} records no language pair (an export of an older version, or not a "
                     "SavedModel of this library): export it again with `keras-transformer export`")
    source, target = languages
    for path in (os.path.join(args.data, f"test_2016_flickr.{source}.gz"),
                 os.path.join(args.data, f"test_2016_flickr.{target}.gz")):
        if not os.path.exists(path):
            parser.error(f"{path} does not exist: pass the Multi30k folder as --data, or set MULTI30K_DIR")
    lines = read_lines(os.path.join(args.data, f"test_2016_flickr.{source}.gz"))[: args.sentences]
    references = read_lines(os.path.join(args.data, f"test_2016_flickr.{target}.gz"))[: args.sentences]
    work = tempfile.mkdtemp(prefix="decoding-race-")
    sentences_file = os.path.join(work, "sentences.txt")
    with open(sentences_file, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))

    # The first SavedModel exported again by this version of the library:
    # today's export beside the one it was shipped as. Each contender is
    # (name, worker kind, a function that makes its model directory, extra
    # environment); only those `--only` names are built and started.
    from keras_transformer.export import export_translator
    from keras_transformer.loading import translator_from_saved_model

    with open(os.path.join(first, "keras_transformer.json")) as f:
        exported = json.load(f)
    weights_dtype = exported.get("weights_dtype", "float32")
    built = {}

    def export(name, weights_dtype="float32", **settings):
        """Export (once) the first SavedModel's weights with `settings`
        (beam 4, 0.6 and `Translator` arguments) into `work/name`."""
        if name not in built:
            again = translator_from_saved_model(first, beam_size=BEAM_SIZE, length_penalty=LENGTH_PENALTY,
                                                **settings)
            built[name] = export_translator(again, os.path.join(work, name), weights_dtype=weights_dtype)
        return built[name]

    def convert(name, **settings):
        """Convert (once) the first SavedModel to CTranslate2 into `work/name`."""
        if name not in built:
            built[name] = export_ctranslate2(first, os.path.join(work, name), **settings)
        return built[name]

    def given_name(path):
        name = f"saved_model:{os.path.basename(os.path.normpath(path))}" if len(saved_models) > 1 else "saved_model"
        with open(os.path.join(path, "keras_transformer.json")) as f:
            search = json.load(f)["decoding"]
        if (search["beam_size"], search["length_penalty"]) != (BEAM_SIZE, LENGTH_PENALTY):
            name += f" (its own beam {search['beam_size']}, {search['length_penalty']})"
        return name

    xla = {"jit_compile": True}
    hybrid = {"jit_compile": True, "xla_max_batch_size": args.xla_max_batch_size}
    old_runtime = {"XLA_FLAGS": "--xla_cpu_use_thunk_runtime=false"}
    no_onednn = {"TF_ENABLE_ONEDNN_OPTS": "0"}
    plan = [(given_name(p), "saved_model", lambda p=p: p, None) for p in saved_models]
    plan += [
        ("saved_model_now", "saved_model", lambda: export("now", weights_dtype), None),
        ("saved_model_now_1thread", "saved_model@1x1", lambda: export("now", weights_dtype), None),
    ]
    if weights_dtype != "float32":
        # The same values (a float16 weight is exact in float32) stored as
        # float32: no weight casts a call, twice the weights' bytes.
        plan.append(("saved_model_now_float32", "saved_model", lambda: export("now_float32"), None))
    plan += [
        ("saved_model_int8", "saved_model", lambda: export("int8", "int8"), None),
        ("saved_model_now_xla", "saved_model", lambda: export("xla", **xla), None),
        ("saved_model_now_xla_1x1", "saved_model@1x1", lambda: export("xla", **xla), None),
        ("saved_model_now_xla_1x1_xla_old_runtime", "saved_model@1x1", lambda: export("xla", **xla),
         old_runtime),
        ("saved_model_now_hybrid", "saved_model", lambda: export("hybrid", **hybrid), None),
        # Two searches of half a batch each, on two inter-op threads of one
        # intra-op thread (TF Serving: --tensorflow_inter_op_parallelism=2
        # --tensorflow_intra_op_parallelism=1); then the same beside XLA for
        # small batches, and with XLA's older CPU runtime (XLA_FLAGS).
        ("saved_model_now_2searches_2x1", "saved_model@2x1",
         lambda: export("2searches", parallel_searches=2), None),
        ("saved_model_now_hybrid_2searches_2x1", "saved_model@2x1",
         lambda: export("hybrid_2searches", parallel_searches=2, **hybrid), None),
        ("saved_model_now_hybrid_2searches_2x1_xla_old_runtime", "saved_model@2x1",
         lambda: export("hybrid_2searches", parallel_searches=2, **hybrid), old_runtime),
        # TensorFlow's graph ops without oneDNN, which TensorFlow turns on by
        # default on CPUs with AVX-512 (TF Serving reads the same variable).
        ("saved_model_now_1thread_onednn_off", "saved_model@1x1", lambda: export("now", weights_dtype),
         no_onednn),
        ("saved_model_now_2searches_2x1_onednn_off", "saved_model@2x1",
         lambda: export("2searches", parallel_searches=2), no_onednn),
        ("saved_model_now_hybrid_2searches_2x1_onednn_off", "saved_model@2x1",
         lambda: export("hybrid_2searches", parallel_searches=2, **hybrid), no_onednn),
        ("translator", "translator", lambda: first, None),
        ("ct2_float32", "ct2_float32", lambda: convert("ct2"), None),
        # CTranslate2 on one thread: its best at batch 1 on some machines.
        ("ct2_float32_1thread", "ct2_float32@1", lambda: convert("ct2"), None),
        ("ct2_int8", "ct2_int8", lambda: convert("ct2-int8", quantization="int8"), None),
    ]
    if args.only:
        wanted = re.compile(args.only)
        plan = [entry for entry in plan if entry[0].startswith("ct2_float32") or wanted.search(entry[0])]
    contenders = []
    for name, kind, make, env in plan:
        print(f"starting {name} ...", file=sys.stderr, flush=True)
        contenders.append(Contender(name, kind, make(), sentences_file, args.batch1_sentences, env))
    times = {(c.name, b): [] for c in contenders for b in (32, 1)}
    for round_ in range(args.rounds):
        for contender in contenders:
            for batch in (32, 1):
                times[(contender.name, batch)].append(contender.ask(f"time {batch}")["ms_per_sentence"])
        print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    scores = {}
    for contender in contenders:
        outputs = contender.ask("outputs")
        scores[contender.name] = corpus_scores(outputs, references)
        contender.close()

    median = {key: statistics.median(values) for key, values in times.items()}
    # The yardstick: CTranslate2 float32 on its faster thread setting at
    # each batch size (on some 2-core machines its two OpenMP threads take
    # ten times as long as one at batch 1).
    yardstick = {b: min(median[(name, b)] for name in ("ct2_float32", "ct2_float32_1thread")
                        if (name, b) in median) for b in (32, 1)}
    print(f"\nDecoding race: {len(lines)} test_2016_flickr sentences {source}->{target} at batch 32, "
          f"{min(len(lines), args.batch1_sentences)} at batch 1; beam {BEAM_SIZE}; medians of "
          f"{args.rounds} interleaved rounds; {os.cpu_count()} CPUs")
    print("| contender | batch 32, ms/sentence | batch 1, ms/sentence | x best CT2 f32 @32 | x best CT2 f32 @1 | BLEU | chrF |")
    print("|---|---|---|---|---|---|---|")
    for contender in contenders:
        name = contender.name
        b32, b1 = median[(name, 32)], median[(name, 1)]
        r32, r1 = b32 / yardstick[32], b1 / yardstick[1]
        s = scores[name]
        print(f"| {name} | {b32:.1f} | {b1:.1f} | {r32:.2f} | {r1:.2f} | {s['bleu']:.2f} | {s['chrf']:.2f} |")
    print("\n(x best CT2 f32: time relative to CTranslate2 float32 on its faster thread setting "
          "at that batch size, of those raced; below 1 is faster.)")


if __name__ == "__main__":
    main()
