"""Train a Transformer on aligned text files with `model.fit`, resumably.

A run lives in one folder:

- `config.json`: everything needed to rebuild the model and its inputs;
- `source.model` / `target.model` (+ `.json`): the SentencePiece tokenizers;
- `checkpoints/`: `keras.callbacks.BackupAndRestore` state after every
  epoch (and every `checkpoint_every` steps, and when SIGTERM stops the
  run: `callbacks.PreemptibleBackup`); a run started again on the same
  folder (after an interruption, or with more `epochs`) continues from it;
- `model.keras`: the weights after the latest epoch, `best.keras`: the best
  on validation loss;
- `log.csv`: per-epoch losses and accuracies (and `val_bleu`); the
  learning rate is in the TensorBoard logs.
"""

import contextlib
import csv
import dataclasses
import json
import math
import os
import re
import shutil
import time
import warnings

import keras

from keras_transformer.callbacks import DivergenceGuard
from keras_transformer.callbacks import PreemptibleBackup
from keras_transformer.callbacks import ResumableEarlyStopping
from keras_transformer.callbacks import TensorBoard
from keras_transformer.callbacks import TimeBudget
from keras_transformer.callbacks import ValidationBLEU
from keras_transformer.callbacks import history_state
from keras_transformer.callbacks import time_budget_state
from keras_transformer.checkpoints import EpochCheckpoint
from keras_transformer.checkpoints import epoch_checkpoints
from keras_transformer.checkpoints import epoch_log
from keras_transformer.checkpoints import average_checkpoints
from keras_transformer.checkpoints import select_checkpoints
from keras_transformer.config import TrainingConfig  # noqa: F401 (public here too)
from keras_transformer.config import check_config_values  # noqa: F401
from keras_transformer.config import read_config_file  # noqa: F401
from keras_transformer.config import check_extra_train
from keras_transformer.config import check_run_folder
from keras_transformer.config import read_json_file
from keras_transformer.data.pipeline import check_batching
from keras_transformer.data.pipeline import make_dataset
from keras_transformer.data.text_files import check_files
from keras_transformer.languages import pair_of_files
from keras_transformer.data.text_files import read_lines
from keras_transformer.devices import has_accelerator
from keras_transformer.devices import host_description
from keras_transformer.distribution import data_parallel_scope
from keras_transformer.distribution import initialize as initialize_distribution
from keras_transformer.distribution import num_replicas
from keras_transformer.losses import MaskedSparseCategoricalCrossentropy
from keras_transformer.tokenizers.subword_tokenizer import check_alpha
from keras_transformer.metrics import MaskedAccuracy
from keras_transformer.models.conversion import as_transformer
from keras_transformer.models.conversion import copy_weights
from keras_transformer.models.transformer import TIE_EMBEDDINGS
from keras_transformer.models.transformer import build_transformer
from keras_transformer.models.transformer import check_sizes
from keras_transformer.optimizers import Adam
from keras_transformer import fast_path
from keras_transformer.precision import precision_source
from keras_transformer.precision import resolve_precision
from keras_transformer.schedules import WarmupSchedule
from keras_transformer.tokenizers.subword_tokenizer import SubwordTokenizer
from keras_transformer.tokenizers.trainer import train_subword_tokenizer
from keras_transformer.validation import check_rate


def _tokenizer(path, data, vocab_size, lowercase, user_defined_symbols=None):
    if os.path.exists(path + ".model"):
        return SubwordTokenizer.load(path)
    extra = {"user_defined_symbols": user_defined_symbols} if user_defined_symbols else {}
    tokenizer = train_subword_tokenizer(data, vocab_size, lowercase=lowercase, **extra)
    tokenizer.save(path)
    return tokenizer


def _tokenizers(out, config, src_lines, tgt_lines):
    """The run's source and target tokenizers, trained on first use: two,
    or with `shared_vocab` one trained on both sides and saved as both."""
    source, target = os.path.join(out, "source"), os.path.join(out, "target")
    symbols = config.user_defined_symbols
    if not config.shared_vocab:
        return (_tokenizer(source, src_lines, config.src_vocab_size, config.lowercase, symbols),
                _tokenizer(target, tgt_lines, config.tgt_vocab_size, config.lowercase, symbols))
    if not os.path.exists(target + ".model"):
        shared = _tokenizer(source, src_lines + tgt_lines, config.src_vocab_size, config.lowercase, symbols)
        shared.save(target)
    return SubwordTokenizer.load(source), SubwordTokenizer.load(target)


def load_run(output_dir, which="best"):
    """Model and tokenizers of a run folder.

    Args:
        output_dir: the run folder written by `train`.
        which: `"best"` (lowest validation loss, or highest validation
            BLEU with `checkpoint_metric="val_bleu"`), `"last"`, or
            `"averaged"` (`average_last`, or `keras-transformer average`).

    Returns:
        `(model, source_tokenizer, target_tokenizer, config_dict)`.

    Raises:
        FileNotFoundError: if the folder holds no trained model.
        ValueError: if the model file exists but cannot be loaded.
    """
    check_run_folder(output_dir)
    config = read_json_file(os.path.join(output_dir, "config.json"))
    model_settings = config.get("model", {})
    if "max_length" in model_settings:  # recorded by an earlier version
        model_settings.setdefault("sequence_length", model_settings.pop("max_length"))
    if which not in ("best", "last", "averaged"):
        raise ValueError(f"`which` must be 'best', 'last' or 'averaged'; got {which!r}.")
    names = {"best": ["best.keras", "model.keras"], "last": ["model.keras"],
             "averaged": ["averaged.keras"]}[which]
    for name in names:
        path = os.path.join(output_dir, name)
        if os.path.exists(path):
            try:
                # A run saved by an earlier version holds a plain functional model.
                model = as_transformer(keras.saving.load_model(path, compile=False))
            except (ValueError, OSError) as error:
                # Keras reports a truncated zip as "File not found: filepath=...".
                said = str(error)
                if said.startswith("File not found"):
                    said = "not a complete .keras (zip) file"
                others = [other for other in ("best", "last", "averaged") if other != which]
                raise ValueError(
                    f"{path} exists but cannot be read as a Keras model (truncated or corrupt?): "
                    f"{said}. Use another checkpoint (--checkpoint {' or '.join(others)}), "
                    "`keras-transformer average` to make averaged.keras again, or train again."
                ) from error
            break
    else:
        if which == "averaged":
            raise FileNotFoundError(
                f"{output_dir} has no averaged.keras: make it with `keras-transformer average "
                f"--run {output_dir} --last N` (or train with --average-last N)."
            )
        raise FileNotFoundError(
            f"No trained model in {output_dir} (looked for {names}); "
            "run `keras-transformer train` first."
        )
    src = SubwordTokenizer.load(os.path.join(output_dir, "source"))
    tgt = SubwordTokenizer.load(os.path.join(output_dir, "target"))
    return model, src, tgt, config


class _Timer(keras.callbacks.Callback):
    """Appends each epoch's wall seconds, steps, precision, machine and logs to
    `epochs.jsonl`. An epoch cut short after a save inside it
    (`checkpoint_every`, a stop on SIGTERM) is run again from its first batch
    on resuming, from the saved weights; `carry` writes the seconds and steps
    done up to that save to `checkpoints/partial_epoch.json`, and the epoch
    that completes it counts them, so that the log adds up to the training
    time and the optimizer's steps."""

    def __init__(self, path, partial_path):
        super().__init__()
        self.path, self.partial_path = path, partial_path

    def on_epoch_begin(self, epoch, logs=None):
        self.start, self.steps, self.carried = time.time(), 0, (0.0, 0)
        if os.path.exists(self.partial_path):
            with open(self.partial_path) as f:
                partial = json.load(f)
            if partial.get("epoch") == epoch + 1:
                self.carried = (float(partial["seconds"]), int(partial["steps"]))

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1

    def carry(self, epoch, steps):
        """Records the running epoch's work up to a save made after `steps`
        of its steps (`PreemptibleBackup.on_mid_epoch_save`)."""
        partial = {"epoch": epoch + 1, "seconds": round(self.carried[0] + time.time() - self.start, 1),
                   "steps": self.carried[1] + int(steps)}
        with open(self.partial_path + ".tmp", "w") as f:
            json.dump(partial, f)
        os.replace(self.partial_path + ".tmp", self.partial_path)

    def on_epoch_end(self, epoch, logs=None):
        record = {"epoch": epoch + 1, "seconds": round(self.carried[0] + time.time() - self.start, 1),
                  "steps": self.carried[1] + self.steps,
                  # A resumed run may change precision; config.json keeps the latest.
                  "precision": self.model.logits_layer.dtype_policy.name,
                  "hardware": host_description()}
        record.update({k: float(v) for k, v in (logs or {}).items() if math.isfinite(float(v))})
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if os.path.exists(self.partial_path):
            os.remove(self.partial_path)


def _check_settings(config, model_config):
    """What the model, batching, schedule and loss would refuse, checked
    before the run folder is written (a folder with trained tokenizers
    holds its settings; invalid ones would lock it)."""
    sizes = {key: model_config[key] for key in ("num_layers", "d_model", "num_heads", "dff")}
    if "num_decoder_layers" in model_config:
        sizes["num_decoder_layers"] = model_config["num_decoder_layers"]
    check_sizes(src_vocab_size=config.src_vocab_size, tgt_vocab_size=config.tgt_vocab_size, **sizes)
    check_batching(config.sequence_length, config.tokens_per_batch or None, config.batch_size)
    WarmupSchedule(model_config["d_model"], config.warmup_steps, scale=config.lr_scale)
    MaskedSparseCategoricalCrossentropy(label_smoothing=config.label_smoothing)
    if config.subword_alpha is not None:
        check_alpha(config.subword_alpha, "subword_alpha")
    epochs = config.bidirectional_epochs
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"`bidirectional_epochs` must be an integer of at least 0; got {epochs!r}.")
    cooldown = config.cooldown_epochs
    if isinstance(cooldown, bool) or not isinstance(cooldown, int) or not 0 <= cooldown <= config.epochs:
        raise ValueError(f"`cooldown_epochs` must be an integer from 0 to epochs={config.epochs}; got {cooldown!r}.")
    if epochs and not config.shared_vocab:
        raise ValueError(
            f"bidirectional_epochs={epochs} trains target-to-source pairs too, which needs one "
            "vocabulary for both sides: add --shared-vocab (or pass --bidirectional-epochs 0)."
        )
    for name in ("dropout_rate", "attention_dropout_rate", "activation_dropout_rate"):
        if model_config.get(name) is not None:
            check_rate(model_config[name], name)
    if config.tie_embeddings not in TIE_EMBEDDINGS:
        raise ValueError(f"`tie_embeddings` must be one of {TIE_EMBEDDINGS}; got {config.tie_embeddings!r}.")
    if config.tie_embeddings == "all" and not config.shared_vocab:
        raise ValueError(
            "tie_embeddings='all' shares the source and target embeddings, which needs one "
            "vocabulary: add --shared-vocab (or tie only the target side: --tie-embeddings target)."
        )
    upper = [symbol for symbol in config.user_defined_symbols or [] if symbol != symbol.lower()]
    if config.lowercase and upper:
        raise ValueError(
            f"--lowercase lowercases the text before tokenizing, so the user-defined symbol(s) "
            f"{upper} would never match it; write them in lower case ({[s.lower() for s in upper]}), "
            "in the data too."
        )
    if config.shared_vocab and config.src_vocab_size != config.tgt_vocab_size:
        raise ValueError(
            f"--shared-vocab trains one vocabulary, but src_vocab_size={config.src_vocab_size} and "
            f"tgt_vocab_size={config.tgt_vocab_size} differ; give them one value."
        )
    if config.bleu_every and keras.backend.backend() != "tensorflow":
        raise ValueError(
            "--bleu-every translates with the Translator, which needs the tensorflow backend; "
            f"this process runs {keras.backend.backend()!r}. Drop --bleu-every, or train on tensorflow."
        )
    for name in ("keep_checkpoints", "average_last", "early_stopping_patience", "checkpoint_every",
                 "max_train_pairs"):
        value = getattr(config, name)
        if value is not None and (isinstance(value, bool) or int(value) < 1):
            raise ValueError(f"`{name}` must be a positive integer; got {value!r}.")
    if config.time_budget is not None:
        TimeBudget(None, config.time_budget)  # refuses a budget that is not a positive number
    if config.average_last and config.average_last > config.epochs:
        raise ValueError(
            f"average_last={config.average_last} averages the last {config.average_last} epochs, but "
            f"epochs={config.epochs} trains {config.epochs}; lower --average-last or raise --epochs."
        )
    if config.average_last and config.average_last > config.keep_checkpoints:
        raise ValueError(
            f"average_last={config.average_last} needs that many epoch checkpoints, but "
            f"keep_checkpoints={config.keep_checkpoints} keeps fewer; raise --keep-checkpoints."
        )
    if config.bleu_every < 0:
        raise ValueError(f"`bleu_every` must be 0 (off) or positive; got {config.bleu_every!r}.")
    if config.checkpoint_metric not in ("val_loss", "val_bleu"):
        raise ValueError(f"`checkpoint_metric` must be 'val_loss' or 'val_bleu'; got {config.checkpoint_metric!r}.")
    needs_validation = {"bleu_every": config.bleu_every, "early_stopping_patience": config.early_stopping_patience}
    for name, value in needs_validation.items():
        if value and not config.val_src:
            raise ValueError(f"`{name}` needs validation files (--val-src and --val-tgt).")
    if config.checkpoint_metric == "val_bleu" and not config.bleu_every:
        raise ValueError("checkpoint_metric='val_bleu' needs the BLEU computed: set --bleu-every N.")


def _best_so_far(out, monitor):
    """The best (lowest; highest for a BLEU) `monitor` value of the epochs
    logged in `epochs.jsonl`,
    if `best.keras` exists (`_Timer` logs an epoch after `best.keras` was
    saved for it); None for a new run."""
    path = os.path.join(out, "epochs.jsonl")
    if not (os.path.exists(path) and os.path.exists(os.path.join(out, "best.keras"))):
        return None
    with open(path) as f:
        values = [json.loads(line).get(monitor) for line in f if line.strip()]
    values = [value for value in values if value is not None and math.isfinite(value)]
    if not values:
        return None
    return max(values) if monitor.endswith("bleu") else min(values)


# What a run folder cannot change between runs: the tokenizers and the
# shapes of the weights. Epochs, learning rate, batching and the rest may.
_FIXED_TRAINING = ("src_vocab_size", "tgt_vocab_size", "lowercase", "shared_vocab", "user_defined_symbols")
_FIXED_MODEL = ("num_layers", "num_decoder_layers", "d_model", "num_heads", "dff", "sequence_length",
                "norm_first", "activation", "tie_embeddings")
# Values of settings that runs written before they existed had.
_FIXED_DEFAULTS = {"shared_vocab": False, "tie_embeddings": "none", "norm_first": False,
                   "user_defined_symbols": None}
# Settings that runs written before a rename recorded under their old names.
_OLD_NAMES = {"sequence_length": "max_length"}


# Files that make a run folder a run to continue: tokenizers and weights.
# A folder with only `config.json` (a run that failed before training its
# tokenizers, e.g. on a mistyped file name) starts afresh with new settings.
_TRAINED_FILES = ("source.model", "target.model", "model.keras", "best.keras", "checkpoints")


def _check_resumable(out, config, model_config):
    """Refuse to resume a run folder with settings its files do not fit;
    the list of the other settings that differ from its `config.json`
    (`"name old -> new"`), empty for a new run."""
    path = os.path.join(out, "config.json")
    if not os.path.exists(path):
        return []
    if not any(os.path.exists(os.path.join(out, name)) for name in _TRAINED_FILES):
        return []
    saved = read_json_file(path)
    changes = []
    for key in _FIXED_TRAINING:
        before, now = saved.get("training", {}).get(key, _FIXED_DEFAULTS.get(key)), getattr(config, key)
        if before != now:
            changes.append(f"{key} {before!r} -> {now!r}")
    # The language pair of the training files (their names' codes): swapped
    # files would train the run's weights and tokenizers the other way.
    recorded = saved.get("training", {})
    pair_before = pair_of_files(recorded.get("train_src") or "", recorded.get("train_tgt") or "")
    pair_now = pair_of_files(config.train_src, config.train_tgt)
    if pair_before and pair_now and pair_before != pair_now:
        changes.append("languages {}->{} -> {}->{}".format(*pair_before, *pair_now))
    for key in _FIXED_MODEL:
        saved_model = saved.get("model", {})
        before = saved_model.get(key, saved_model.get(_OLD_NAMES.get(key), _FIXED_DEFAULTS.get(key)))
        now = model_config.get(key)
        if before != now:
            changes.append(f"{key} {before!r} -> {now!r}")
    if changes:
        raise ValueError(
            f"{out} holds a run trained with other settings ({'; '.join(changes)}): "
            "its tokenizers and weights do not fit them. Continue it with its own "
            "settings (see its config.json), or pass a new --output-dir."
        )
    # The rest may change on resume (more epochs, another dropout): say so.
    return [
        f"{key} {saved['training'][key]!r} -> {value!r}"
        for key, value in dataclasses.asdict(config).items()
        if key in saved.get("training", {}) and saved["training"][key] != value
    ]


def _write_run_config(out, config, model_config, src_tok=None, tgt_tok=None):
    model = dict(model_config)
    if src_tok is not None:
        model.update(src_vocab_size=src_tok.vocab_size, tgt_vocab_size=tgt_tok.vocab_size)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"training": dataclasses.asdict(config), "model": model}, f, indent=2)


def _aligned(src, tgt, what):
    """The lines of two files that must be aligned line by line (`what`
    names them in the error)."""
    src_lines, tgt_lines = read_lines(src), read_lines(tgt)
    if len(src_lines) != len(tgt_lines):
        raise ValueError(
            f"{what}: {src} has {len(src_lines)} lines but {tgt} has {len(tgt_lines)}; the files "
            "must be aligned line by line."
        )
    return src_lines, tgt_lines


def _blank_pairs(src_lines, tgt_lines):
    """How many pairs have a blank side (`make_dataset` leaves them out)."""
    return sum(1 for s, t in zip(src_lines, tgt_lines) if not (s.strip() and t.strip()))


def _read_training_files(config):
    """Every file a run reads, read and checked before anything is written:
    `(src_lines, tgt_lines, extra, val_lines)`: the training lines (cut to
    `max_train_pairs`), `extra_train`'s `(src, tgt)` lines in a list, and
    the validation `(src, tgt)` lines or None.

    Raises:
        ValueError: naming the files, for a pair of files that are not
            aligned line by line, or training or validation files without
            a pair whose sides are both non-blank.
    """
    src_lines, tgt_lines = _aligned(config.train_src, config.train_tgt, "training files")
    if config.max_train_pairs:
        src_lines = src_lines[: config.max_train_pairs]
        tgt_lines = tgt_lines[: config.max_train_pairs]
    if _blank_pairs(src_lines, tgt_lines) == len(src_lines):
        raise ValueError(
            f"No sentence pairs in {config.train_src} / {config.train_tgt}: the "
            "files are empty or every pair has a blank side."
        )
    extra = [_aligned(extra_src, extra_tgt, "extra_train")
             for extra_src, extra_tgt in check_extra_train(config.extra_train)]
    val_lines = None
    if config.val_src:
        val_lines = _aligned(config.val_src, config.val_tgt, "validation files")
        if _blank_pairs(*val_lines) == len(val_lines[0]):
            raise ValueError(
                f"No sentence pairs in the validation files {config.val_src} / {config.val_tgt}: "
                "they are empty or every pair has a blank side."
            )
    return src_lines, tgt_lines, extra, val_lines


def _read_and_tokenize(out, config, files):
    """The training lines of `files` (`_read_training_files`), with
    `extra_train`'s pairs after them, and the run's tokenizers (trained on `train_src` /
    `train_tgt`, or loaded when the folder has them)."""
    src_lines, tgt_lines, extra, _ = files
    src_tok, tgt_tok = _tokenizers(out, config, src_lines, tgt_lines)
    for extra_src_lines, extra_tgt_lines in extra:
        src_lines, tgt_lines = src_lines + extra_src_lines, tgt_lines + extra_tgt_lines
    return src_lines, tgt_lines, src_tok, tgt_tok


def _resuming(out, epoch, fell_back, verbose):
    """Where `fit` goes on from (`PreemptibleBackup.on_restore`): says so,
    and drops the `log.csv` rows of the epochs it will train again (their
    state was lost: a checkpoint that could not be read), so that each
    epoch keeps one row. `epochs.jsonl` keeps every record, the last of an
    epoch counting (`epoch_log`), and with them the seconds spent."""
    if fell_back:
        print(f"Warning: the latest training state in {os.path.join(out, 'checkpoints')} could not be "
              f"read (a save cut off?); going on from the one saved before it.", flush=True)
    if verbose or fell_back:
        print(f"Resuming {out} after epoch {epoch} (its checkpoints/ folder)", flush=True)
    path = os.path.join(out, "log.csv")
    if os.path.exists(path):
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        kept = rows[:1] + [row for row in rows[1:] if row and int(row[0]) < epoch]
        if len(kept) < len(rows):
            with open(path + ".tmp", "w", newline="") as f:
                csv.writer(f).writerows(kept)
            os.replace(path + ".tmp", path)


def _epoch_steps(config, train_ds, both_directions):
    """The batches of each epoch up to `config.epochs`, BiT's two-way
    epochs first; None when a dataset does not declare its batches."""
    bidirectional = min(config.bidirectional_epochs, config.epochs)
    one_way = int(train_ds.cardinality())
    two_way = int(both_directions().cardinality()) if bidirectional else 1
    if one_way < 1 or two_way < 1:
        return None
    return [two_way] * bidirectional + [one_way] * (config.epochs - bidirectional)


def _cooldown_steps(config, train_ds, both_directions):
    """`WarmupSchedule`'s `total_steps` and `cooldown_steps` for
    `config.cooldown_epochs` (empty without one): the batches of every
    epoch up to `config.epochs`, BiT's two-way epochs first."""
    if not config.cooldown_epochs:
        return {}
    steps = _epoch_steps(config, train_ds, both_directions)
    if steps is None:
        raise ValueError("cooldown_epochs counts the steps of the run from the batches of an epoch, which "
                         "this dataset does not declare; pass --cooldown-epochs 0.")
    return {"total_steps": sum(steps), "cooldown_steps": sum(steps[-config.cooldown_epochs:])}


def _warn_short_warmup(config, train_ds, both_directions):
    """Warns, before the first epoch, when the run is too short to finish
    the learning-rate warm-up (the rate would still be rising at the end)."""
    one_way = int(train_ds.cardinality())
    if one_way < 1 or config.warmup_steps <= one_way * config.epochs:
        return  # BiT's two-way epochs have more batches: no need to build them
    steps = _epoch_steps(config, train_ds, both_directions)
    if steps is None or config.warmup_steps <= sum(steps):
        return
    if len(set(steps)) == 1:
        counted = f"{steps[0]} steps an epoch x {config.epochs} epochs"
    else:
        two_way = min(config.bidirectional_epochs, config.epochs)
        counted = (f"{steps[0]} steps an epoch x {two_way} epoch{'s' if two_way > 1 else ''} in both "
                   f"directions + {steps[-1]} x {config.epochs - two_way}")
    print(f"Warning: warmup_steps={config.warmup_steps} is more than the whole run "
          f"({counted} = {sum(steps)}): the learning "
          "rate never reaches its peak and the model may learn little. Lower "
          "--warmup-steps or train more epochs.", flush=True)


def _fast_path(config):
    """Builds the fused CPU kernels where this run's training steps can use
    them, and says in one line which path the steps take and, when it is a
    slower one, why (`fast_path.describe`)."""
    return fast_path.describe(jit_compile=config.jit_compile)


def train(config, verbose=1):
    """Train (or resume) a run described by a `TrainingConfig`.

    Returns:
        `(model, source_tokenizer, target_tokenizer)` after the last epoch.

    Raises:
        ValueError: for an unknown preset, only one validation file,
            `epochs` or `batch_size` below 1, sizes, batching, warmup or
            label smoothing that the model, `make_dataset`, the schedule or
            the loss would refuse, misaligned or empty files,
            or a run folder whose tokenizers or weights do not fit the
            settings (checked before anything is written), or that another
            process is training (it holds the folder's lock).
        FileNotFoundError: if a training or validation file is missing.
        keras_transformer.callbacks.TrainingStopped: the process got SIGTERM;
            the training state after the last finished step is saved, and
            `train` on the same folder resumes it.
    """
    # Before any backend op or device query (`distribution.initialize`).
    initialize_distribution(config.distribution)
    keras.utils.set_random_seed(config.seed)
    out = config.output_dir
    model_config = config.model_config()  # an unknown preset fails here
    model_config["dtype"] = resolve_precision(config.precision, model_config["d_model"])
    if bool(config.val_src) != bool(config.val_tgt):
        raise ValueError(
            "Pass both validation files (--val-src and --val-tgt) or neither; "
            f"got val_src={config.val_src!r}, val_tgt={config.val_tgt!r}."
        )
    for name in ("epochs", "batch_size"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{name}` must be a positive integer; got {value!r}.")
    _check_settings(config, model_config)
    extra_train = check_extra_train(config.extra_train)
    check_files(config.train_src, config.train_tgt, config.val_src or None, config.val_tgt or None,
                *(path for pair in extra_train for path in pair))
    files = _read_training_files(config)  # alignment and blank files, before anything is written
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"--output-dir {out} is a file; pass a new or empty folder for the run.")
    if os.path.isdir(out) and os.listdir(out) and not os.path.exists(os.path.join(out, "config.json")):
        raise ValueError(
            f"--output-dir {out} is a folder with other files and no training run in it "
            "(no config.json): train would write among them. Pass a new or empty folder."
        )
    created = not os.path.exists(out)
    os.makedirs(out, exist_ok=True)
    # The hosts of a multi-worker run may share one folder.
    with _run_folder_lock(out, enabled=config.distribution != "multi_worker"):
        return _train_in_folder(config, model_config, files, out, created, verbose)


@contextlib.contextmanager
def _run_folder_lock(out, enabled=True):
    """Holds an exclusive lock on the run folder `out` (`flock` on the
    folder itself, released when training ends or the process dies): a
    second `train` on the same folder would interleave its epochs, logs and
    checkpoints with the first's. Not on systems without `fcntl`, nor when
    not `enabled`.

    Raises:
        ValueError: if another process holds it.
    """
    try:
        import fcntl
    except ImportError:
        fcntl = None
    if fcntl is None or not enabled:
        yield
        return
    descriptor = os.open(out, os.O_RDONLY)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(
                f"{out} is being trained by another process (it holds the run folder's lock): wait "
                "for it to end, or train into another --output-dir."
            ) from None
        yield
    finally:
        os.close(descriptor)


def _train_in_folder(config, model_config, files, out, created, verbose):
    """`train`'s work once its files are read and its run folder `out` is
    made (`created` by this call) and locked."""
    try:
        changed = _check_resumable(out, config, model_config)
        # Written before the tokenizers are trained, so that a run cut short
        # still records what its tokenizers were asked for.
        _write_run_config(out, config, model_config)
        src_lines, tgt_lines, src_tok, tgt_tok = _read_and_tokenize(out, config, files)
    except BaseException:
        if created:  # a start that fails leaves no folder behind
            shutil.rmtree(out, ignore_errors=True)
        raise

    _write_run_config(out, config, model_config, src_tok, tgt_tok)

    training_path = _fast_path(config)
    if verbose:
        val_lines = files[3]

        def counted(lines, kind):
            blank = _blank_pairs(*lines)
            return (f"{len(lines[0]) - blank} {kind} pairs"
                    + (f" ({blank} more with a blank side left out)" if blank else ""))

        print(f"Read {counted((src_lines, tgt_lines), 'training')}"
              + (f" and {counted(val_lines, 'validation')}" if val_lines else "")
              + f"; vocabularies: source {src_tok.vocab_size} pieces (asked {config.src_vocab_size}), "
              f"target {tgt_tok.vocab_size} (asked {config.tgt_vocab_size})"
              + (", one shared vocabulary" if config.shared_vocab else ""))
        for extra_src, extra_tgt in check_extra_train(config.extra_train):
            print(f"Extra training pairs: {extra_src} / {extra_tgt}")
        if changed:
            print(f"Settings changed since the run's config.json: {'; '.join(changed)}")
        if config.subword_alpha is not None:
            print(f"Subword regularization: each epoch samples the training pairs' segmentations "
                  f"(alpha {config.subword_alpha:g}); validation keeps the fixed one")
        if config.bidirectional_epochs:
            print(f"Bidirectional training (BiT): epochs 1-{config.bidirectional_epochs} train on the pairs "
                  f"in both directions, the rest source to target")
        source = precision_source(config.precision)
        print(f"Training precision: {model_config['dtype']}"
              + ("" if source == "given" else f" ({source})"))
        print(f"Training path: {training_path}")
    replicas = num_replicas(config.distribution)
    # Every batch is topped up with all-padding rows (which the masked loss
    # and accuracy ignore) to split evenly over the devices: jax shards
    # evenly only, and on tensorflow Keras builds the model from the first
    # batch averaged over the replicas (`_maybe_symbolic_build`), which fails
    # on unequal shards (37 rows as 19 + 18).
    batch_multiple = replicas

    # Compiled steps (jax, or XLA on tensorflow) compile once per batch
    # shape: batches padded to their bucket's upper length give one shape
    # per bucket instead of one per longest sentence (on jax, a second epoch
    # of 600 synthetic pairs took 8.5 s without, 0.4 s with). Batches of a
    # fixed number of sentences (`tokens_per_batch` 0) are then grouped by
    # length into the same buckets too, or each longest sentence would
    # compile a step of its own.
    compiled = _step_is_compiled(config)

    def dataset(src, tgt, shuffle, subword_alpha=None):
        return make_dataset(
            src, tgt, src_tok, tgt_tok,
            sequence_length=config.sequence_length,
            tokens_per_batch=config.tokens_per_batch or None,
            batch_size=config.batch_size,
            shuffle=shuffle,
            seed=config.seed,
            batch_multiple=batch_multiple,
            bucket_boundaries="auto" if compiled else None,
            pad_to_bucket_boundary=compiled,
            subword_alpha=subword_alpha,
        )

    train_ds = dataset(src_lines, tgt_lines, True, config.subword_alpha)
    val_ds = dataset(config.val_src, config.val_tgt, False) if config.val_src else None

    two_way = []

    def both_directions():
        # BiT (Ding et al., 2021): each pair also as target -> source. The
        # shared vocabulary tokenizes either side. Built once, when needed.
        if not two_way:
            # A tag that marks synthetic sources (`user_defined_symbols`)
            # marks the input, never the output: reversed, it is dropped.
            reversed_tgt = untagged(src_lines, config.user_defined_symbols)
            two_way.append(dataset(src_lines + tgt_lines, tgt_lines + reversed_tgt, True, config.subword_alpha))
        return two_way[0]

    with data_parallel_scope(config.distribution):
        return _build_and_fit(config, model_config, src_tok, tgt_tok, train_ds, val_ds, out, verbose,
                              both_directions=both_directions)


def untagged(lines, symbols):
    """`lines` without the user-defined `symbols` they start with (and the
    spaces after them): the text of a tagged source as a target.

    >>> untagged(["<BT> A dog runs.", "A <BT> dog."], ["<BT>"])
    ['A dog runs.', 'A <BT> dog.']
    """
    if not symbols:
        return lines
    leading = re.compile(r"^\s*(?:(?:" + "|".join(re.escape(s) for s in symbols) + r")\s*)+")
    return [leading.sub("", line) for line in lines]


def _step_is_compiled(config):
    """Whether the train step runs compiled (XLA on jax or tensorflow):
    `jit_compile="auto"` is resolved as Keras resolves it
    (`Trainer._resolve_auto_jit_compile`: XLA on tensorflow with an
    accelerator and no `tf.distribute` strategy; not on a CPU, never on
    torch)."""
    jit_compile = _train_step_jit_compile(config)
    if jit_compile == "auto":
        return (keras.backend.backend() == "tensorflow" and config.distribution is None
                and has_accelerator())
    return bool(jit_compile)


def _train_step_jit_compile(config):
    """`jit_compile` for the train step: `config.jit_compile`, except on jax,
    whose compiled path is XLA, where it is always True. Keras runs a jax
    step with `jit_compile=False` op by op, eagerly: many times slower, and
    under `distribution="data_parallel"` each op's all-reduce over the
    devices can stall in XLA's CPU rendezvous."""
    if keras.backend.backend() == "jax":
        return True
    return config.jit_compile


def _build_and_fit(config, model_config, src_tok, tgt_tok, train_ds, val_ds, out, verbose,
                   both_directions=None):
    model = build_transformer(src_tok.vocab_size, tgt_tok.vocab_size, **model_config)
    if verbose:
        print(f"Model: {model.count_params():,} parameters (preset {config.preset}, "
              f"tie_embeddings={config.tie_embeddings})")
    cooldown = _cooldown_steps(config, train_ds, both_directions)
    schedule = WarmupSchedule(model_config["d_model"], config.warmup_steps, scale=config.lr_scale, **cooldown)
    if verbose and cooldown:
        print(f"Learning-rate cooldown: linear to 0 over the last {config.cooldown_epochs} epochs, steps "
              f"{cooldown['total_steps'] - cooldown['cooldown_steps'] + 1}-{cooldown['total_steps']}")
    model.compile(
        optimizer=Adam(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9),
        loss=MaskedSparseCategoricalCrossentropy(label_smoothing=config.label_smoothing),
        metrics=[MaskedAccuracy()],
        jit_compile=_train_step_jit_compile(config),
    )
    if fast_path.applies(model, jit_compile=model.jit_compile) is None:
        fast_path.attach(model)  # the TensorFlow training step (`keras_transformer.fast_path`)
    monitor = "val_loss" if val_ds is not None else "loss"
    best_metric = config.checkpoint_metric if val_ds is not None else "loss"
    timer = _Timer(os.path.join(out, "epochs.jsonl"), os.path.join(out, "checkpoints", "partial_epoch.json"))

    def stage_callbacks():
        """The callbacks of one `fit`; each reads its state from the run
        folder, so that a second `fit` (BiT's second stage) goes on as a
        resumed run does."""
        # First: a diverged step or epoch stops before any callback saves it.
        callbacks = [DivergenceGuard()]
        if config.bleu_every:  # before the callbacks that log and save by val_bleu
            callbacks.append(ValidationBLEU(
                read_lines(config.val_src), read_lines(config.val_tgt), src_tok, tgt_tok,
                every=config.bleu_every,
            ))
        # Kept after the run ends, so `train` with more epochs continues too;
        # double_checkpoint keeps the previous backup if a save is cut off.
        backup = PreemptibleBackup(
            os.path.join(out, "checkpoints"),
            save_freq=config.checkpoint_every or "epoch",
            double_checkpoint=True,
            delete_checkpoint=False,
            on_mid_epoch_save=timer.carry,
            on_restore=lambda epoch, fell_back: _resuming(out, epoch, fell_back, verbose),
        )
        callbacks += [
            backup,
            keras.callbacks.ModelCheckpoint(os.path.join(out, "model.keras")),
            keras.callbacks.ModelCheckpoint(
                os.path.join(out, "best.keras"), monitor=best_metric, save_best_only=True,
                mode="max" if best_metric == "val_bleu" else "min",
                # A resumed run must beat the best it already saved; Keras would
                # otherwise let the first epoch after a restart replace it.
                initial_value_threshold=_best_so_far(out, best_metric),
            ),
            EpochCheckpoint(out, keep=config.keep_checkpoints, monitor=best_metric),
            keras.callbacks.CSVLogger(os.path.join(out, "log.csv"), append=True),
            *([TensorBoard(os.path.join(out, "tensorboard"))] if config.tensorboard else []),
            timer,
        ]
        if config.early_stopping_patience:
            callbacks.append(ResumableEarlyStopping(out, monitor, config.early_stopping_patience))
        if config.time_budget:
            callbacks.append(TimeBudget(out, config.time_budget))
        return callbacks, backup

    done = max(epoch_log(out), default=0) if os.path.isdir(os.path.join(out, "checkpoints")) else 0
    if done >= config.epochs:
        if verbose:
            print(f"{out} has trained {done} epochs and --epochs is {config.epochs}; nothing more to "
                  f"train (pass a larger --epochs to go on).")
        return _finish(config, model, out, src_tok, tgt_tok, verbose, fit=False)
    if config.early_stopping_patience:
        _, best, stop = history_state(out, monitor, config.early_stopping_patience)
        if stop:
            if verbose:
                print(f"Early stopping: {monitor} has not improved on {best:.4f} for "
                      f"{config.early_stopping_patience} epochs; nothing more to train.")
            return _finish(config, model, out, src_tok, tgt_tok, verbose, fit=False)
    if config.time_budget:
        used, next_epoch, stop = time_budget_state(out, config.time_budget)
        if stop:
            if verbose:
                print(f"Time budget: {used:.0f} s trained of {config.time_budget:g} s, and an epoch "
                      f"takes about {next_epoch:.0f} s; nothing more to train.")
            return _finish(config, model, out, src_tok, tgt_tok, verbose, fit=False)
    # `make_dataset` declares the batches of an epoch (unknown: negative).
    _warn_short_warmup(config, train_ds, both_directions)
    # (last epoch, dataset) of each `fit`: BiT's epochs in both directions first.
    bidirectional = min(config.bidirectional_epochs, config.epochs)
    stages = [(bidirectional, both_directions)] if done < bidirectional else []
    if config.epochs > bidirectional:
        stages.append((config.epochs, lambda: train_ds))
    for last_epoch, stage_data in stages:
        callbacks, backup = stage_callbacks()
        with warnings.catch_warnings():
            # The dataset is shuffled and its length unknown until the first
            # pass; Keras warns about both on every epoch.
            warnings.filterwarnings("ignore", message=".*shuffle=True. was passed")
            warnings.filterwarnings("ignore", message="Your input ran out of data")
            try:
                model.fit(
                    stage_data(), validation_data=val_ds, epochs=last_epoch,
                    callbacks=callbacks, verbose=verbose, shuffle=False,
                )
            finally:
                backup.release()
        if model.stop_training:  # early stopping or the time budget
            break
    stopper = next((c for c in callbacks if isinstance(c, ResumableEarlyStopping)), None)
    if verbose and stopper is not None and stopper.stopped_epoch:
        print(f"Stopped early after epoch {stopper.stopped_epoch + 1}: {monitor} has not improved on "
              f"{stopper.best:.4f} for {config.early_stopping_patience} epochs.")
    budget = next((c for c in callbacks if isinstance(c, TimeBudget)), None)
    if verbose and budget is not None and budget.stopped_epoch is not None:
        used, next_epoch, _ = time_budget_state(out, config.time_budget)
        print(f"Stopped after epoch {budget.stopped_epoch + 1} for the time budget: {used:.0f} s trained "
              f"of {config.time_budget:g} s, and the next epoch would take about {next_epoch:.0f} s.")
    return _finish(config, model, out, src_tok, tgt_tok, verbose)


def _finish(config, model, out, src_tok, tgt_tok, verbose, fit=True):
    """After training: `averaged.keras` from the last `average_last` epoch
    checkpoints, where asked for. Returns `(model, src_tok, tgt_tok)`."""
    if not fit:  # the weights alone (the optimizer of model.keras is not this one's)
        copy_weights(keras.saving.load_model(os.path.join(out, "model.keras"), compile=False), model)
    kept = len(epoch_checkpoints(out)) if config.average_last else 0
    if kept:
        if kept < config.average_last:  # early stopping or the time budget ended the run sooner
            warnings.warn(f"average_last={config.average_last}, but the run ended with {kept} epoch "
                          f"checkpoint(s) kept: averaged those {kept}.", stacklevel=2)
        paths = select_checkpoints(out, last=min(config.average_last, kept))
        trained = model.get_weights()
        average_checkpoints(model, paths)
        model.save(os.path.join(out, "averaged.keras"))
        model.set_weights(trained)
        if verbose:
            names = ", ".join(os.path.basename(p).split(".")[0] for p in paths)
            print(f"Averaged {names} into {os.path.join(out, 'averaged.keras')}")
    return model, src_tok, tgt_tok
