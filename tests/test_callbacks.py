"""`callbacks.PreemptibleBackup` in a plain `model.fit`: SIGTERM saves the
state and stops, at a step or before the next epoch; a second signal goes to
the handler from before; the handler is restored. `callbacks.TimeBudget`:
the epoch it stops after, a resumed run counting its earlier time."""

import json
import os
import signal

import keras
import numpy as np
import pytest

from keras_transformer.callbacks import DivergenceGuard, PreemptibleBackup, TimeBudget, TrainingDiverged
from keras_transformer.callbacks import TrainingStopped, time_budget_state


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(40, 4)).astype("float32"), rng.normal(size=(40, 1)).astype("float32")


class _SignalAt(keras.callbacks.Callback):
    """Sends SIGTERM to this process at `(epoch, batch)` (0-based), at the
    batch's end (`batch=None`: at the epoch's end), `times` times."""

    def __init__(self, epoch, batch, times=1):
        super().__init__()
        self.at, self.times, self.epoch = (epoch, batch), times, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            for _ in range(self.times):
                os.kill(os.getpid(), signal.SIGTERM)

    def on_epoch_end(self, epoch, logs=None):
        if self.at == (epoch, None):
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_inside_an_epoch_saves_after_the_next_step_and_resumes_that_epoch(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    x, y = _data()
    model = _model()
    saves = []
    backup = PreemptibleBackup(str(tmp_path), delete_checkpoint=False,
                               on_mid_epoch_save=lambda epoch, steps: saves.append((epoch, steps)))
    with pytest.raises(TrainingStopped) as info:
        model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[backup, _SignalAt(1, 2)])
    stopped = info.value
    assert (stopped.signum, stopped.epoch, stopped.steps) == (signal.SIGTERM, 2, 4)
    assert str(stopped) == f"stopped by SIGTERM after step 4 of epoch 2; the training state is saved in {tmp_path}"
    assert saves == [(1, 4)]
    assert json.load(open(tmp_path / "training_metadata.json"))["epoch"] == 1
    assert int(model.optimizer.iterations.numpy()) == 10 + 4
    assert signal.getsignal(signal.SIGTERM) is before
    # The saved state is the model's at the stop: a new model restored from it
    # resumes epoch 2 (0-based 1) from those weights and optimizer steps.
    trained = model.get_weights()
    again = _model()
    resumed = PreemptibleBackup(str(tmp_path), delete_checkpoint=False)
    seen = []
    epochs = keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: seen.append(epoch))
    restored = keras.callbacks.LambdaCallback(
        on_train_begin=lambda logs: [np.testing.assert_array_equal(a, b)
                                     for a, b in zip(again.get_weights(), trained)])
    again.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[resumed, restored, epochs])
    assert seen == [1, 2]
    assert int(again.optimizer.iterations.numpy()) == 14 + 20
    assert signal.getsignal(signal.SIGTERM) is before


def _resume(backup_dir, save_freq, weights, epochs):
    """A new model fit on `backup_dir`'s state: it must start from
    `weights`; returns the model and the epochs it ran (0-based)."""
    x, y = _data()
    model, seen = _model(), []
    model.fit(x, y, batch_size=4, epochs=epochs, verbose=0, callbacks=[
        PreemptibleBackup(str(backup_dir), save_freq=save_freq, delete_checkpoint=False),
        keras.callbacks.LambdaCallback(
            on_train_begin=lambda logs: [np.testing.assert_array_equal(a, b)
                                         for a, b in zip(model.get_weights(), weights)],
            on_epoch_begin=lambda epoch, logs: seen.append(epoch))])
    return model, seen


@pytest.mark.parametrize("save_freq", ["epoch", 4])
def test_sigterm_at_an_epoch_end_stops_before_the_next_epoch_and_a_second_goes_to_the_old_handler(
        tmp_path, save_freq):
    """With a `save_freq` in batches (`train --checkpoint-every`) Keras
    saves no epoch's end: the stop saved nothing, the state on disk was the
    one after step 8 of epoch 1, and the resumed run trained epoch 1 again
    from it (a new-user trial)."""
    x, y = _data()
    model = _model()
    backup = PreemptibleBackup(str(tmp_path), save_freq=save_freq, delete_checkpoint=False)
    with pytest.raises(TrainingStopped) as info:
        model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[backup, _SignalAt(0, None)])
    assert (info.value.epoch, info.value.steps) == (2, 0)
    assert "before epoch 2" in str(info.value)
    assert json.load(open(tmp_path / "training_metadata.json")) == {"epoch": 1, "batch": 0}
    assert int(model.optimizer.iterations.numpy()) == 10
    again, seen = _resume(tmp_path, save_freq, model.get_weights(), epochs=3)
    assert seen == [1, 2] and int(again.optimizer.iterations.numpy()) == 30
    # A run that finished holds its last epoch's end, not the save after
    # step 8 of it: extended, it trained that epoch again from there (a
    # new-user trial: `train --checkpoint-every`, then `--epochs` one more).
    assert json.load(open(tmp_path / "training_metadata.json")) == {"epoch": 3, "batch": 0}
    extended, seen = _resume(tmp_path, save_freq, again.get_weights(), epochs=4)
    assert seen == [3] and int(extended.optimizer.iterations.numpy()) == 40

    received = []

    def recorder(signum, frame):
        received.append(signum)

    previous = signal.signal(signal.SIGTERM, recorder)
    try:
        model = _model()
        backup = PreemptibleBackup(str(tmp_path / "two"), delete_checkpoint=False)
        with pytest.raises(TrainingStopped) as info:
            model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[backup, _SignalAt(0, 1, times=2)])
        assert received == [signal.SIGTERM]  # the second signal, handed on
        assert (info.value.epoch, info.value.steps) == (1, 3)
        assert signal.getsignal(signal.SIGTERM) is recorder
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_training_stopped_is_not_an_exception():
    """`except Exception` in a user's loop does not swallow the stop."""
    assert issubclass(TrainingStopped, KeyboardInterrupt) and not issubclass(TrainingStopped, Exception)


class _FakeTimer(keras.callbacks.Callback):
    """Logs each epoch to `epochs.jsonl` as the run's timer does, with the
    given seconds instead of measured ones."""

    def __init__(self, run_dir, seconds):
        super().__init__()
        self.path, self.seconds = os.path.join(run_dir, "epochs.jsonl"), list(seconds)

    def on_epoch_end(self, epoch, logs=None):
        with open(self.path, "a") as f:
            f.write(json.dumps({"epoch": epoch + 1, "seconds": self.seconds[epoch]}) + "\n")


@pytest.mark.parametrize("budget, epochs_run", [(35.0, 3), (40.0, 4), (61.0, 5), (1000.0, 8)])
def test_time_budget_stops_before_the_epoch_that_would_pass_it(tmp_path, budget, epochs_run):
    # Epochs of 10 s, the fifth (a validation-BLEU epoch) 20 s. After epoch k
    # the next is estimated at the longest of the last 5: a stop once
    # used + estimate > budget. 35: 30 + 10 > 35 after 3. 40: 30 + 10 = 40
    # goes on, 40 + 10 stops after 4. 61: 40 + 10 = 50 goes on to 5, then
    # 60 + 20 > 61 stops after 5.
    x, y = _data()
    seconds = [10.0, 10.0, 10.0, 10.0, 20.0, 10.0, 10.0, 10.0]
    budget_cb = TimeBudget(str(tmp_path), budget)
    history = _model().fit(x, y, batch_size=8, epochs=8, verbose=0,
                           callbacks=[_FakeTimer(str(tmp_path), seconds), budget_cb])
    assert len(history.history["loss"]) == epochs_run
    assert budget_cb.stopped_epoch == (None if epochs_run == 8 else epochs_run - 1)
    used, next_epoch, stop = time_budget_state(str(tmp_path), budget)
    assert used == sum(seconds[:epochs_run])
    assert next_epoch == max(seconds[max(0, epochs_run - 5):epochs_run])
    assert stop == (epochs_run < 8)


def test_time_budget_counts_the_time_of_a_resumed_runs_earlier_sessions(tmp_path):
    with open(tmp_path / "epochs.jsonl", "w") as f:
        for epoch in (1, 2):
            f.write(json.dumps({"epoch": epoch, "seconds": 15.0}) + "\n")
    assert time_budget_state(str(tmp_path), 45.0) == (30.0, 15.0, False)
    assert time_budget_state(str(tmp_path), 44.9) == (30.0, 15.0, True)
    x, y = _data()
    history = _model().fit(x, y, batch_size=8, epochs=5, verbose=0,
                           callbacks=[_FakeTimer(str(tmp_path), [15.0] * 5), TimeBudget(str(tmp_path), 45.0)])
    assert len(history.history["loss"]) == 1  # 30 + 15 = 45 used, 15 more would pass 45


@pytest.mark.parametrize("seconds", [0, -5, True, float("nan")])
def test_time_budget_refuses_a_budget_that_is_not_a_positive_number(tmp_path, seconds):
    with pytest.raises(ValueError, match="positive number of seconds"):
        TimeBudget(str(tmp_path), seconds)


class _PoisonAt(keras.callbacks.Callback):
    """Sets the kernel of the model's first layer to NaN at `(epoch, batch)`
    (0-based), at the batch's start or, with `end=True`, its end."""

    def __init__(self, epoch, batch, end=False):
        super().__init__()
        self.at, self.end, self.epoch = (epoch, batch), end, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def _poison(self, batch):
        if (self.epoch, batch) == self.at:
            kernel = self.model.layers[0].kernel
            kernel.assign(np.full(kernel.shape, np.nan, "float32"))

    def on_train_batch_begin(self, batch, logs=None):
        if not self.end:
            self._poison(batch)

    def on_train_batch_end(self, batch, logs=None):
        if self.end:
            self._poison(batch)


@pytest.mark.parametrize("end, steps, save_freq", [(False, 3, "epoch"), (True, None, "epoch"), (True, 5, 5)])
def test_a_diverged_run_stops_before_anything_saves_its_nan_weights(tmp_path, end, steps, save_freq):
    """Keras's TerminateOnNaN let the epoch end run, so `train` saved NaN
    weights into model.keras, best.keras and the backup and exited 0. The
    guard raises `TrainingDiverged` at the first NaN loss (a NaN kernel at
    step 3 of epoch 2), at an epoch end with NaN weights behind a finite
    loss (poisoned after the last step), and the backup refuses to save
    them at a mid-epoch save (every 5 steps, poisoned after step 5): the
    saved model and backup keep epoch 1, from which a run resumes."""
    x, y = _data()
    model = _model()
    saved = str(tmp_path / "model.keras")
    poison = _PoisonAt(1, 9 if end and steps is None else steps - 1, end=end)
    callbacks = [poison, DivergenceGuard(),
                 PreemptibleBackup(str(tmp_path / "backup"), save_freq=save_freq, delete_checkpoint=False),
                 keras.callbacks.ModelCheckpoint(saved)]
    with pytest.raises(TrainingDiverged, match="training diverged") as info:
        model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=callbacks)
    assert (info.value.epoch, info.value.steps) == (2, steps)
    assert isinstance(info.value, FloatingPointError)
    after_epoch_1 = keras.saving.load_model(saved).get_weights()
    assert all(np.isfinite(w).all() for w in after_epoch_1)
    again = _model()
    seen = []
    again.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[
        DivergenceGuard(), PreemptibleBackup(str(tmp_path / "backup"), save_freq=save_freq, delete_checkpoint=False),
        keras.callbacks.LambdaCallback(on_train_begin=lambda logs: seen.append(again.get_weights()))])
    for got, want in zip(seen[0], after_epoch_1):
        np.testing.assert_array_equal(got, want)
    assert all(np.isfinite(w).all() for w in again.get_weights())


def test_an_unreadable_latest_state_is_reported_and_the_log_keeps_one_row_an_epoch(tmp_path, capsys):
    """A save cut off (the latest weights file truncated): Keras restores
    the state saved before it (`double_checkpoint`) without a word, so
    `train` said "Resuming after epoch 3", trained epoch 3 again and logged
    it twice. `on_restore` gets the epoch really restored and whether the
    latest state was unreadable; `train` says so and drops the log.csv rows
    of the epochs it trains again."""
    from keras_transformer.training import _resuming

    x, y = _data()
    backup_dir = tmp_path / "checkpoints"
    restored = []

    def backup():
        return PreemptibleBackup(str(backup_dir), double_checkpoint=True, delete_checkpoint=False,
                                 on_restore=lambda epoch, fell_back: restored.append((epoch, fell_back)))

    log = keras.callbacks.CSVLogger(str(tmp_path / "log.csv"), append=True)
    _model().fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[backup(), log])
    assert restored == []  # nothing to restore in a new run
    _model().fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[backup()])
    assert restored == [(3, False)]
    latest = backup_dir / "latest.weights.h5"
    latest.write_bytes(latest.read_bytes()[:1000])
    _model().fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[backup()])
    assert restored[-1] == (2, True)
    capsys.readouterr()
    _resuming(str(tmp_path), 2, True, verbose=0)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"Warning: the latest training state in {backup_dir} could not be read")
    assert out[1] == f"Resuming {tmp_path} after epoch 2 (its checkpoints/ folder)"
    rows = (tmp_path / "log.csv").read_text().splitlines()
    assert rows[0].startswith("epoch,") and [row.split(",")[0] for row in rows[1:]] == ["0", "1"]
    # training_metadata.json cut off is a cut-off save too: the state before
    # it is restored; with none, the error names the file (it was JSON's
    # "Expecting value: line 1 column 1 (char 0)", a new-user trial).
    (backup_dir / "training_metadata.json").write_text("")
    _model().fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[backup()])
    assert restored[-1][1] is True
    for name in ("training_metadata.json", "training_metadata.json.bkp"):
        (backup_dir / name).write_text("{")
    with pytest.raises(OSError, match="training_metadata.json is damaged: it is not valid JSON"):
        _model().fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[backup()])


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="Translator needs tensorflow")
@pytest.mark.parametrize("dtype", [None, "mixed_bfloat16"])
def test_validation_bleu_scores_each_epochs_weights_and_keeps_one_translator_of_a_float32_model(dtype):
    """The BLEU of an epoch is that of the weights at its end: the
    references are a fresh `Translator`'s translations of the second
    weights (BLEU 100 for them, less for the first). A float32 model keeps
    one `Translator` (its search traced once); a mixed-precision one
    decodes a float32 copy, made again each time."""
    from keras_transformer import Translator, build_transformer
    from keras_transformer.callbacks import ValidationBLEU
    from keras_transformer.data.synthetic import make_synthetic_corpus
    from keras_transformer.tokenizers import train_subword_tokenizer

    en, de = make_synthetic_corpus(300, seed=1)
    src, tgt = train_subword_tokenizer(en, 120), train_subword_tokenizer(de, 120)

    def build(seed):
        keras.utils.set_random_seed(seed)
        return build_transformer(
            src.vocab_size, tgt.vocab_size, num_layers=1, d_model=32, num_heads=2, dff=64,
            dropout_rate=0.0, sequence_length=12, dtype=dtype,
        )

    model, other = build(0), build(1)
    lines = en[:8]
    first = Translator(model, src, tgt, beam_size=1).translate_lines(lines)
    second = Translator(other, src, tgt, beam_size=1).translate_lines(lines)
    assert first != second and all(second)  # the two weight sets are told apart
    callback = ValidationBLEU(lines, second, src, tgt, every=1)
    callback.set_model(model)
    logs = {}
    callback.on_epoch_end(0, logs)
    assert logs["val_bleu"] < 100.0
    kept = callback._translator
    model.set_weights(other.get_weights())  # what the next epoch's steps do
    callback.on_epoch_end(1, logs)
    assert logs["val_bleu"] == pytest.approx(100.0)
    if dtype is None:
        assert kept is not None and callback._translator is kept
    else:
        assert kept is None and callback._translator is None
