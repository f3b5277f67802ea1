"""`keras-transformer`: train, evaluate, translate, export, average, build-kernels, demo.

Run `keras-transformer COMMAND --help` for the options of each command.
"""

import argparse
import contextlib
import io
import json
import math
import os
import re
import shlex
import shutil
import sys
import time


def _positive_float(text):
    """argparse type: a float above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0; got {text}")
    return value


def _positive_int(text):
    """argparse type: an int of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1; got {value}")
    return value


def _non_negative_float(text):
    """argparse type: a finite float of at least 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0; got {text}")
    return value


def _add_training_args(parser):
    from keras_transformer.precision import PRECISIONS
    from keras_transformer.config import TrainingConfig

    defaults = TrainingConfig(train_src="", train_tgt="")
    parser.add_argument("--config", metavar="FILE",
                        help="read the settings from a JSON or YAML file (the keys a run's config.json "
                             "records, e.g. that file itself); flags given here override it")
    parser.add_argument("--train-src", help="training source file (plain or .gz); required, here or in --config")
    parser.add_argument("--train-tgt", help="aligned training target file; required, here or in --config")
    parser.add_argument("--extra-train", nargs=2, action="append", metavar=("SRC", "TGT"),
                        help="more aligned training files, trained on with --train-src/--train-tgt in "
                             "every epoch: e.g. a model's translations of the training sources (knowledge "
                             "distillation) or back-translations of the targets; repeatable; the "
                             "tokenizers are trained on --train-src/--train-tgt alone")
    # A --config file's list is the default these flags append to; --no-X
    # empties it (a later --X then starts a new list).
    parser.add_argument("--no-extra-train", dest="extra_train", action="store_const", const=[],
                        help="drop the --extra-train pairs a --config file lists")
    parser.add_argument("--val-src", help="validation source file")
    parser.add_argument("--val-tgt", help="validation target file")
    parser.add_argument("--output-dir", default=defaults.output_dir,
                        help="run folder (resumes if it exists; without --train-src/--train-tgt, "
                             "with the settings of its config.json, which flags given override)")
    parser.add_argument("--preset", default=defaults.preset, choices=["base", "big", "small", "tiny"],
                        help="model size (default: %(default)s): base and big are the paper's "
                             "table 3, small is 3 layers of d_model 256")
    for name, kind in (("num-layers", int), ("d-model", int), ("num-heads", int), ("dff", int), ("dropout-rate", float)):
        parser.add_argument(f"--{name}", type=kind, help="override the preset's (docs/training.md lists them)")
    parser.add_argument("--num-decoder-layers", type=int,
                        help="decoder blocks (default: as many as encoder blocks, --num-layers)")
    helps = {
        "sequence_length": "longest source / target in subword tokens (longer pairs are cut) and "
                           "the model's position-table size",
        "src_vocab_size": "source SentencePiece vocabulary size",
        "tgt_vocab_size": "target SentencePiece vocabulary size",
        "tokens_per_batch": "token budget per batch and side, length-bucketed (0: fixed --batch-size)",
        "batch_size": "sentences per batch when --tokens-per-batch is 0",
        "epochs": "passes over the training data",
        "warmup_steps": "warm-up steps of the learning-rate schedule (section 5.3)",
        "seed": "random seed",
        "max_train_pairs": "use only the first N training pairs (smoke runs)",
        "lr_scale": "factor on the schedule's learning rate",
        "label_smoothing": "epsilon_ls of section 5.4",
    }
    positive = ("batch_size", "epochs", "max_train_pairs")
    for name in ("sequence_length", "src_vocab_size", "tgt_vocab_size", "tokens_per_batch", "batch_size",
                 "epochs", "warmup_steps", "seed", "max_train_pairs"):
        # --max-length: the old name of --sequence-length, still accepted.
        flags = ["--" + name.replace("_", "-")] + (["--max-length"] if name == "sequence_length" else [])
        parser.add_argument(*flags, dest=name, type=_positive_int if name in positive else int,
                            default=getattr(defaults, name), help=f"{helps[name]} (default: %(default)s)",
                            **({"action": _OneValueUnderTwoNames} if len(flags) > 1 else {}))
    for name in ("lr_scale", "label_smoothing"):
        parser.add_argument("--" + name.replace("_", "-"), type=float, default=getattr(defaults, name),
                            help=f"{helps[name]} (default: %(default)s)")
    parser.add_argument("--subword-alpha", type=float, metavar="ALPHA",
                        help="subword regularization (Kudo, 2018): sample a new segmentation of every "
                             "training pair each epoch, with this smoothing parameter in (0, 1]; "
                             "with a unigram vocabulary smaller is more varied (default: off, one fixed segmentation)")
    parser.add_argument("--bidirectional-epochs", type=int, default=defaults.bidirectional_epochs, metavar="N",
                        help="bidirectional training (BiT, Ding et al., 2021): the first N epochs train on the "
                             "pairs in both directions (twice the steps), the rest source to target; needs "
                             "--shared-vocab (default: %(default)s, off)")
    parser.add_argument("--cooldown-epochs", type=int, default=defaults.cooldown_epochs, metavar="N",
                        help="the learning rate falls linearly to 0 over the last N of --epochs (not in the "
                             "paper; a run that --time-budget or early stopping ends sooner never reaches "
                             "it) (default: %(default)s, off)")
    for name, help_text in (
        ("attention-dropout-rate", "dropout on the attention weights (default: --dropout-rate)"),
        ("activation-dropout-rate", "dropout on the feed-forward activation (default: 0)"),
    ):
        parser.add_argument(f"--{name}", type=float, help=help_text)
    parser.add_argument("--tie-embeddings", default=defaults.tie_embeddings, choices=["none", "target", "all"],
                        help="share one matrix between the target embedding and the output projection "
                             "(target), and the source embedding too (all, needs --shared-vocab); "
                             "section 3.4 (default: %(default)s)")
    # --no-X too: a --config file's true can be switched off on the command line.
    flag = dict(action=argparse.BooleanOptionalAction)
    parser.add_argument("--norm-first", default=defaults.norm_first, **flag,
                        help="pre-LN blocks with a final LayerNorm per stack (Xiong et al., 2020) "
                             "instead of the paper's post-LN")
    parser.add_argument("--user-defined-symbols", action="append", metavar="PIECE",
                        help="a piece added to the vocabularies and never split (repeatable), e.g. a tag "
                             "'<BT>' written before each back-translated source line (tagged "
                             "back-translation, Caswell et al., 2019; BiT's reversed pairs drop it)")
    parser.add_argument("--no-user-defined-symbols", dest="user_defined_symbols", action="store_const", const=[],
                        help="drop the user-defined symbols a --config file lists")
    parser.add_argument("--shared-vocab", default=defaults.shared_vocab, **flag,
                        help="one SentencePiece vocabulary trained on both sides (give --src-vocab-size and "
                             "--tgt-vocab-size one value)")
    parser.add_argument("--keep-checkpoints", type=_positive_int, default=defaults.keep_checkpoints,
                        help="epoch checkpoints kept in RUN/epochs, the latest N and the N best "
                             "(default: %(default)s)")
    parser.add_argument("--average-last", type=_positive_int,
                        help="after training, average the last N epoch checkpoints into RUN/averaged.keras")
    parser.add_argument("--early-stopping-patience", type=_positive_int,
                        help="stop after N epochs without a lower validation loss")
    parser.add_argument("--time-budget", type=_positive_float, metavar="SECONDS",
                        help="stop at the end of the epoch after which the next one would take the "
                             "run's training time (a resumed run's included) past SECONDS")
    parser.add_argument("--bleu-every", type=int, default=defaults.bleu_every,
                        help="validation BLEU (greedy) every N epochs, logged as val_bleu (default: 0, off)")
    parser.add_argument("--checkpoint-metric", default=defaults.checkpoint_metric, choices=["val_loss", "val_bleu"],
                        help="what chooses RUN/best.keras (default: %(default)s)")
    parser.add_argument("--checkpoint-every", type=_positive_int, metavar="N",
                        help="also save the training state every N steps (a killed run loses at most N; "
                             "the resumed epoch starts its data over)")
    parser.add_argument("--tensorboard", default=defaults.tensorboard, **flag,
                        help="write TensorBoard logs to RUN/tensorboard")
    parser.add_argument("--lowercase", default=defaults.lowercase, **flag, help="lowercase text before tokenizing")
    parser.add_argument("--jit-compile", default=defaults.jit_compile, **flag,
                        help="compile the train step with XLA (tensorflow; on jax it always is)")
    parser.add_argument("--distribution", choices=["data_parallel", "multi_worker"],
                        help="data-parallel training over all local devices, or over several "
                             "hosts (jax only: keras.distribution.initialize reads "
                             "KERAS_DISTRIBUTION_*)")
    parser.add_argument("--precision", default=defaults.precision,
                        choices=PRECISIONS,
                        help="compute dtype policy (default: auto = mixed_bfloat16 on a CPU with "
                             "bfloat16 instructions for d_model >= 256, float32 elsewhere; "
                             "$KERAS_TRANSFORMER_PRECISION, when set, replaces auto; "
                             "decoding is float32)")


# Decoding settings of a run; a SavedModel has its own, fixed by `export`.
_RUN_DECODING = {"search": None, "beam_size": 4, "length_penalty": 0.6, "checkpoint": "best", "jit_compile": False,
                 "xla_max_batch_size": None, "parallel_searches": 1}


def _decoding_args(parser, batches=True, ensemble=True):
    # A SavedModel keeps the search it was exported with: these are for --run
    # (and --ensemble, where the command has it).
    only = "--run and --ensemble only" if ensemble else "--run only"
    parser.add_argument("--search", choices=["greedy", "beam"],
                        help="decoding strategy (default: beam; greedy is --beam-size 1); " + only)
    parser.add_argument("--beam-size", type=_positive_int,
                        help="1 for greedy decoding (default: 4); " + only)
    parser.add_argument("--length-penalty", type=_non_negative_float,
                        help="GNMT alpha (default: 0.6); beam search; " + only)
    if batches:
        parser.add_argument("--batch-size", type=_positive_int, default=64, help="sentences per batch")
    parser.add_argument("--jit-compile", action="store_true", default=None,
                        help="compile the search with XLA (faster on CPU; exported graphs then need XLA); "
                             + only)
    parser.add_argument("--xla-max-batch-size", type=_positive_int,
                        help="with --jit-compile: batches of at most this many sentences take the XLA search, "
                             "larger ones the plain graph (faster there); " + only)
    parser.add_argument("--parallel-searches", type=_positive_int,
                        help="split each batch into this many parts, decoded at the same time on one core "
                             "each (default: 1; at most the cores a request may use). translate and "
                             "evaluate then run TensorFlow with that many inter-op threads of one intra-op "
                             "thread; an export asks TF Serving for the same; " + only)
    parser.add_argument("--checkpoint", choices=["best", "last", "averaged"],
                        help="which weights of the run (default: best); " + only)


def _check_saved_model_args(args):
    """Refuse the run-only decoding options with `--saved-model`: the
    SavedModel's search was fixed when it was exported, and ignoring them
    would give another search than the one asked for."""
    given = [name for name in _RUN_DECODING if getattr(args, name, None) is not None]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ValueError(
            f"{flags} {'applies' if len(given) == 1 else 'apply'} to --run and --ensemble only: a SavedModel decodes with the settings it was "
            f"exported with. Drop {'it' if len(given) == 1 else 'them'}, or export again with "
            f"{'it' if len(given) == 1 else 'them'} (`keras-transformer export "
            "--run RUN --output DIR --beam-size N ...`)."
        )


def _load_saved_model(path):
    """`(batch,) tf.string -> (batch,) tf.string` translations by the SavedModel at `path`."""
    from keras_transformer.loading import SavedModelTranslator

    translator = SavedModelTranslator(path)
    return lambda batch: translator.serve(batch)["translation"]


def _translator_object(args):
    """The SavedModel, run or ensemble translator the args name."""
    if getattr(args, "saved_model", None):
        from keras_transformer.config import check_saved_model_folder

        _check_saved_model_args(args)
        check_saved_model_folder(args.saved_model)  # before TensorFlow starts
        _import_backend_quietly()
        from keras_transformer.loading import SavedModelTranslator

        return SavedModelTranslator(args.saved_model)  # sets the export's search threads
    return _translator(args, set_threads=True)


def _check_search_flags(args):
    """The XLA and parallel-search flags that only make sense together,
    refused with their flag names before a model is loaded."""
    jit, xla_max, parts = (getattr(args, name, None) for name in ("jit_compile", "xla_max_batch_size",
                                                                   "parallel_searches"))
    if xla_max is not None and not jit:
        raise ValueError("--xla-max-batch-size chooses which batches take the XLA search: pass --jit-compile "
                         "too, or drop it.")
    if parts is not None and parts > 1 and jit and xla_max is None:
        raise ValueError("--parallel-searches splits the batches of the plain graph search, and with "
                         "--jit-compile alone every batch takes XLA: add --xla-max-batch-size N (XLA up to "
                         "N sentences, parallel searches above), or drop one of them.")
    cores = os.cpu_count() or 1
    if parts is not None and parts > cores:
        print(f"keras-transformer: --parallel-searches {parts} is more search loops than this machine's "
              f"{cores} cores; each loop runs on a core of its own, so more than the serving machine's "
              "cores only adds work.", file=sys.stderr)


class _Serve:
    """A translator's `(batch,) tf.string -> (batch,) tf.string` function
    that also counts the sources longer than the model's source limit,
    which are cut to it, and those with characters its vocabulary lacks
    (`report`, a `source_notices.SourceReport`)."""

    def __init__(self, translator):
        from keras_transformer.source_notices import SourceReport

        self.translator = translator
        self.report = SourceReport(translator.source_sequence_length)

    def __call__(self, batch):
        self.report.add(self.translator.src_tokenizer, batch)
        return self.translator.serve(batch)["translation"]


def _translate_fn(args):
    """A `(batch,) tf.string -> (batch,) tf.string` function for the args
    (a `_Serve`)."""
    return _Serve(_translator_object(args))


def _report_sources(report, total):
    """Say on stderr what `report` (a `SourceReport`; None: nothing)
    found in `total` sources: those cut to the source limit, those with
    unknown characters."""
    for message in report.messages(total) if report is not None else ():
        print(f"keras-transformer: {message}", file=sys.stderr)


def _translator(args, set_threads=False):
    """The `Translator` of `--run` with the decoding flags; with
    `set_threads`, TensorFlow's threads set for `--parallel-searches`."""
    from keras_transformer.config import check_run_folder

    settings = {name: default if getattr(args, name, None) is None else getattr(args, name)
                for name, default in _RUN_DECODING.items()}
    search = settings.pop("search")
    if search == "greedy":
        if args.beam_size not in (None, 1):
            raise ValueError(f"--search greedy keeps one hypothesis; drop --beam-size {args.beam_size}.")
        settings["beam_size"] = 1
    elif search == "beam" and settings["beam_size"] < 2:
        raise ValueError("--search beam needs --beam-size 2 or more (1 is --search greedy).")
    if settings["beam_size"] == 1 and args.length_penalty is not None:
        given = "--search greedy" if search == "greedy" else "--beam-size 1"
        raise ValueError(
            f"--length-penalty has no effect with {given} (greedy decoding ranks "
            "nothing); drop one of them."
        )
    _check_search_flags(args)
    ensemble = getattr(args, "ensemble", None)
    if ensemble:
        _check_ensemble_folders(ensemble)  # before TensorFlow starts
    else:
        check_run_folder(args.run)
    _import_backend_quietly()
    if set_threads:
        from keras_transformer.loading import set_search_threads

        set_search_threads(settings["parallel_searches"])
    if ensemble:
        from keras_transformer.loading import load_ensemble

        return load_ensemble(ensemble, **settings)
    from keras_transformer.training import load_run
    from keras_transformer.translator import Translator

    model, src, tgt, _ = load_run(args.run, which=settings.pop("checkpoint"))
    # A model loaded for this command alone: its weights do not change.
    return Translator(model, src, tgt, transposed_output_table=True, **settings)


def _check_ensemble_folders(paths):
    """Refuse a one-model `--ensemble` and folders that are neither a run
    nor a SavedModel, before TensorFlow starts."""
    if len(paths) < 2:
        raise ValueError(f"--ensemble {paths[0]} names one model; an ensemble needs two or more "
                         "(--ensemble A --ensemble B). For one model use --run or --saved-model.")
    for path in paths:
        if not any(os.path.exists(os.path.join(path, name)) for name in ("config.json", "saved_model.pb")):
            raise FileNotFoundError(f"--ensemble {path}: not a training run folder (config.json) or a "
                                    "SavedModel folder (saved_model.pb).")


class _OneValueUnderTwoNames(argparse.Action):
    """A setting with an old and a new flag (`--max-length`,
    `--sequence-length`): both given with different values is an error,
    not the last one silently winning."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, "_given_" + self.dest, None)
        if given is not None and given[1] != values:
            parser.error(f"{given[0]} {given[1]} and {option_string} {values} set the same setting "
                         f"({self.dest}) to different values: pass one of them.")
        setattr(namespace, "_given_" + self.dest, (option_string, values))
        setattr(namespace, self.dest, values)


class _Once(argparse.Action):
    """A file flag that takes one value: given twice is an error, not the
    last one silently winning (`evaluate --ref a.de --ref b.de` scored b.de
    alone, where several references were meant)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, "_given_" + self.dest, None)
        if given is not None:
            parser.error(f"{option_string} given twice ({given} and {values}): this command reads one "
                         f"{self.metavar or self.dest} file; pass {option_string} once.")
        setattr(namespace, "_given_" + self.dest, values)
        setattr(namespace, self.dest, values)


def _apply_config_file(parser, argv):
    """Make the values of `train --config FILE` the train parser's
    defaults, so that flags on the command line override them."""
    from keras_transformer.config import read_config_file

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    pre.add_argument("--output-dir")
    pre.add_argument("--train-src")
    pre.add_argument("--train-tgt")
    known, _ = pre.parse_known_args(argv)
    if not (known.config or known.train_src or known.train_tgt) and known.output_dir:
        # A run folder without training files: resumed with its own
        # settings, unless flags say otherwise.
        recorded = os.path.join(known.output_dir, "config.json")
        if os.path.isfile(recorded):
            known.config = recorded
            parser.set_defaults(config=recorded)
            print(f"Settings from {recorded} (flags given override them)", file=sys.stderr)
    if known.config:
        try:
            values = read_config_file(known.config)
            old, new = values.pop("max_length", None), values.get("sequence_length")
            if old is not None and new is not None and old != new:
                raise ValueError(f"max_length {old} and sequence_length {new} (its new name) set the "
                                 "same setting to different values: keep one of them")
            if old is not None:
                values["sequence_length"] = old
            parser.set_defaults(**values, config_values=values)
        except (OSError, ValueError) as error:
            parser.exit(1, f"keras-transformer train: error: --config: {error}\n")


def cmd_train(args):
    from keras_transformer.training import TrainingConfig, train

    if not (args.train_src and args.train_tgt):
        raise ValueError("--train-src and --train-tgt are required (on the command line or in --config FILE).")
    fields = {k.replace("-", "_"): v for k, v in vars(args).items()}
    config = TrainingConfig(**{k: v for k, v in fields.items() if k in TrainingConfig.__dataclass_fields__})
    start, before = time.time(), _epochs_logged(config.output_dir)
    try:
        # Keras redraws its progress bar in place; into a log file, one line an epoch.
        train(config, verbose=1 if getattr(sys.stdout, "isatty", lambda: False)() else 2)
    except ValueError as error:
        # A setting's range error ("`dropout_rate` must be ...") says where the
        # value came from when the --config file set it.
        from_file = getattr(args, "config_values", None) or {}
        named = [name for name in re.findall(r"`(\w+)`", str(error))
                 if name in from_file and fields.get(name) == from_file[name]]
        if named:
            raise ValueError(f"{error} (set by {named[0]} in --config {args.config})") from None
        raise
    trained = _epochs_logged(config.output_dir) - before
    if trained:
        print(f"Trained {trained} epoch{'s' * (trained > 1)} in {time.time() - start:.0f} s; "
              f"run folder: {config.output_dir}")
    else:
        print(f"Nothing trained; run folder: {config.output_dir}")


def _epochs_logged(run_dir):
    """The lines of a run's `epochs.jsonl` (one an epoch finished, an
    epoch trained again adds one); 0 without it."""
    try:
        with open(os.path.join(run_dir, "epochs.jsonl")) as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


def evaluate_files(serve, src_path, ref_path, batch_size=64, limit=None, output=None):
    """Translate `src_path` with `serve` and score it against `ref_path`.

    `serve` maps a `(batch,)` `tf.string` tensor to its translations.
    Returns the `corpus_scores` dict (sacreBLEU cased and lowercased, chrF)
    plus the translation time in seconds.
    """
    from keras_transformer.data.text_files import read_parallel
    from keras_transformer.evaluation import corpus_scores
    from keras_transformer.translator import translate_lines

    sources, references = read_parallel(src_path, ref_path)
    if not sources:  # before --output is written
        raise ValueError(f"{src_path} and {ref_path} hold no line: there is nothing to score.")
    if output:
        open(output, "w").close()  # an unwritable path fails now, not after translating
    if limit:
        sources, references = sources[:limit], references[:limit]
    start = time.time()
    hypotheses = translate_lines(serve, sources, batch_size=batch_size, progress=True)
    elapsed = time.time() - start
    if output:
        with open(output, "w", encoding="utf-8") as f:
            f.write("\n".join(hypotheses) + "\n")
    scores = corpus_scores(hypotheses, references)
    scores["seconds"] = round(elapsed, 1)
    return scores


def cmd_evaluate(args):
    from keras_transformer.config import check_files
    from keras_transformer.config import check_run_folder
    from keras_transformer.config import check_saved_model_folder

    from keras_transformer.languages import check_file_languages
    from keras_transformer.languages import check_same_direction

    check_files(args.src, args.ref)  # before the model load, which takes seconds
    if args.output:
        folder = os.path.dirname(os.path.abspath(args.output))
        if os.path.isdir(args.output) or not os.path.isdir(folder):
            raise ValueError(f"--output {args.output}: " + ("is a folder; name a file to write the translations to."
                             if os.path.isdir(args.output) else f"the folder {folder} does not exist; create it "
                             "or write the translations elsewhere."))
        for flag, path in (("--src", args.src), ("--ref", args.ref)):
            if os.path.exists(args.output) and os.path.samefile(args.output, path):
                raise ValueError(f"--output {args.output} is the {flag} file: writing the translations "
                                 "there would replace it. Name another file.")
    if args.saved_model:  # the flag and folder errors first: they say more than a language check would
        _check_saved_model_args(args)
        check_saved_model_folder(args.saved_model)
    elif args.run:
        check_run_folder(args.run)
    if args.ensemble:
        _check_ensemble_folders(args.ensemble)
        check_same_direction(args.ensemble)  # before the files are held against each member
    if not args.no_language_check:
        for model in args.ensemble or [args.saved_model or args.run]:
            check_file_languages(model, args.src, args.ref)
    # The progress bar goes to stderr: stdout is the JSON (`evaluate ... > scores.json`).
    with contextlib.redirect_stdout(sys.stderr):
        serve = _translate_fn(args)
        scores = evaluate_files(serve, args.src, args.ref, args.batch_size, args.limit, args.output)
    _report_sources(getattr(serve, "report", None), scores["num_segments"])
    print(json.dumps(scores, indent=2))


def cmd_translate(args):
    if args.text:
        lines = args.text
        for number, line in enumerate(lines, 1):
            try:
                line.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(
                    f"text argument {number} is not UTF-8 text; pass UTF-8 text (or lines on stdin)."
                ) from None
            if os.path.isfile(line):
                print(f"keras-transformer translate: text argument {number} ({line!r}) is the name "
                      "of a file; it is translated as text. To translate the file's lines, pass "
                      f"it on stdin: keras-transformer translate ... < {shlex.quote(line)}",
                      file=sys.stderr)
        words = [line.strip() for line in lines if line.strip()]
        if len(words) > 1 and not any(" " in word for word in words):
            print(f"keras-transformer translate: {len(lines)} arguments, each translated as its own "
                  "sentence; to translate one sentence, quote it: "
                  f"keras-transformer translate ... {shlex.quote(' '.join(words))}", file=sys.stderr)
    else:
        from keras_transformer.data.text_files import read_text_lines

        stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", newline="\n")
        lines = read_text_lines(stdin, "stdin")
    if args.plot_attention:
        if not args.run:
            raise ValueError("--plot-attention needs --run (the SavedModel returns no weights).")
        if not lines:
            raise ValueError("--plot-attention needs a sentence: pass it as an argument or on stdin.")
        from keras_transformer.plotting import plot_attention
        from keras_transformer.tokenizers.normalization import normalize_text

        if not normalize_text([lines[0]]).numpy()[0]:  # an end token attending to an end token
            raise ValueError("--plot-attention plots the first sentence, and it is blank: put a sentence "
                             "first (an argument, or the first line on stdin).")

        found = _translator(args).attention_scores(lines[0])
        plot_attention(found["source_tokens"], found["output_tokens"], found["weights"],
                       args.plot_attention, title=f"{lines[0]} -> {found['translation']}")
        print(f"Cross-attention of the last decoder layer written to {args.plot_attention}",
              file=sys.stderr)
    if args.n_best == 1 and not args.scores and args.format == "text":
        serve = _translate_fn(args)
        from keras_transformer.translator import translate_lines

        for line in translate_lines(serve, lines, batch_size=args.batch_size):
            print(line)
        _report_sources(getattr(serve, "report", None), len(lines))
        return
    from keras_transformer.source_notices import SourceReport
    from keras_transformer.translator import translate_n_best

    translator = _translator_object(args)
    found = translate_n_best(translator.serve_n_best, lines, args.n_best, batch_size=args.batch_size)
    for index, (source, hypotheses) in enumerate(zip(lines, found)):
        if args.format == "jsonl":
            print(json.dumps({"source": source, "translations": [t for t, _ in hypotheses],
                              "scores": [round(score, 6) for _, score in hypotheses]},
                             ensure_ascii=False))
            continue
        # Repeated texts are dropped, so a sentence can have fewer than N:
        # with N > 1 each line says which sentence it translates.
        prefix = f"{index}\t" if args.n_best > 1 else ""
        for translation, score in hypotheses:
            print(prefix + (f"{score:.4f}\t{translation}" if args.scores else translation))
    report = SourceReport(translator.source_sequence_length)
    report.add(translator.src_tokenizer, lines)
    _report_sources(report, len(lines))


def cmd_export(args):
    if args.format == "ctranslate2":
        return _export_ctranslate2(args)
    if args.saved_model or args.quantization:
        flag = "--saved-model" if args.saved_model else "--quantization"
        raise ValueError(f"{flag} applies to --format ctranslate2 only; a SavedModel is exported "
                         "from a --run.")
    output = args.output.rstrip("/\\") or args.output
    if os.path.exists(output) and not os.path.isdir(output):
        raise ValueError(f"{output} is a file; --output must be a folder.")
    replace = os.path.isdir(output) and bool(os.listdir(output))
    if replace and not args.overwrite:
        raise ValueError(
            f"{output} already exists and is not empty; pass --overwrite to replace the "
            "SavedModel there, or choose another --output."
        )
    if replace and not os.path.exists(os.path.join(output, "saved_model.pb")):
        raise ValueError(
            f"{output} holds files but no saved_model.pb; --overwrite replaces only a "
            "SavedModel folder. Choose another --output."
        )
    translator = _translator(args)
    from keras_transformer.export import export_translator

    # Written beside the old SavedModel, which is replaced only once the new
    # one is complete.
    staging = output + ".export-staging" if replace else output
    if replace and os.path.exists(staging):
        shutil.rmtree(staging)
    from keras_transformer.languages import model_languages

    export_translator(translator, staging, weights_dtype=args.weights_dtype,
                      languages=model_languages(args.run))
    if replace:
        shutil.rmtree(output)
        os.replace(staging, output)
    print(f"SavedModel written to {output}")
    from keras_transformer.devices import decoding_environment
    from keras_transformer.export import serving_flags

    environment = " ".join(f"-e {k}={v}" for k, v in decoding_environment().items())
    print(f"Serve it with the environment {environment}"
          + (" and the TF Serving flags " + " ".join(serving_flags(translator))
             if serving_flags(translator) else ""))


def _export_ctranslate2(args):
    from keras_transformer.config import check_run_folder
    from keras_transformer.config import check_saved_model_folder

    if args.weights_dtype != "float32":
        raise ValueError("--weights-dtype is for SavedModels; a CTranslate2 model takes "
                         "--quantization (e.g. int8 or float16).")
    given = [name for name in ("search", "beam_size", "length_penalty", "jit_compile", "xla_max_batch_size",
                               "parallel_searches")
             if getattr(args, name) is not None]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ValueError(f"{flags} {'does' if len(given) == 1 else 'do'} not apply to a CTranslate2 model: its search is chosen when "
                         "translating (ctranslate2.Translator.translate_batch).")
    if args.run:
        check_run_folder(args.run)  # before TensorFlow starts
    else:
        if args.checkpoint is not None:
            raise ValueError("--checkpoint applies to --run only: a SavedModel holds one set of weights. "
                             "Drop it, or convert the run folder: --run RUN --checkpoint "
                             f"{args.checkpoint}.")
        check_saved_model_folder(args.saved_model)
    _import_backend_quietly()
    from keras_transformer.ctranslate2_export import export_ctranslate2

    export_ctranslate2(args.run or args.saved_model, args.output, quantization=args.quantization,
                       overwrite=args.overwrite, which=args.checkpoint or "best")
    print(f"CTranslate2 model written to {args.output}")


def cmd_demo(args):
    import keras

    from keras_transformer.data.synthetic import write_synthetic_corpus
    from keras_transformer.export import export_translator
    from keras_transformer.training import TrainingConfig, load_run, train
    from keras_transformer.translator import Translator

    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            "the demo exports a SavedModel, which needs the tensorflow Keras backend; "
            f"this process runs {keras.backend.backend()!r} (unset KERAS_BACKEND or set it "
            "to tensorflow). `keras-transformer train` runs on every backend."
        )
    start = time.time()
    out = args.output_dir
    data = os.path.join(out, "data")
    trained_on = os.path.join(data, "train.en")
    if os.path.exists(os.path.join(out, "run", "config.json")) and os.path.exists(trained_on):
        with open(trained_on, encoding="utf-8") as f:
            pairs = sum(1 for _ in f)
        if pairs != args.train_pairs:
            raise ValueError(
                f"{out} holds a demo run trained on {pairs} generated pairs, and --train-pairs is "
                f"{args.train_pairs}: pass --train-pairs {pairs} to resume it, or delete {out} "
                "(or pass another --output-dir) to start over."
            )
    print(f"[1/4] Generating a synthetic English-German corpus in {data}")
    write_synthetic_corpus(data, n_train=args.train_pairs, n_val=200, seed=0)
    config = TrainingConfig(
        train_src=os.path.join(data, "train.en"), train_tgt=os.path.join(data, "train.de"),
        val_src=os.path.join(data, "val.en"), val_tgt=os.path.join(data, "val.de"),
        output_dir=os.path.join(out, "run"), preset="tiny", sequence_length=32,
        src_vocab_size=400, tgt_vocab_size=500, tokens_per_batch=2048,
        epochs=args.epochs, warmup_steps=300, lr_scale=1.0,
    )
    print("[2/4] Training a tiny Transformer with model.fit")
    train(config, verbose=2)
    # The checkpoint with the best val loss, which `translate --run` and
    # `export` read by default: the demo's scores, its export and the
    # suggested commands are one model.
    model, src, tgt, _ = load_run(config.output_dir, which="best")
    translator = Translator(model, src, tgt, beam_size=4)
    print("[3/4] Evaluating the best checkpoint (by val loss) on the generated validation set")
    with contextlib.redirect_stdout(sys.stderr):  # the progress bar, as `evaluate` shows it
        scores = evaluate_files(lambda batch: translator.serve(batch)["translation"], config.val_src,
                                config.val_tgt)
    print(f"      BLEU {scores['bleu']:.1f}  chrF {scores['chrf']:.1f}")
    path = export_translator(translator, os.path.join(out, "saved_model"), languages=("en", "de"))
    print(f"[4/4] Exported the translator to {path}; translations:")
    examples = ["A small dog runs in the park.", "The old woman sees the children.", "Happy girls sing by the river."]
    for text, translation in zip(examples, translator.translate_lines(examples)):
        print(f"      {text}  ->  {translation}")
    print(f"Done in {time.time() - start:.0f} s. Try: keras-transformer translate "
          f"--run {config.output_dir} \"A dog runs.\"  (or --saved-model {path})")


def cmd_average(args):
    from keras_transformer.config import check_run_folder

    if os.path.exists(os.path.join(args.run, "saved_model.pb")):
        raise ValueError(f"{args.run} is an exported SavedModel, which holds one set of weights; average "
                         "reads the epoch checkpoints of a training run: pass the run folder it was "
                         "exported from (--run RUN).")
    check_run_folder(args.run)  # first, and before TensorFlow starts
    output = args.output or os.path.join(args.run, "averaged.keras")
    if not output.endswith(".keras") or not os.path.isdir(os.path.dirname(os.path.abspath(output))):
        raise ValueError(f"--output {output} must be a .keras file in an existing folder.")
    _import_backend_quietly()
    from keras_transformer.checkpoints import average_checkpoints
    from keras_transformer.checkpoints import select_checkpoints
    from keras_transformer.training import load_run

    model = load_run(args.run, which="last")[0]
    paths = select_checkpoints(args.run, last=args.last, best=args.best, monitor=args.monitor)
    average_checkpoints(model, paths)
    model.save(output)
    names = ", ".join(os.path.basename(p).split(".")[0] for p in paths)
    print(f"Averaged {names} into {output}")


def cmd_build_kernels(args):
    from keras_transformer.fast_path import kernels

    built = kernels.build(force=args.force)
    if not built.available:
        raise OSError(f"the fused CPU training kernels are not available: {built.reason}")
    print(f"Fused CPU training kernels: {built.reason}")


class _HelpFormatter(argparse.HelpFormatter):
    """Shows each option's default, where its help does not already say it
    and there is one (not None or False)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if ("default" in text or not action.option_strings
                or action.default in (None, False, argparse.SUPPRESS)):
            return text
        return text + " (default: %(default)s)"


# Lines TensorFlow's C++ runtime prints to stderr while it is imported, before
# its logging is set up (so TF_CPP_MIN_LOG_LEVEL cannot hide them): start-up
# notices about CUDA drivers, CPU instructions and oneDNN that say nothing
# about the command's work.
_START_UP_NOISE = (
    "All log messages before absl::InitializeLog()",
    "cudart_stub.cc",
    "cuda_executor.cc",
    "cuda_diagnostics.cc",
    "failed call to cuInit",
    "Unable to register cu",
    "cpu_feature_guard.cc",
    "To enable the following instructions",
    "oneDNN custom operations are on",
    "oneDNN supports DT_",
    "computation placer already registered",
    "TF-TRT Warning",
    "cuda_platform.cc",
    "precompiled_charsmap is empty",
)


def _is_noise(line):
    return any(noise in line for noise in _START_UP_NOISE)


# The starts of the lines `_START_UP_NOISE` matches: absl log lines ("I0000
# 00:00:..."), SentencePiece's normalizer and TensorFlow's banner lines.
_NOISE_START = re.compile(r"^(?:[IWE]\d{0,4}|normalizer\.cc|WARNING: All log|To enable the)")


@contextlib.contextmanager
def _quiet_native_stderr():
    """Pass what is written to stderr (file descriptor 2, native code
    included) through, as it comes, but the start-up notices of TensorFlow
    and SentencePiece (`_START_UP_NOISE`). A partial line is passed on at
    once (progress bars) unless it may start such a notice."""
    import threading

    sys.stderr.flush()
    original = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def pump():
        pending = b""
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            while True:
                chunk = pipe.read(65536)
                if not chunk:
                    break
                *lines, pending = (pending + chunk).split(b"\n")
                out = [line + b"\n" for line in lines if not _is_noise(line.decode("utf-8", "replace"))]
                if pending and not _NOISE_START.match(pending.decode("utf-8", "replace")):
                    out.append(pending)
                    pending = b""
                if out:
                    os.write(original, b"".join(out))
        if pending and not _is_noise(pending.decode("utf-8", "replace")):
            os.write(original, pending)

    thread = threading.Thread(target=pump, name="stderr-filter", daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(original, 2)  # closes the pipe's last write end: the pump ends
        thread.join(timeout=10)
        os.close(original)


# Commands that check their paths before TensorFlow starts (seconds), and
# then start it themselves.
_CHECKS_BEFORE_IMPORT = ("translate", "evaluate", "export", "average")
# Commands that only decode: they run with the export's serving environment.
_DECODING_COMMANDS = ("translate", "evaluate")


def _import_backend_quietly():
    """Import TensorFlow and Keras, and let TensorFlow look for devices, with
    their start-up notices left out."""
    if "tensorflow" in sys.modules:
        return
    import keras  # noqa: F401
    import tensorflow as tf

    tf.config.list_physical_devices()


def _version():
    from keras_transformer import __version__

    return __version__


def main(argv=None):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = argparse.ArgumentParser(prog="keras-transformer", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True)

    def add_command(name, **kwargs):  # defaults shown in --help, no abbreviated options
        return subparsers.add_parser(
            name, allow_abbrev=False, formatter_class=_HelpFormatter,
            description=kwargs.get("help"), **kwargs,
        )

    p = train_parser = add_command("train", help="train (or resume) a model on aligned text files")
    _add_training_args(p)
    p.set_defaults(func=cmd_train)

    p = add_command("evaluate", help="sacreBLEU and chrF of a run or SavedModel on a test set")
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--run", help="run folder written by train")
    model.add_argument("--saved-model", help="exported SavedModel folder")
    model.add_argument("--ensemble", action="append", metavar="MODEL",
                       help="a run or SavedModel folder, repeated (two or more): decode the models as an ensemble (the mean of their distributions a step; the same tokenizers), in this process, with the search flags below")
    p.add_argument("--src", required=True, action=_Once, metavar="SOURCE",
                   help="source file to translate (plain or .gz)")
    p.add_argument("--ref", required=True, action=_Once, metavar="REFERENCE",
                   help="reference translations, aligned with --src (one reference file)")
    p.add_argument("--limit", type=_positive_int, help="first N sentences only")
    p.add_argument("--no-language-check", action="store_true",
                   help="evaluate even where the files' names end in language codes (train.de.gz) other "
                        "than the model's source and target languages")
    p.add_argument("--output", help="write the translations here")
    _decoding_args(p)
    p.set_defaults(func=cmd_evaluate)

    p = add_command("translate", help="translate TEXT arguments or stdin lines")
    p.add_argument("text", nargs="*",
                   help='sentences to translate, one per argument: quote each ("A dog runs."); '
                        "none: the lines of stdin")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", help="run folder written by train")
    source.add_argument("--saved-model", help="exported SavedModel folder")
    source.add_argument("--ensemble", action="append", metavar="MODEL",
                       help="a run or SavedModel folder, repeated (two or more): decode the models as an ensemble (the mean of their distributions a step; the same tokenizers), in this process, with the search flags below")
    p.add_argument("--plot-attention", metavar="FILE.png",
                   help="draw the cross-attention of the first sentence, one panel per head")
    p.add_argument("--n-best", type=_positive_int, default=1,
                   help="print the N best distinct translations of each sentence, best first (at "
                        "most the beam size; a text the search found under several subword "
                        "segmentations is printed once, so a sentence can have fewer than N): with "
                        "N > 1 each text line starts with the sentence's 0-based line number and a "
                        "tab (default: %(default)s)")
    p.add_argument("--scores", action="store_true",
                   help="print each translation's score (log probability over the length "
                        "penalty) before it, tab-separated")
    p.add_argument("--format", choices=["text", "jsonl"], default="text",
                   help="text lines, or one JSON object per sentence with its translations and "
                        "scores (default: %(default)s)")
    _decoding_args(p)
    p.set_defaults(func=cmd_translate)

    p = add_command("export", help="write a SavedModel that translates strings, or a CTranslate2 model")
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--run", help="run folder written by train")
    model.add_argument("--saved-model", help="exported SavedModel folder (with --format ctranslate2)")
    p.add_argument("--output", required=True, help="folder to write")
    p.add_argument("--format", choices=["saved_model", "ctranslate2"], default="saved_model",
                   help="a TensorFlow SavedModel (TF Serving), or a CTranslate2 model with its "
                        "SentencePiece models (needs the ctranslate2 extra)")
    p.add_argument("--quantization", choices=["int8", "int8_float32", "int16", "float16"],
                   help="CTranslate2 weight type (default: float32)")
    p.add_argument("--weights-dtype", default="float32", choices=["float32", "float16", "int8"],
                   help="float16 halves the SavedModel, int8 (per-channel scales) quarters its "
                        "matrices; computation stays float32")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the SavedModel already in the --output folder")
    _decoding_args(p, batches=False, ensemble=False)
    p.set_defaults(func=cmd_export)

    p = add_command("demo", help="generate data, train, export and translate (no network, CPU)")
    p.add_argument("--output-dir", default="runs/demo",
                   help="where the corpus (data/), the run (run/) and the SavedModel (saved_model/) go")
    p.add_argument("--epochs", type=_positive_int, default=12, help="training epochs")
    p.add_argument("--train-pairs", type=_positive_int, default=6000, help="generated training pairs")
    p.set_defaults(func=cmd_demo)

    p = add_command("average", help="average a run's epoch checkpoints into one model")
    p.add_argument("--run", required=True, help="run folder written by train")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--last", type=_positive_int, help="the latest N epoch checkpoints")
    which.add_argument("--best", type=_positive_int, help="the N best epoch checkpoints by --monitor")
    p.add_argument("--monitor", default="val_loss",
                   choices=["val_loss", "loss", "val_bleu", "val_masked_accuracy", "masked_accuracy"],
                   help="what ranks checkpoints for --best: lowest loss, highest BLEU or accuracy "
                        "(default: %(default)s)")
    p.add_argument("--output", help="the .keras file to write (default: RUN/averaged.keras, the "
                                    "file that --checkpoint averaged reads)")
    p.set_defaults(func=cmd_average)

    p = add_command(
        "build-kernels",
        help="compile the fused CPU training kernels for this machine (cached; train runs it too)",
    )
    p.add_argument("--force", action="store_true",
                   help="compile again, also after a build that failed")
    p.set_defaults(func=cmd_build_kernels)

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["train"]:
        _apply_config_file(train_parser, argv[1:])
    args = parser.parse_args(argv)
    if args.command in _DECODING_COMMANDS and "tensorflow" not in sys.modules:
        # Read by TensorFlow when it is imported (devices.decoding_environment).
        from keras_transformer.devices import DECODING_ENVIRONMENT

        for name, value in DECODING_ENVIRONMENT.items():
            os.environ.setdefault(name, value)
    try:
        with _quiet_native_stderr():
            if args.command not in _CHECKS_BEFORE_IMPORT:
                _import_backend_quietly()
            args.func(args)
    except KeyboardInterrupt as interrupt:
        if args.command != "train":
            parser.exit(130, f"keras-transformer {args.command}: interrupted\n")
        resume = f"Resume with: keras-transformer {shlex.join(argv)}\n"
        if hasattr(interrupt, "signum"):  # callbacks.TrainingStopped: saved after its last step
            parser.exit(128 + interrupt.signum, f"keras-transformer train: {interrupt}. {resume}")
        parser.exit(130, f"keras-transformer train: interrupted; {args.output_dir} keeps every finished "
                         f"epoch. {resume}")
    except (ValueError, OSError, TypeError, FloatingPointError) as error:  # FloatingPointError: TrainingDiverged
        if os.environ.get("KERAS_TRANSFORMER_TRACEBACK"):
            raise
        parser.exit(1, f"keras-transformer {args.command}: error: {error}\n")


if __name__ == "__main__":
    main()
