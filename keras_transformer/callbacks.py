"""Training callbacks: validation BLEU, early stopping that resumes, and
TensorBoard logs without the values an epoch did not compute."""

import math

import keras

from keras_transformer.checkpoints import epoch_log


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

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        logs["val_bleu"] = math.nan
        if (epoch + 1) % self.every:
            return
        from keras_transformer.evaluation import corpus_scores
        from keras_transformer.translator import Translator

        translator = Translator(self.model, *self.tokenizers, beam_size=self.beam_size)
        hypotheses = translator.translate_lines(self.source_lines, batch_size=self.batch_size)
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
