"""Epoch checkpoints of a run and their average.

Averaging the weights of the last few checkpoints gives a model that
usually translates better than any one of them: Vaswani et al. (2017),
section 6.1, average the last 5 (base) or 20 (big) checkpoints.

A run folder written by `train` keeps each epoch's weights in
`epochs/epoch-NNN.weights.h5` (the latest `keep` epochs and the `keep` best
by the monitored metric); `select_checkpoints` picks some of them and
`average_checkpoints` writes their mean into a model.
"""

import json
import math
import os
import re
import warnings

import keras
import numpy as np

EPOCHS_DIR = "epochs"
_NAME = re.compile(r"^epoch-(\d+)\.weights\.h5$")


def epoch_checkpoints(run_dir):
    """`{epoch: path}` of the epoch checkpoints in `run_dir`, epochs from 1."""
    folder = os.path.join(run_dir, EPOCHS_DIR)
    if not os.path.isdir(folder):
        return {}
    found = {}
    for name in os.listdir(folder):
        match = _NAME.match(name)
        if match:
            found[int(match.group(1))] = os.path.join(folder, name)
    return dict(sorted(found.items()))


def epoch_log(run_dir):
    """`{epoch: record}` from the run's `epochs.jsonl` (the last record of
    an epoch that a resumed run logged twice)."""
    path = os.path.join(run_dir, "epochs.jsonl")
    records = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    record = json.loads(line)
                    records[int(record["epoch"])] = record
    return records


def _higher_is_better(monitor):
    """Keras's `mode="auto"` rule (`ModelCheckpoint`, `EarlyStopping`),
    with BLEU and chrF: an accuracy, a BLEU or a chrF ranks highest first;
    anything else (a loss, a perplexity) lowest first."""
    name = str(monitor).lower()
    return any(key in name for key in ("acc", "bleu", "chrf", "fmeasure"))


def _number(value):
    """`value` as a float, or None for what is not a number (such as the
    `hardware` text that `epochs.jsonl` records)."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _ranked(log, epochs, monitor):
    """`epochs` with a finite `monitor` in `log` (`epoch_log`), best first
    (lowest loss, highest BLEU or accuracy; the later epoch first on a tie)."""
    sign = -1.0 if _higher_is_better(monitor) else 1.0
    scored = []
    for e in epochs:
        value = _number(log.get(e, {}).get(monitor))
        if value is not None and math.isfinite(value):
            scored.append((sign * value, -e))
    return [-e for _, e in sorted(scored)]


def select_checkpoints(run_dir, last=None, best=None, monitor="val_loss"):
    """Paths of the `last` latest epoch checkpoints, or of the `best` ones
    by `monitor` in `epochs.jsonl`, in epoch order.

    Args:
        run_dir: a run folder written by `train`.
        last: int, the latest N epoch checkpoints kept (a `UserWarning`
            when epochs between them were not kept); or
        best: int, the N epochs with the lowest `monitor` (the highest for
            an accuracy, a BLEU or a chrF: Keras's `mode="auto"` rule).
        monitor: str, a number in `epochs.jsonl` (`"val_loss"`, `"loss"`,
            `"val_bleu"`, `"val_masked_accuracy"`, ...).

    Returns:
        list of str paths.

    Raises:
        ValueError: unless exactly one of `last` and `best` is a positive
            int, when no checkpoint has a logged number for `monitor`, or
            when the run has fewer such checkpoints than asked for.
    """
    if (last is None) == (best is None) or int(last or best) < 1:
        raise ValueError(f"Pass one positive count, `last` or `best`; got last={last!r}, best={best!r}.")
    available = epoch_checkpoints(run_dir)
    if last is not None:
        chosen = list(available)[-int(last):]
        wanted, what = int(last), "latest"
        missing = sorted(set(range(chosen[0], chosen[-1] + 1)) - set(chosen)) if chosen else []
        if len(chosen) == wanted and missing:
            warnings.warn(
                f"The {wanted} latest epoch checkpoints kept in {run_dir} are epochs {chosen}: the "
                f"checkpoints of epoch(s) {missing} were not kept (--keep-checkpoints keeps the latest "
                "and the best), so these are not the last consecutive epochs.",
                stacklevel=2,
            )
    else:
        log = epoch_log(run_dir)
        scored = _ranked(log, available, monitor)
        if available and not scored:
            logged = sorted({key for record in log.values() for key, value in record.items()
                             if _number(value) is not None} - {"epoch", "seconds", "steps"})
            raise ValueError(
                f"None of the epoch checkpoints in {run_dir} has a number for `{monitor}` in epochs.jsonl"
                + (" (val_bleu is logged only by runs trained with --bleu-every)" if monitor == "val_bleu" else "")
                + f"; it logged {logged}. Choose by one of those with --monitor, or use --last."
            )
        chosen = scored[: int(best)]
        wanted, what = int(best), f"best by {monitor}"
    if len(chosen) < wanted:
        raise ValueError(
            f"{run_dir} has {len(chosen)} epoch checkpoints ({what}), fewer than the "
            f"{wanted} asked for (epochs kept: {list(available) or 'none'}). Average fewer, "
            f"or train more epochs with --keep-checkpoints {wanted} or more (it keeps the latest "
            "and the best N)."
        )
    return [available[e] for e in sorted(chosen)]


def average_weights(weight_lists):
    """The element-wise mean of several models' weights.

    Args:
        weight_lists: list of `model.get_weights()` lists, all of one model
            architecture.

    Returns:
        list of float32 NumPy arrays (integer weights, such as a seed
        generator's state, are taken from the last list).

    Raises:
        ValueError: for an empty list or lists of other shapes.
    """
    if not weight_lists:
        raise ValueError("average_weights needs at least one list of weights.")
    shapes = [[np.shape(w) for w in weights] for weights in weight_lists]
    if any(s != shapes[0] for s in shapes):
        raise ValueError("The checkpoints hold weights of different shapes: not one architecture.")
    averaged = []
    for values in zip(*weight_lists):
        if np.issubdtype(np.asarray(values[0]).dtype, np.floating):
            mean = np.mean([np.asarray(v, "float64") for v in values], axis=0)
            averaged.append(mean.astype(np.asarray(values[0]).dtype))
        else:
            averaged.append(np.asarray(values[-1]))
    return averaged


def average_checkpoints(model, paths):
    """Load the mean of the weight files `paths` into `model`.

    Args:
        model: a built `keras.Model` of the checkpoints' architecture.
        paths: list of `.weights.h5` files written by `model.save_weights`.

    Returns:
        `model`, holding the averaged weights.

    Raises:
        TypeError: for one path instead of a list of them.
        ValueError: naming a file that cannot be read.
    """
    if isinstance(paths, (str, bytes, os.PathLike)):  # its characters were read as paths
        raise TypeError(f"average_checkpoints takes a list of weight files; got one path, {paths!r}: "
                        "wrap it as [path].")
    weight_lists = []
    for path in paths:
        try:
            model.load_weights(path)
        except OSError as error:  # h5py's message names no file ("truncated file: eof = ...")
            raise ValueError(f"{path} cannot be read (truncated or corrupt?): {error}. Leave it out "
                             "(`average --last`/`--best` with fewer), or delete it.") from error
        weight_lists.append(model.get_weights())
    model.set_weights(average_weights(weight_lists))
    return model


class EpochCheckpoint(keras.callbacks.Callback):
    """Saves the model's weights after each epoch as
    `run_dir/epochs/epoch-NNN.weights.h5`, keeping the latest `keep` and the
    `keep` best by `monitor` (read from `epochs.jsonl`, so a resumed run
    keeps its earlier best ones).

    Args:
        run_dir: the run folder.
        keep: int, how many latest (and how many best) to keep.
        monitor: str, the metric that ranks checkpoints.
    """

    def __init__(self, run_dir, keep=5, monitor="val_loss"):
        super().__init__()
        self.run_dir, self.keep, self.monitor = run_dir, int(keep), monitor

    def on_epoch_end(self, epoch, logs=None):
        folder = os.path.join(self.run_dir, EPOCHS_DIR)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"epoch-{epoch + 1:03d}.weights.h5")
        self.model.save_weights(path + ".tmp.weights.h5")
        os.replace(path + ".tmp.weights.h5", path)
        self._prune({epoch + 1: dict(logs or {})})

    def _prune(self, current):
        available = epoch_checkpoints(self.run_dir)
        log = epoch_log(self.run_dir)
        log.update(current)  # this epoch is logged after the callbacks run
        best = _ranked(log, available, self.monitor)[: self.keep]
        keep = set(list(available)[-self.keep:]) | set(best)
        for e, path in available.items():
            if e not in keep:
                os.remove(path)
