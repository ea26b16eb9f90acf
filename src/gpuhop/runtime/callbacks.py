"""Runs inside the job: gpuhop's Keras callbacks, built on whichever Keras the job uses, and
the `Model.fit` patch the start-up hook applies to scripts that never import gpuhop.

Every function takes the Keras module to build on (Keras 3's `keras`, TensorFlow's
`tf.keras`, or `tf_keras`), so nothing here imports Keras or TensorFlow: the public faces are
gpuhop.keras (Keras 3 on any backend) and gpuhop.tf (TensorFlow's Keras).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from gpuhop.runtime import (
    attempt,
    checkpoint_dir,
    in_job,
    log_metrics,
    metrics_file,
    profiling,
    tensorboard_dir,
)
from gpuhop.runtime.memory import device_memory
from gpuhop.runtime.summaries import SOURCE_KEY, fit_source, keras_fit

__all__ = [
    "backup_callback",
    "callbacks",
    "continue_csv_logs",
    "cut_csv_rows",
    "metrics_callback",
    "patch_fit",
    "step_markers_callback",
    "tensorboard_callback",
]

# Set in a job's environment by the agent: how many times a failed attempt is retried.
RETRIES_ENV = "GPUHOP_RETRIES"
# Where `fit` takes `callbacks` positionally: fit(x, y, batch_size, epochs, verbose, callbacks)
# in Keras 3 and tf-keras alike.
CALLBACKS_POSITION = 5


def metrics_callback(keras: Any, every_n_steps: int = 0) -> Any:
    """A Keras callback that writes each epoch's logs (and optionally every N steps') to
    the job's metrics file, as `{"epoch": E, "epochs": N, "step": S, "loss": ..., ...,
    "source": "fit:MODEL"}` lines (N: the epochs `fit` was asked for; MODEL: the model's
    name). Each epoch's line also carries the framework's own
    device memory in use and its peak (`memory_mb`, `memory_peak_mb`) where it reports them.
    The start-up hook sees it (`gpuhop_metrics`) and adds no second one.

    A retry's `fit` that resumes at a later epoch (BackupAndRestore, or `initial_epoch`)
    continues the step count where the earlier attempts had it at that epoch, as one
    uninterrupted run would count."""

    class MetricsCallback(keras.callbacks.Callback):
        gpuhop_metrics = True

        def __init__(self) -> None:
            super().__init__()
            self.step = 0
            self.epoch = 0
            self.begun = False
            self.progress = Progress()

        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            if not self.begun:
                self.begun = True
                if epoch > 0 and attempt() > 1:
                    self.step = steps_before(epoch + 1)
            self.epoch = epoch + 1
            self.progress.epoch_begins()
            self._progress(force=True)

        def _progress(self, force: bool = False) -> None:
            steps, total = (self.params or {}).get("steps"), self._total()
            size = (steps if isinstance(steps, int) else None, total.get("epochs"))
            note = self.progress.note(force, *size, self.epoch)
            if note is not None:
                log_metrics(step=self.step, epoch=self.epoch, **total, **note)

        def _total(self) -> dict[str, Any]:
            # The number of epochs fit() was asked for: `gpuhop run` shows "epoch 3/10";
            # and whose fit this is (a program may fit several models, and train on after).
            epochs = (self.params or {}).get("epochs")
            total = {"epochs": int(epochs)} if isinstance(epochs, int) else {}
            return {**total, SOURCE_KEY: fit_source(self.model)}

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            self.step += 1
            self.progress.stepped()
            self._progress()
            if every_n_steps and self.step % every_n_steps == 0:
                log_metrics(step=self.step, epoch=self.epoch, **self._total(), **(logs or {}))

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            values = {**(logs or {}), **device_memory()}
            log_metrics(step=self.step, epoch=epoch + 1, **values, **self._total())

    return MetricsCallback()


class Progress:
    """Where a `fit` is within its epoch, for the status line under `gpuhop run`: a record
    `{"progress": 1, "epoch": E (the one running), "epoch_step": K, "epoch_steps": M,
    "eta": seconds to the fit's end}` at each epoch's start and, between, at most every
    `PROGRESS_EVERY` seconds or a tenth of the time the fit has run (so a long fit adds few
    records to its metrics file). Readers of metrics skip these records
    (`gpuhop.agent.jobs.metricstail`)."""

    PROGRESS_EVERY = 2.0

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.noted = 0.0
        self.epoch_step = 0
        self.steps_done = 0  # in this fit, for its pace

    def epoch_begins(self) -> None:
        self.epoch_step = 0

    def stepped(self) -> None:
        self.epoch_step += 1
        self.steps_done += 1

    def note(
        self, force: bool, steps: int | None, epochs: int | None, epoch: int
    ) -> dict[str, Any] | None:
        """The record's progress keys, where one is due (always, with `force`)."""
        now = time.monotonic()
        ran = now - self.started
        if not force and now - self.noted < max(self.PROGRESS_EVERY, ran / 10):
            return None
        self.noted = now
        note: dict[str, Any] = {"progress": 1, "epoch_step": self.epoch_step}
        if steps:
            note["epoch_steps"] = steps
            if epochs and self.steps_done:  # at the fit's pace so far
                left = (epochs - epoch) * steps + (steps - self.epoch_step)
                note["eta"] = round(left * ran / self.steps_done, 1)
        return note


def steps_before(epoch: int) -> int:
    """The step the job's metrics file last recorded before `epoch` (1-based) began: that of
    its last record of an earlier epoch; 0 if it has none."""
    path = metrics_file()
    if path is None:
        return 0
    step = 0
    try:
        with open(path, "rb") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a job may write what it likes there
                if not isinstance(record, dict) or "progress" in record:
                    continue
                at, done = record.get("step"), record.get("epoch")
                if isinstance(at, int) and isinstance(done, int) and done < epoch:
                    step = at
    except OSError:
        return 0
    return step


def step_markers_callback(keras: Any) -> Any:
    """A Keras callback that, while `gpuhop profile` captures this process (only then),
    wraps each train batch in a step marker (`profiling.step_marker`), so the profile
    plugin's overview and input pipeline analysis see the steps: Keras 3's `fit` marks
    none (tf-keras's does). Between captures a batch costs it one check of a flag.

    Its batch-end runs where the batch ran (not `async_safe`): a marker is exited by the
    thread that entered it. gpuhop's metrics callback makes `fit` dispatch batch ends so
    anyway."""

    class StepMarkers(keras.callbacks.Callback):
        gpuhop_step_markers = True

        def __init__(self) -> None:
            super().__init__()
            self.step = 0
            self.marker: Any = None

        def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
            self.marker = profiling.step_marker(self.step)

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            self.step += 1
            if self.marker is not None:
                self.marker.__exit__(None, None, None)
                self.marker = None

    return StepMarkers()


def _marks_no_steps(keras: Any) -> bool:
    """Whether this Keras's `fit` leaves a profile without step markers: Keras 3's does
    (tf-keras wraps each step in a `Trace(..., _r=1)` itself)."""
    major = str(getattr(keras, "__version__", "")).split(".")[0]
    return major.isdigit() and int(major) >= 3


def backup_callback(keras: Any) -> Any:
    """Keras's BackupAndRestore in the job's checkpoint dir (kept across retries): a killed
    attempt's retry resumes at its last finished epoch.

    Each `fit` backs up in a dir of its own (`fit_backup_dir`): a program that fits more
    than once (a head with the base frozen, then the whole model) resumes the fit it was
    killed in, and a retry's earlier fit neither takes that backup for its own nor deletes
    it when it ends. In a job, a fit that ended keeps its end state there, so the retry,
    replaying the program, gets the fit's end weights back and runs none of its epochs
    again. Only the last ended fit of each model keeps its weights (a later one's supersede
    them); an earlier one's retry restores its epoch only. Outside a job a fit's backup is
    deleted when it ends, as Keras's is, so the next run starts afresh.

    Keras 3's refuses a model not built when `fit` begins (`Sequential([Dense(...)])`
    with no `Input`, which Keras 3 on TensorFlow builds only in the first step), even with
    nothing to restore: every such unmodified script would fail under `--retries`. So for
    such a model this one restores the epoch at once and the weights (and the optimizer's
    state) as soon as the first step has built them, that step's update giving way to
    them; with no backup there is nothing to restore, and saving works as Keras's does.
    """
    base = keras.callbacks.BackupAndRestore
    if not hasattr(base, "_load_model"):

        class LegacyBackupAndRestore(base):  # type: ignore[misc, valid-type]
            """tf-keras's, in a dir per fit (it reads `backup_dir` as training begins)."""

            def on_train_begin(self, logs: dict | None = None) -> None:
                self.backup_dir = str(fit_backup_dir(self.model, self.params))
                super().on_train_begin(logs)

        return LegacyBackupAndRestore(str(checkpoint_dir() / "backup"))

    class BackupAndRestore(base):  # type: ignore[misc, valid-type]
        _restore_when_built = False
        _epochs_run = 0

        def on_train_begin(self, logs: dict | None = None) -> None:
            self._back_up_in(fit_backup_dir(self.model, self.params))
            self._epochs_run = 0
            self._past = _read_history(self._history_path)
            if self.model.built:
                super().on_train_begin(logs)
                return
            metadata = self._training_metadata_path
            if os.path.exists(metadata):
                with open(metadata) as f:
                    self.model._initial_epoch = json.load(f)["epoch"]
            self._restore_when_built = os.path.exists(self._weights_path)

        def _back_up_in(self, backup_dir: Path) -> None:
            # The paths Keras's __init__ derives from its backup dir.
            self.backup_dir = str(backup_dir)
            self._weights_path = str(backup_dir / "latest.weights.h5")
            self._training_metadata_path = str(backup_dir / "training_metadata.json")
            self._prev_weights_path = f"{self._weights_path}.bkp"
            self._prev_training_metadata_path = f"{self._training_metadata_path}.bkp"
            self._history_path = backup_dir / "history.json"

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            if self._restore_when_built and self.model.built:
                self._restore_when_built = False
                self.model.load_weights(self._weights_path)
            super().on_train_batch_end(batch, logs)

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            self._epochs_run += 1
            if in_job():  # before the backup that skips this epoch on a retry
                self._past[epoch] = _numbers(logs)
                _write_history(self._history_path, self._past)
            super().on_epoch_end(epoch, logs)

        def on_train_end(self, logs: dict | None = None) -> None:
            # Keras leaves the restored epoch on the model: its next fit would begin there.
            self.model._initial_epoch = None
            if not in_job():
                super().on_train_end(logs)
                return
            history = getattr(self.model, "history", None)
            if self._past and history is not None:
                # The History `fit` returns: every epoch's, as one uninterrupted fit's (a
                # retry's has those it ran only, and none where it skipped an ended fit).
                history.epoch = sorted(self._past)
                history.history = {}
                for epoch in history.epoch:
                    for key, value in self._past[epoch].items():
                        history.history.setdefault(key, []).append(value)
            if self._epochs_run:  # else a retry's replay of an ended fit: all is there
                self._save_model()  # after the callbacks before it (best weights restored)
                with open(self._training_metadata_path, "w") as f:
                    json.dump({"epoch": self.params["epochs"], "batch": 0}, f)
            superseded = getattr(self.model, "_gpuhop_ended_fit_weights", None)
            if superseded not in (None, self._weights_path):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(superseded)
            self.model._gpuhop_ended_fit_weights = self._weights_path

    return BackupAndRestore(str(checkpoint_dir() / "backup"))


def _numbers(logs: dict | None) -> dict[str, float]:
    """An epoch's logs as History keeps them, the numbers only (JSON)."""
    numbers = {}
    for key, value in (logs or {}).items():
        with contextlib.suppress(TypeError, ValueError):
            numbers[str(key)] = float(value)
    return numbers


def _read_history(path: Path) -> dict[int, dict[str, float]]:
    """The epochs' logs an earlier attempt of this fit wrote (`_write_history`), if any."""
    try:
        with open(path) as f:
            return {int(epoch): logs for epoch, logs in json.load(f).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def _write_history(path: Path, past: dict[int, dict[str, float]]) -> None:
    """Every epoch's logs so far, in one replaced file (a kill leaves the last whole one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}")
    with open(partial, "w") as f:
        json.dump({str(epoch): logs for epoch, logs in past.items()}, f)
    os.replace(partial, path)


# How many fits of each kind (`fit_backup_dir`) this process has begun.
_fits_begun: collections.Counter[str] = collections.Counter()


def fit_backup_dir(model: Any, params: dict | None) -> Path:
    """The backup dir of the `fit` of `model` now beginning: one per fit, the same for the
    same fit of a retry, which runs the same program. A fit is known by its model's name,
    its epochs, how many weights it trains (a fine-tuning's second fit unfreezes more) and
    how many such fits this process began before it: a retry that skips a fit of its own
    accord (a program that loads what its last attempt saved) still finds the others'."""
    epochs = (params or {}).get("epochs")
    name = re.sub(r"[^\w.-]", "_", str(getattr(model, "name", "model")))
    kind = f"{name}-{epochs}e-{len(model.trainable_weights)}w"
    _fits_begun[kind] += 1
    return checkpoint_dir() / "backup" / f"{kind}-{_fits_begun[kind]}"


def tensorboard_callback(keras: Any, **options: Any) -> Any:
    """Keras's TensorBoard callback writing to the job's TensorBoard dir (`tensorboard_dir()`),
    which `gpuhop tensorboard JOB` serves live. `options` go to
    `keras.callbacks.TensorBoard` (histogram_freq=1, update_freq="batch", ...).

    With the default `update_freq="epoch"`, Keras 3's callback still makes a (no-op)
    summary call per metric after every batch, about 0.8 ms a batch on a CPU: a large share
    of a fast GPU step. This one skips them; what it writes is the same.
    """
    options.setdefault("log_dir", str(tensorboard_dir()))

    class TensorBoard(keras.callbacks.TensorBoard):
        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            epochly = self.update_freq == "epoch"
            super().on_train_batch_end(batch, None if epochly else logs)

    return TensorBoard(**options)


def callbacks(
    keras: Any, backup: bool = True, every_n_steps: int = 0, tensorboard: bool = False
) -> list[Any]:
    """The callbacks a gpuhop job wants: metrics, and (with `backup`) a BackupAndRestore in
    the job's checkpoint dir, so a retried job resumes at its last finished epoch.

    `tensorboard=True` adds `tensorboard_callback()`. It is off by default because it costs
    something every epoch (10-20 ms on a CPU: a few summary writes), and the metrics file
    already feeds `gpuhop show`.
    """
    out = [metrics_callback(keras, every_n_steps)]
    if backup:
        out.append(backup_callback(keras))
    if tensorboard:
        out.append(tensorboard_callback(keras))
    return out


def _with_ours(keras: Any, given: Any, backup: bool) -> Any:
    """The script's callbacks plus gpuhop's metrics callback, unless it passes one, and with
    `backup` a BackupAndRestore, unless it passes one; in a process `gpuhop profile` may
    capture, the step markers a Keras 3 profile lacks. A CallbackList is left alone."""
    if given is not None and not isinstance(given, (list, tuple)):
        return given
    out = list(given or [])
    if not any(getattr(c, "gpuhop_metrics", False) for c in out):
        out.append(metrics_callback(keras))
    if profiling.listening() and _marks_no_steps(keras):
        out.append(step_markers_callback(keras))
    if backup and not any(isinstance(c, keras.callbacks.BackupAndRestore) for c in out):
        out.append(backup_callback(keras))
    return out


def continue_csv_logs(keras: Any) -> None:
    """On a retry, make `keras.callbacks.CSVLogger` go on with the file the earlier attempts
    wrote, as one uninterrupted fit would have it: each epoch's row once, in order, under
    one header.

    Keras opens the file as training begins, emptying it unless `append=True`, so a retry's
    fit that resumes at epoch R lost rows 0..R-1, or (with `append=True`) wrote again a row
    the killed attempt wrote after its last backup. The epoch a fit resumes at is known
    only once BackupAndRestore's `on_train_begin` has run, after the script's callbacks'. So
    here the logger opens its file as the first epoch begins (or ends, for a subclass that
    overrides `on_epoch_begin`): resuming at R > 0, it cuts the rows of epochs R and later
    from the file's end (`cut_csv_rows`) and appends; at epoch 0 it opens the file as Keras
    does. A fit that runs no epoch (a retry's replay of an ended fit) leaves the file alone.
    """
    logger = keras.callbacks.CSVLogger
    if getattr(logger.on_train_begin, "gpuhop_patched", False):
        return
    train_begin, epoch_begin = logger.on_train_begin, logger.on_epoch_begin
    epoch_end, train_end = logger.on_epoch_end, logger.on_train_end

    def open_at(self: Any, epoch: int) -> None:
        if getattr(self, "_gpuhop_opened", True):
            return
        self._gpuhop_opened = True
        append = self.append
        if epoch > 0:
            cut_csv_rows(self.filename, self.sep, epoch)
            self.append = True
        try:
            train_begin(self)
        finally:
            self.append = append

    def on_train_begin(self: Any, logs: dict | None = None) -> None:
        self._gpuhop_opened = False

    def on_epoch_begin(self: Any, epoch: int, logs: dict | None = None) -> None:
        open_at(self, epoch)
        epoch_begin(self, epoch, logs)

    def on_epoch_end(self: Any, epoch: int, logs: dict | None = None) -> None:
        open_at(self, epoch)
        epoch_end(self, epoch, logs)

    def on_train_end(self: Any, logs: dict | None = None) -> None:
        if getattr(self, "_gpuhop_opened", True):
            train_end(self, logs)

    on_train_begin.gpuhop_patched = True  # type: ignore[attr-defined]
    logger.on_train_begin = on_train_begin
    logger.on_epoch_begin = on_epoch_begin
    logger.on_epoch_end = on_epoch_end
    logger.on_train_end = on_train_end


def cut_csv_rows(path: str, separator: str, epoch: int) -> None:
    """Cut from the end of the CSVLogger file at `path` a line a kill left half written,
    then the rows of epochs `epoch` and later: those of the fit now resuming at `epoch`
    that its killed attempt wrote after its last backup. It stops at the header, or at a
    row of an earlier epoch (rows before it, of another fit, are not this fit's)."""
    try:
        with open(path, "rb") as f:
            lines = f.readlines()
    except FileNotFoundError:
        return
    keep = len(lines)
    if keep and not lines[-1].endswith(b"\n"):
        keep -= 1
    sep = separator.encode()
    while keep:
        first = lines[keep - 1].split(sep, 1)[0].strip()
        if not (first.isdigit() and int(first) >= epoch):
            break
        keep -= 1
    if keep < len(lines):
        os.truncate(path, sum(len(line) for line in lines[:keep]))


def patch_fit(keras: Any) -> str:
    """Make every `keras.Model.fit` add gpuhop's callbacks (see `_with_ours`); with retries
    (`GPUHOP_RETRIES` above 0), BackupAndRestore too, and on a retry, CSVLogger goes on
    with the file the earlier attempts wrote (`continue_csv_logs`). Returns what it did, in
    words."""
    model = keras.Model
    original = model.fit
    if getattr(original, "gpuhop_patched", False):
        return "Model.fit already adds gpuhop's callbacks"
    backup = int(os.environ.get(RETRIES_ENV) or 0) > 0
    retry = backup and attempt() > 1
    if retry:
        continue_csv_logs(keras)

    @functools.wraps(original)
    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) > CALLBACKS_POSITION:
            args = list(args)  # type: ignore[assignment]
            args[CALLBACKS_POSITION] = _with_ours(keras, args[CALLBACKS_POSITION], backup)  # type: ignore[index]
        else:
            kwargs["callbacks"] = _with_ours(keras, kwargs.get("callbacks"), backup)
        with keras_fit():  # its TensorBoard callback's tf.summary scalars are the fit's
            return original(self, *args, **kwargs)

    fit.gpuhop_patched = True  # type: ignore[attr-defined]
    model.fit = fit
    extra = " and BackupAndRestore" if backup else ""
    if retry:
        extra += "; CSVLogger continues the earlier attempts' file"
    return f"Model.fit adds gpuhop's metrics callback{extra}"
