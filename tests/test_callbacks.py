"""`callbacks.PreemptibleBackup` in a plain `model.fit`: SIGTERM saves the
state and stops, at a step or before the next epoch; a second signal goes to
the handler from before; the handler is restored."""

import json
import os
import signal

import keras
import numpy as np
import pytest

from keras_transformer.callbacks import PreemptibleBackup, TrainingStopped


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


def test_sigterm_at_an_epoch_end_stops_before_the_next_epoch_and_a_second_goes_to_the_old_handler(tmp_path):
    x, y = _data()
    model = _model()
    backup = PreemptibleBackup(str(tmp_path), delete_checkpoint=False)
    with pytest.raises(TrainingStopped) as info:
        model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[backup, _SignalAt(0, None)])
    assert (info.value.epoch, info.value.steps) == (2, 0)
    assert "before epoch 2" in str(info.value)
    assert json.load(open(tmp_path / "training_metadata.json"))["epoch"] == 1
    assert int(model.optimizer.iterations.numpy()) == 10

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
