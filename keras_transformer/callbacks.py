"""Training callbacks: validation BLEU, early stopping that resumes, a
time budget, TensorBoard logs without the values an epoch did not compute,
a backup that saves and stops on SIGTERM, and a guard that stops a
diverged run before anything saves its NaN weights."""

import json
import math
import os
import signal
import threading

import keras
import numpy as np

from keras_transformer.checkpoints import epoch_log
from keras_transformer.config import read_json_file


class ValidationBLEU(keras.callbacks.Callback):
    """Corpus BLEU of the model's greedy translations of a validation set,
    added to the epoch's logs as `val_bleu` every `every` epochs.

    The logs of other epochs get `val_bleu` NaN, so that every epoch has the
    same keys (`CSVLogger` fixes its columns at the first epoch). Callbacks
    after this one (`ModelCheckpoint(monitor="val_bleu", mode="max")`,
    `CSVLogger`) see the value.

    Args:
        source_lines, reference_lines: aligned lists of `str`.
        source_tokenizer, target_tokenizer: the run's `SubwordTokenizer`s.
        every: int, compute it after epochs `every`, `2 * every`, ...
        beam_size: int, 1 (greedy) by default: cheaper than the final
            search, and it ranks checkpoints alike.
        batch_size: int, sentences per decoding batch.
    """

    def __init__(self, source_lines, reference_lines, source_tokenizer, target_tokenizer,
                 every=1, beam_size=1, batch_size=128):
        super().__init__()
        if int(every) < 1:
            raise ValueError(f"ValidationBLEU needs `every` >= 1; got {every!r}.")
        self.source_lines, self.reference_lines = list(source_lines), list(reference_lines)
        self.tokenizers = (source_tokenizer, target_tokenizer)
        self.every, self.beam_size, self.batch_size = int(every), int(beam_size), int(batch_size)
        self._translator = None

    def translator(self):
        """The `Translator` of `self.model` for this epoch's BLEU.

        A `Translator` of a float32 model decodes that model's own
        variables, so one serves every epoch and its search is traced
        once; one of a mixed-precision model decodes a float32 copy of the
        weights taken when it is made, so it is made again each time.
        """
        from keras_transformer.translator import Translator

        translator = self._translator
        if translator is None or translator.model is not self.model:
            translator = Translator(self.model, *self.tokenizers, beam_size=self.beam_size)
            self._translator = translator if translator.model is self.model else None
        return translator

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        logs["val_bleu"] = math.nan
        if (epoch + 1) % self.every:
            return
        from keras_transformer.evaluation import corpus_scores

        hypotheses = self.translator().translate_lines(self.source_lines, batch_size=self.batch_size)
        logs["val_bleu"] = float(corpus_scores(hypotheses, self.reference_lines)["bleu"])


class ResumableEarlyStopping(keras.callbacks.EarlyStopping):
    """`keras.callbacks.EarlyStopping` that picks up a resumed run where it
    stopped: the best value and the epochs without improvement are read
    from the run's `epochs.jsonl` at the start of training.

    Args:
        run_dir: the run folder (its `epochs.jsonl`).
        monitor: str, a loss logged every epoch (`"val_loss"`, `"loss"`):
            lower is better.
        patience: int, epochs without improvement before stopping.
    """

    def __init__(self, run_dir, monitor="val_loss", patience=5):
        if int(patience) < 1:
            raise ValueError(f"Early stopping needs a patience >= 1; got {patience!r}.")
        super().__init__(monitor=monitor, patience=int(patience), mode="min")
        self.run_dir = run_dir

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self.wait, self.best, _ = history_state(self.run_dir, self.monitor, self.patience)


def history_state(run_dir, monitor, patience):
    """`(wait, best, stop)` of early stopping over the epochs logged in the
    run folder's `epochs.jsonl`: epochs since the lowest `monitor` value,
    that value (None when none is logged), and whether `patience` has run
    out. Epochs without a finite value are skipped.

    Example:
    >>> history_state("/nonexistent", "val_loss", 3)
    (0, None, False)
    """
    best, wait = None, 0
    for _, record in sorted(epoch_log(run_dir).items()):
        value = record.get(monitor)
        if value is None or not math.isfinite(float(value)):
            continue
        if best is None or value < best:
            best, wait = float(value), 0
        else:
            wait += 1
    return wait, best, best is not None and wait >= patience


class TimeBudget(keras.callbacks.Callback):
    """Stops training at the end of the epoch after which the next epoch
    would take the run's training time past `seconds`, so that a run ends
    inside a wall-clock budget (a job's time limit, a model card's "trained
    in 2 hours") with every epoch whole and checkpointed.

    The run's training time is the sum of the `seconds` of the records in
    its `epochs.jsonl` (one line per epoch, written before this callback's
    `on_epoch_end` by the run's epoch timer), so a resumed run counts the
    time its earlier sessions took. The next epoch is estimated at the
    longest of the last `lookback` epochs (epochs that also compute a
    validation BLEU take longer).

    Args:
        run_dir: the run folder (its `epochs.jsonl`).
        seconds: float > 0, the budget in seconds of epoch time.
        lookback: int, the epochs that estimate the next one.

    Raises:
        ValueError: if `seconds` is not a positive number.
    """

    def __init__(self, run_dir, seconds, lookback=5):
        super().__init__()
        if isinstance(seconds, bool) or not float(seconds) > 0:
            raise ValueError(f"A time budget must be a positive number of seconds; got {seconds!r}.")
        self.run_dir, self.seconds, self.lookback = run_dir, float(seconds), int(lookback)
        self.stopped_epoch = None

    def on_epoch_end(self, epoch, logs=None):
        _, _, stop = time_budget_state(self.run_dir, self.seconds, self.lookback)
        if stop:
            self.stopped_epoch = epoch
            self.model.stop_training = True


def time_budget_state(run_dir, seconds, lookback=5):
    """`(used, next_epoch, stop)` for a time budget of `seconds` over the
    run folder's `epochs.jsonl`: the seconds its epochs took in all, the
    estimate of the next epoch (the longest of the last `lookback`; 0.0
    before any), and whether the next epoch would end past the budget.

    Example:
    >>> time_budget_state("/nonexistent", 7200.0)
    (0.0, 0.0, False)
    """
    path = os.path.join(run_dir, "epochs.jsonl")
    durations = []
    if os.path.exists(path):
        with open(path) as f:
            durations = [float(json.loads(line).get("seconds", 0.0)) for line in f if line.strip()]
    used = float(sum(durations))
    next_epoch = max(durations[-int(lookback):], default=0.0)
    return used, next_epoch, bool(durations) and used + next_epoch > float(seconds)


class TensorBoard(keras.callbacks.TensorBoard):
    """`keras.callbacks.TensorBoard` (loss, accuracy, learning rate and the
    validation metrics, per epoch) that leaves out the values an epoch did
    not compute (`val_bleu` is NaN between `ValidationBLEU` epochs), so the
    curves have no gaps filled with NaN.

    Args:
        log_dir: str, the folder `tensorboard --logdir` reads.
    """

    def on_epoch_end(self, epoch, logs=None):
        logs = {k: v for k, v in (logs or {}).items() if math.isfinite(float(v))}
        super().on_epoch_end(epoch, logs)


def non_finite_weights(model):
    """Names of the model's and its optimizer's variables holding NaN or
    infinity (empty when all are finite)."""
    variables = list(model.weights)
    if getattr(model, "optimizer", None) is not None:
        variables += list(model.optimizer.variables)
    names = []
    for variable in variables:
        # Only floats can hold NaN; an integer one (the optimizer's step
        # count) is not read, as tf.distribute's mirrored int64 cannot be.
        if not keras.backend.is_float_dtype(variable.dtype):
            continue
        if not np.isfinite(keras.ops.convert_to_numpy(variable.value)).all():
            names.append(variable.path)
    return names


class TrainingDiverged(FloatingPointError):
    """Raised out of `fit` by `DivergenceGuard` (and by `PreemptibleBackup`
    before a save) when the loss or the weights stop being finite. Nothing
    was saved after the last finite state, so a run folder keeps its last
    good epoch (or mid-epoch save), which the same training run resumes.

    Attributes:
        epoch: int, 1-based, the epoch it stopped in.
        steps: int or None, that epoch's steps done (None: at its end).
        what: str, what was found not finite.
    """

    def __init__(self, epoch, steps, what):
        self.epoch, self.steps, self.what = int(epoch), steps, what
        where = f"at step {steps} of epoch {epoch}" if steps else f"at the end of epoch {epoch}"
        super().__init__(
            f"training diverged {where}: {what} is not finite (NaN or infinity). Nothing was saved "
            "after the last finite state. Lower the learning rate (a smaller lr_scale, a longer "
            "warmup) or check the data, then train again: a run resumes from its last saved state."
        )


class DivergenceGuard(keras.callbacks.Callback):
    """Stops `fit` with `TrainingDiverged` at the first step whose loss is
    not finite, and at an epoch's end whose loss, validation loss or
    weights are not. Put it first among the callbacks: an exception in it
    comes before the callbacks after it save the model, so NaN weights
    never replace a checkpoint (unlike `keras.callbacks.TerminateOnNaN`,
    which lets the epoch end, and its saves, run).
    """

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            raise TrainingDiverged(getattr(self, "_epoch", 0) + 1, batch + 1, "the training loss")

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        for key in ("loss", "val_loss"):
            if key in logs and not math.isfinite(float(logs[key])):
                raise TrainingDiverged(epoch + 1, None, f"`{key}` ({float(logs[key])})")
        bad = non_finite_weights(self.model)
        if bad:
            raise TrainingDiverged(epoch + 1, None, f"{len(bad)} variables ({bad[0]}, ...)")


class TrainingStopped(KeyboardInterrupt):
    """Raised out of `fit` by `PreemptibleBackup` after a stop signal, once
    the training state is saved: the same training run again resumes from
    it. A `KeyboardInterrupt`, so that `except Exception` does not swallow it.

    Attributes:
        signum: int, the signal received (`signal.SIGTERM`).
        epoch: int, 1-based, the epoch it stopped in (or before).
        steps: int, that epoch's steps done and saved (0: stopped at the
            epoch's start, after the previous epoch's save).
        backup_dir: str, the folder holding the state.
    """

    def __init__(self, signum, epoch, steps, backup_dir):
        self.signum, self.epoch, self.steps, self.backup_dir = int(signum), int(epoch), int(steps), backup_dir
        name = signal.Signals(self.signum).name
        where = (f"after step {self.steps} of epoch {self.epoch}" if self.steps
                 else f"before epoch {self.epoch}")
        super().__init__(f"stopped by {name} {where}; the training state is saved in {backup_dir}")


class PreemptibleBackup(keras.callbacks.BackupAndRestore):
    """`keras.callbacks.BackupAndRestore` that also saves and stops when the
    process gets SIGTERM (what `kill`, a job scheduler or a preempted cloud
    machine sends before ending a job).

    At the next step boundary after the signal it saves the training state
    (weights, optimizer, the epoch) as its `save_freq` saves do and raises
    `TrainingStopped`; `fit` with this callback on the same folder then
    resumes that epoch from its first batch with the saved weights (the
    Keras resume of a mid-epoch save). Every epoch's end is saved, with a
    `save_freq` in batches too (Keras's callback saves only every
    `save_freq` batches then), so that a run stopped or finished after an
    epoch resumes (or is extended) at the next one. A signal during an
    epoch's validation or end-of-epoch callbacks stops before the next
    epoch starts; one during the last epoch lets `fit` finish. A second
    signal before the stop gets the handler that was there before (by
    default: the process ends at once).

    The handler is installed in `on_train_begin` (on the main thread only:
    Python handles signals there alone; elsewhere nothing changes) and the
    previous one restored when training ends or stops. If `fit` ends in
    another exception, call `release()`. It never saves weights or
    optimizer state that are not finite: it raises `TrainingDiverged`
    instead, keeping the last good state.

    Args:
        backup_dir, save_freq, double_checkpoint, delete_checkpoint: as for
            `keras.callbacks.BackupAndRestore`.
        on_mid_epoch_save: None, or a callable `(epoch, steps)` called after
            each save made inside an epoch (`epoch` 0-based, `steps` of it
            done), e.g. to carry that epoch's time into the run that redoes it.
        signals: the signals to stop on; default `(signal.SIGTERM,)`.
        on_restore: None, or a callable `(epoch, fell_back)` called in
            `on_train_begin` after a state was restored: `epoch` the
            0-based epoch `fit` goes on with (the epochs finished before
            it), `fell_back` True when the latest state could not be read
            and Keras restored the one saved before it
            (`double_checkpoint`).
    """

    def __init__(self, backup_dir, save_freq="epoch", double_checkpoint=False, delete_checkpoint=True,
                 on_mid_epoch_save=None, signals=None, on_restore=None):
        super().__init__(backup_dir, save_freq=save_freq, double_checkpoint=double_checkpoint,
                         delete_checkpoint=delete_checkpoint)
        self.signals = (signal.SIGTERM,) if signals is None else tuple(signals)
        self.on_mid_epoch_save = on_mid_epoch_save
        self.on_restore = on_restore
        self.fell_back = False
        self.stop_signal = None
        self._previous = {}
        self._epoch, self._steps = 0, None  # steps of the running epoch; None between epochs

    def on_train_begin(self, logs=None):
        self.fell_back = False
        super().on_train_begin(logs)
        if self.on_restore is not None and os.path.exists(self._training_metadata_path):
            self.on_restore(int(read_json_file(self._training_metadata_path)["epoch"]), self.fell_back)
        self.stop_signal = None
        if threading.current_thread() is threading.main_thread():
            for signum in self.signals:
                self._previous[signum] = signal.signal(signum, self._request_stop)

    def _request_stop(self, signum, frame):
        if self.stop_signal is None:
            self.stop_signal = signum
            return
        self.release()  # a second signal: the previous handler, now
        os.kill(os.getpid(), signum)

    def release(self):
        """Restores the signal handlers that were there before training."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch, self._steps = epoch, 0
        # Keras sets the epoch it saves only at epoch ends, so the first
        # mid-epoch save of a resumed run would record epoch 0 and the
        # next resume would start the run over.
        self._current_epoch = epoch
        if self.stop_signal is not None:  # a signal after the last step of the previous epoch
            self._stop()  # its end is saved (`on_epoch_end`)

    def on_train_batch_end(self, batch, logs=None):
        self._steps = batch + 1
        super().on_train_batch_end(batch, logs)
        if self.stop_signal is not None:
            self._save_model()
            self._stop()

    def on_epoch_end(self, epoch, logs=None):
        self._steps = None
        super().on_epoch_end(epoch, logs)
        if self.save_freq != "epoch":
            # Keras saves a `save_freq` in batches only inside epochs: the
            # state on disk after the last epoch was a mid-epoch one, and a
            # run extended from it (or stopped in the next epoch's first
            # batches) trained that epoch again from it.
            self._save_model()

    def on_train_end(self, logs=None):
        self.release()
        super().on_train_end(logs)

    def _load_model(self):
        try:
            super()._load_model()
        except ValueError as error:  # training_metadata.json cut off or emptied: as a cut-off save
            self.fell_back = True
            raise OSError(f"{self._training_metadata_path} is damaged: it is not valid JSON ({error}); "
                          "no earlier training state to go on from was found either.") from None
        except OSError:  # Keras then restores the state saved before it, if any
            self.fell_back = True
            raise

    def _save_model(self):
        bad = non_finite_weights(self.model)
        if bad:  # never replace the last good state with NaN weights
            self.release()
            raise TrainingDiverged(self._epoch + 1, self._steps, f"{len(bad)} variables ({bad[0]}, ...)")
        super()._save_model()
        if self._steps and self.on_mid_epoch_save is not None:
            self.on_mid_epoch_save(self._epoch, self._steps)

    def _stop(self):
        self.release()
        raise TrainingStopped(self.stop_signal, self._epoch + 1, self._steps, self.backup_dir)
