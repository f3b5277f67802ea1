"""`TrainingConfig`: the settings of a training run, and reading them from a
JSON or YAML file.

This module imports neither Keras nor TensorFlow, so the command line can
show its defaults in `--help` without starting a backend.
"""

import dataclasses
import json
import os


@dataclasses.dataclass
class TrainingConfig:
    """What a training run needs; every field has a default but the data.

    The conditions below between fields (such as `"all"` needing
    `shared_vocab`) are checked by `train` before it writes or trains
    anything, with a `ValueError` that names the field.

    Attributes:
        train_src, train_tgt: aligned training files (plain or `.gz`).
        extra_train: more aligned training pairs, a list of `[src, tgt]`
            file pairs read after `train_src` / `train_tgt` and trained on
            in every epoch with them (BiT's reversed pairs included): a
            model's translations of the training sources (sequence-level
            knowledge distillation, Kim & Rush, 2016), back-translations of
            the targets (Sennrich et al., 2016), or both (data
            diversification, Nguyen et al., 2020). The tokenizers are
            trained on `train_src` / `train_tgt` alone, and
            `max_train_pairs` cuts those alone. None (default): none.
            Another form than a list of path pairs raises `ValueError`.
        val_src, val_tgt: aligned validation files, or None.
        output_dir: run folder (created; reused to resume).
        preset: model size from `keras_transformer.models.PRESETS`.
        num_layers, d_model, num_heads, dff, dropout_rate: preset overrides.
        num_decoder_layers: decoder blocks (default `num_layers`); fewer
            than the encoder's make each decoding step cheaper.
        attention_dropout_rate: dropout on the attention weights (default
            `dropout_rate`).
        activation_dropout_rate: dropout on the feed-forward activation
            (default 0).
        norm_first: pre-LN blocks, `x + Sublayer(LayerNorm(x))`, with a final
            LayerNorm after each stack (Xiong et al., 2020), instead of the
            paper's post-LN `LayerNorm(x + Sublayer(x))` (section 3.1); see
            `build_transformer`.
        tie_embeddings: `"none"`, `"target"` or `"all"`: which embeddings
            share one matrix with the output projection (section 3.4; see
            `build_transformer`). `"all"` needs `shared_vocab`.
        shared_vocab: one SentencePiece model trained on both sides, used as
            the source and the target tokenizer; its size is
            `src_vocab_size`, which must then equal `tgt_vocab_size`.
        sequence_length: longest source / target in subword tokens (longer
            pairs are cut to it), and the rows of the model's position
            tables; default 64. `max_length` is its deprecated old name.
        src_vocab_size, tgt_vocab_size: SentencePiece vocabulary sizes.
        user_defined_symbols: a list of pieces added to the vocabularies
            and never split (SentencePiece's `user_defined_symbols`), such
            as a tag `<BT>` written before each back-translated source
            line, which tells the model which sources are synthetic
            (tagged back-translation; Caswell et al., 2019). Each is a
            non-empty string without whitespace. None (default): none.
        lowercase: lowercase the text before tokenizing.
        tokens_per_batch: token budget per batch (per side), with length
            bucketing; `batch_size` is used when it is None.
        batch_size: sentences per batch when `tokens_per_batch` is None or 0
            (plain padded batches; when the step is compiled, on jax or
            with `jit_compile`, batches of sentences of similar length,
            padded to their length bucket, so that it compiles once a
            bucket).
        epochs: passes over the training data.
        warmup_steps, lr_scale: `WarmupSchedule` (section 5.3).
        label_smoothing: epsilon of section 5.4 (0.1 in the paper).
        subword_alpha: subword regularization of the training data (Kudo,
            2018): a float in (0, 1], the smoothing parameter of
            `SubwordTokenizer.sample`, for a newly sampled segmentation of
            each training pair in every epoch; None (default): the one
            deterministic segmentation. Validation data is never sampled.
        bidirectional_epochs: bidirectional training (BiT; Ding et al.,
            2021): the first N epochs train on the pairs in both
            directions (source to target and target to source, twice the
            steps an epoch), the rest on source to target only, the
            optimizer and learning-rate schedule going on across the
            switch. Needs `shared_vocab`. 0 (default): one direction
            throughout.
        cooldown_epochs: the learning rate falls linearly to 0 over the
            last N of `epochs` (`WarmupSchedule`'s `cooldown_steps`, the
            steps counted from the epochs' batches, BiT's two-way epochs
            included). 0 (default): no cooldown, as in the paper. A run
            that early stopping or `time_budget` ends sooner never reaches
            it, so choose `epochs` that fit the budget; a run extended to
            more epochs afterwards gets a new cooldown at its new end.
        seed: random seed.
        jit_compile: XLA for the train step on tensorflow (`"auto"` lets Keras
            choose), `torch.compile` on torch; on jax the step is always
            compiled by XLA.
        distribution: None (one device), `"data_parallel"` (all local
            devices) or `"multi_worker"` (several hosts, jax only); see
            `keras_transformer.distribution`. The global batch is what
            `tokens_per_batch` / `batch_size` say.
        precision: `"auto"` (default), `"float32"`, `"mixed_bfloat16"` or
            `"mixed_float16"`; see `keras_transformer.precision`. `"auto"`
            is `"mixed_bfloat16"` on the tensorflow backend on a CPU with
            bfloat16 instructions for a `d_model` of 256 or more,
            `"float32"` elsewhere. `config.json` records the policy used
            (`model.dtype`).
        max_train_pairs: use only the first N pairs (smoke runs).
        keep_checkpoints: epoch checkpoints kept in `epochs/` (the latest N
            and the N best by `checkpoint_metric`), for averaging.
        average_last: after training, average the last N epoch checkpoints
            into `averaged.keras` (None: no averaging); at most `epochs`
            and `keep_checkpoints`; a run that early stopping or the time
            budget ends sooner averages the checkpoints it has, with a
            warning. See `keras_transformer.checkpoints`.
        early_stopping_patience: stop after this many epochs without a
            lower validation loss (None: run every epoch); resumable.
        time_budget: seconds of training (the epochs' seconds in
            `epochs.jsonl`, a resumed run's earlier sessions included):
            stop at the end of the epoch after which the next one would
            pass it (None: no budget); see `callbacks.TimeBudget`.
        bleu_every: compute the validation BLEU (greedy) every N epochs and
            log it as `val_bleu` (0: never).
        checkpoint_metric: `"val_loss"` or `"val_bleu"` (needs `bleu_every`):
            what chooses `best.keras`.
        checkpoint_every: also save the training state every N steps
            (None: at epoch ends only), so a killed run loses at most N
            steps; the resumed epoch starts its data over, with the weights
            and optimizer state of the last save.
        tensorboard: write TensorBoard logs to `<output_dir>/tensorboard`
            (`tensorboard --logdir <output_dir>/tensorboard` shows them).
    """

    train_src: str
    train_tgt: str
    extra_train: list = None
    val_src: str = None
    val_tgt: str = None
    output_dir: str = "runs/model"
    preset: str = "small"
    num_layers: int = None
    num_decoder_layers: int = None
    d_model: int = None
    num_heads: int = None
    dff: int = None
    dropout_rate: float = None
    sequence_length: int = None
    src_vocab_size: int = 8000
    tgt_vocab_size: int = 8000
    user_defined_symbols: list = None
    lowercase: bool = False
    tokens_per_batch: int = 4096
    batch_size: int = 64
    epochs: int = 20
    warmup_steps: int = 1000
    lr_scale: float = 0.5
    label_smoothing: float = 0.1
    subword_alpha: float = None
    bidirectional_epochs: int = 0
    cooldown_epochs: int = 0
    seed: int = 0
    jit_compile: object = False
    distribution: str = None
    precision: str = "auto"
    max_train_pairs: int = None
    attention_dropout_rate: float = None
    activation_dropout_rate: float = None
    tie_embeddings: str = "none"
    norm_first: bool = False
    shared_vocab: bool = False
    keep_checkpoints: int = 5
    average_last: int = None
    early_stopping_patience: int = None
    time_budget: float = None
    bleu_every: int = 0
    checkpoint_metric: str = "val_loss"
    tensorboard: bool = True
    checkpoint_every: int = None
    max_length: int = None  # deprecated: sequence_length

    def __post_init__(self):
        from keras_transformer.deprecation import renamed_argument

        self.sequence_length = renamed_argument(
            "TrainingConfig", "sequence_length", self.sequence_length, "max_length", self.max_length, 64)
        self.max_length = None
        if self.extra_train is not None:  # lists, as config.json records them
            self.extra_train = [list(pair) for pair in check_extra_train(self.extra_train)]
        self.user_defined_symbols = check_user_defined_symbols(self.user_defined_symbols)
        # Flags given in Python: "false" is truthy.
        check_config_values({field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                             if field.type is bool}, "TrainingConfig")

    @classmethod
    def from_file(cls, path, **overrides):
        """A config from a JSON or YAML file, with `overrides` on top.

        The file holds the fields of this class by name, either at the top
        level or under `"training"` as a run's `config.json` records them, so
        `TrainingConfig.from_file("runs/x/config.json", output_dir="runs/y")`
        repeats run x into a new folder.

        Raises:
            FileNotFoundError: if `path` does not exist.
            ValueError: for a file that is not a JSON or YAML mapping, or an
                unknown field (the message lists the known ones).
        """
        values = read_config_file(path)
        overrides = check_config_values(overrides, "overrides")
        if "sequence_length" in overrides:
            values.pop("max_length", None)  # the file's old name for it
        return cls(**{**values, **overrides})

    def model_config(self):
        """The `build_transformer` keyword arguments (without vocab sizes)."""
        from keras_transformer.models.presets import get_preset

        config = get_preset(
            self.preset,
            num_layers=self.num_layers,
            num_decoder_layers=self.num_decoder_layers,
            d_model=self.d_model,
            num_heads=self.num_heads,
            dff=self.dff,
            dropout_rate=self.dropout_rate,
            attention_dropout_rate=self.attention_dropout_rate,
            activation_dropout_rate=self.activation_dropout_rate,
        )
        config["sequence_length"] = self.sequence_length
        config["tie_embeddings"] = self.tie_embeddings
        config["norm_first"] = self.norm_first
        return config


def read_config_file(path):
    """The `TrainingConfig` fields in the JSON or YAML file `path` (read as
    YAML, of which JSON is a subset), as a dict; see
    `TrainingConfig.from_file`."""
    import yaml

    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        values = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ValueError(f"{path} is not valid YAML or JSON: {error}") from None
    if isinstance(values, dict) and isinstance(values.get("training"), dict):
        values = values["training"]
    if not isinstance(values, dict):
        raise ValueError(f"{path} must hold a mapping of TrainingConfig fields; got {type(values).__name__}.")
    return check_config_values({str(k).replace("-", "_"): v for k, v in values.items()}, path)


def check_config_values(values, where):
    """`values` (a dict of `TrainingConfig` fields) if every name is a field
    and every value has the field's type (None where the default is None).

    Raises:
        ValueError: naming the unknown fields, or the field with a value of
            another type (a quoted "false" for a bool, say).
    """
    fields = {field.name: field for field in dataclasses.fields(TrainingConfig)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(f"{where} has unknown settings {unknown}; the known ones are {sorted(fields)}.")
    for name, value in values.items():
        kind, default = fields[name].type, fields[name].default
        if value is None and default is None:
            continue
        if kind is bool:
            ok = isinstance(value, bool)
        elif kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif kind is str:
            ok = isinstance(value, str)
        elif kind is list:
            ok = isinstance(value, (list, tuple))
        else:
            ok = True
        if not ok:
            hint = "."
            if kind is bool:
                hint = " (write true or false, unquoted)."
            elif kind in (int, float) and isinstance(value, str) and _reads_as_number(value):
                # YAML 1.1 (PyYAML) reads an exponent without a dot as text.
                hint = (" (YAML reads a number like 5e-1 as text: write it with a dot, such as 0.5 or "
                        "5.0e-1, unquoted).")
            raise ValueError(
                f"{where}: `{name}` must be a {kind.__name__}; got {value!r} "
                f"({type(value).__name__})" + hint
            )
    return values


def _reads_as_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


def _refuse_ctranslate2_folder(path):
    """Raise `FileNotFoundError` when `path` is a CTranslate2 model written
    by `export --format ctranslate2` (its `config.json` is CTranslate2's,
    not a run's)."""
    from keras_transformer.languages import _read_json

    facts = _read_json(os.path.join(path, "keras_transformer.json")) or {}
    if facts.get("format") == "keras_transformer.ctranslate2":  # ctranslate2_export.FORMAT
        raise FileNotFoundError(
            f"{path} is a CTranslate2 model (export --format ctranslate2), neither a training run "
            "folder nor a SavedModel; translate with it through CTranslate2: "
            f"keras_transformer.ctranslate2_export.CTranslate2Translator({path!r}), or pass the run "
            "folder or SavedModel it was converted from."
        )


def check_run_folder(path):
    """Raise unless `path` is a run folder written by `train` (it holds
    `config.json`); TensorFlow-free, so the command line says it at once.

    Raises:
        FileNotFoundError: naming the run folders inside `path`, if any (the
            demo writes its run to `runs/demo/run`), or saying to pass a
            SavedModel folder as `--saved-model`.
    """
    _refuse_ctranslate2_folder(path)
    if os.path.exists(os.path.join(path, "config.json")):
        return
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path} does not exist, so it is not a training run folder; pass the "
            "--output-dir of `keras-transformer train`."
        )
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        raise FileNotFoundError(
            f"{path} is an exported SavedModel, not a training run folder; pass it as "
            f"--saved-model {path} instead of --run (translate, evaluate and export "
            "--format ctranslate2 take one)."
        )
    inside = sorted(
        os.path.join(path, name) for name in (os.listdir(path) if os.path.isdir(path) else [])
        if os.path.exists(os.path.join(path, name, "config.json"))
    )
    hint = f" It holds the run folder(s) {', '.join(inside)}." if inside else ""
    raise FileNotFoundError(
        f"{path} is not a training run folder (no config.json); "
        f"pass the --output-dir of `keras-transformer train`.{hint}"
    )


def check_saved_model_folder(path):
    """Raise unless `path` holds a SavedModel (`saved_model.pb`);
    TensorFlow-free, so the command line says it at once.

    Raises:
        FileNotFoundError: naming `path`, and saying to pass it as `--run`
            when it is a training run folder.
    """
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        return
    _refuse_ctranslate2_folder(path)
    if os.path.exists(os.path.join(path, "config.json")):
        raise FileNotFoundError(
            f"{path} is a training run folder, not an exported SavedModel; pass it as "
            f"--run {path} instead of --saved-model (or to kt.load_translator), or export "
            f"it first: keras-transformer export --run {path} --output DIR."
        )
    if os.path.isfile(path) and os.path.exists(os.path.join(os.path.dirname(os.path.abspath(path)), "saved_model.pb")):
        folder = os.path.dirname(path) or "."
        raise FileNotFoundError(
            f"{path} is a file of the SavedModel folder {folder}; pass the folder: --saved-model {folder}."
        )
    raise FileNotFoundError(
        f"{path} is not a SavedModel folder (no saved_model.pb); pass a folder "
        "written by `keras-transformer export`, e.g. saved_models/multi30k-en-de."
    )


def check_extra_train(extra_train):
    """`extra_train` (see `TrainingConfig`) as a list of `(src, tgt)` path
    tuples; None gives `[]`. TensorFlow-free.

    Raises:
        ValueError: if it is not a list of pairs of paths, saying the form.
    """
    if extra_train is None:
        return []
    form = ("`extra_train` must be a list of [source file, target file] pairs, e.g. "
            "[['train.en', 'train.hyp.de']]; on the command line --extra-train SRC TGT (repeatable)")
    if isinstance(extra_train, (str, bytes)) or not isinstance(extra_train, (list, tuple)):
        raise ValueError(f"{form}; got {extra_train!r}.")
    pairs = []
    for pair in extra_train:
        if (isinstance(pair, (str, bytes)) or not isinstance(pair, (list, tuple)) or len(pair) != 2
                or not all(isinstance(path, (str, os.PathLike)) for path in pair)):
            raise ValueError(f"{form}; got the entry {pair!r}.")
        pairs.append((os.fspath(pair[0]), os.fspath(pair[1])))
    return pairs


def check_user_defined_symbols(symbols):
    """`user_defined_symbols` (see `TrainingConfig`) as a list of `str`,
    or None for none (an empty list too). TensorFlow-free.

    Raises:
        ValueError: for a string instead of a list, an entry that is not a
            non-empty string without whitespace, a repeated entry, or one
            of the special pieces (`<pad>`, `<unk>`, `<s>`, `</s>`).
    """
    if symbols is None:
        return None
    if isinstance(symbols, (str, bytes)) or not isinstance(symbols, (list, tuple)):
        raise ValueError(f"`user_defined_symbols` must be a list of pieces, e.g. ['<BT>']; on the command "
                         f"line --user-defined-symbols '<BT>'; got {symbols!r}.")
    for symbol in symbols:
        if not isinstance(symbol, str) or not symbol or any(c.isspace() for c in symbol):
            raise ValueError(f"Each of `user_defined_symbols` must be a non-empty piece without whitespace "
                             f"(SentencePiece keeps it whole), e.g. '<BT>'; got {symbol!r}.")
    if len(set(symbols)) < len(symbols):
        raise ValueError(f"`user_defined_symbols` names a piece twice: {list(symbols)!r}.")
    special = sorted(set(symbols) & {"<pad>", "<unk>", "<s>", "</s>"})
    if special:
        raise ValueError(f"`user_defined_symbols` names the special piece(s) {special}, which every "
                         "vocabulary has already; choose another piece, e.g. '<BT>'.")
    return list(symbols) or None


def read_json_file(path):
    """The JSON value stored in `path` (a run's `config.json`, say).

    Raises:
        ValueError: naming the file, when it is not valid JSON (a save cut
            off, an edit that broke it); JSON's own message named no file.
        OSError: if it cannot be read.
    """
    with open(path) as f:
        text = f.read()
    try:
        return json.loads(text)
    except ValueError as error:
        raise ValueError(f"{path} is damaged: it is not valid JSON ({error}). Restore it from a copy; "
                         "a run's config.json is written again by `train` with the run's flags and "
                         "training files.") from None


def check_files(*paths):
    """Raise before any work if a text file to read is not there;
    TensorFlow-free.

    Args:
        *paths: str or path-like; None entries (optional files) are skipped.

    Raises:
        FileNotFoundError: naming the first path that is not a file.
    """
    for path in paths:
        if path is not None and not os.path.isfile(path):
            raise FileNotFoundError(f"{path} is not a file; pass a text file (plain or .gz).")
