"""Train, evaluate and ship a Multi30k model (en-de, de-en or en-fr).

    python examples/multi30k.py --data ../shared/data/multi30k --pair en-de train
    python examples/multi30k.py --data ../shared/data/multi30k --pair en-de ship
    python examples/multi30k.py --data ../shared/data/multi30k --pair en-de refresh

`train` runs `keras_transformer.training.train` with the recipe below into
`runs/multi30k-<pair>`; it is resumable: run it again on the same `--run`
folder to continue after an interruption (or with a larger `--epochs`).

The recipe, sized so that 2 CPU cores run about 50 epochs in 2 hours: 4 + 4
layers, d_model 128, 4 heads, dff 512 (near the "Transformer-Tiny" of Wu et
al., 2021, the best published small text-only model on Multi30k); one
SentencePiece vocabulary of 8,000 pieces for both sides, with the source
embedding, target embedding and output projection tied (section 3.4);
dropout 0.2 on the embeddings and sub-layer outputs, 0.1 on the attention
weights and the feed-forward activation; label smoothing 0.1; the warm-up
schedule (section 5.3) with 1,000 steps at scale 0.8 (a peak learning rate
of about 0.0022: at 2.5 times that, 0.005, this post-LN model stalled at a
validation loss of 4.05 by epoch 10); about 4,096 tokens per batch and
side; early stopping after 10 epochs without a lower validation loss, and
at most 2 hours of training (`--time-budget`, the epochs' seconds); the
last 10 epoch checkpoints averaged.

`ship` chooses, on val only, the checkpoint (`best` by validation loss or
`averaged`) and the search (beam size and length penalty from a small grid),
exports it with float16 weight storage to `saved_models/multi30k-<pair>/`,
translates val and test_2016_flickr with the exported SavedModel, and writes
`metrics.json` and `MODEL_CARD.md` there. Nothing is tuned on the test set.

`refresh` exports the shipped SavedModel again with this version of the
library (same weights, tokenizers and search) and rescores it; with
`--search BEAM:LP` (repeated), it first chooses the search again on val,
among the shipped one and those.
"""

import argparse
import contextlib
import json
import os
import shlex
import shutil
import sys
import time

from keras_transformer.callbacks import TrainingStopped
from keras_transformer.cli import _load_saved_model, _positive_int as positive_int, evaluate_files
from keras_transformer.data.text_files import read_parallel
from keras_transformer.devices import host_description
from keras_transformer.evaluation import corpus_scores
from keras_transformer.export import export_translator
from keras_transformer.languages import model_languages
from keras_transformer.precision import PRECISIONS
from keras_transformer.training import TrainingConfig, load_run, train
from keras_transformer.translator import Translator

SLICE = 200  # test sentences the shipped-model test re-translates


LANGUAGES = {"en": "English", "de": "German", "fr": "French"}
# What `ship` tries on val, unless `--search` names others: (beam_size, length_penalty).
SEARCHES = [(4, 0.6), (5, 1.0), (8, 1.0)]


def search_setting(text):
    """`--search BEAM:LP` -> `(beam_size, length_penalty)`."""
    try:
        beam, penalty = text.split(":")
        beam_size, length_penalty = int(beam), float(penalty)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not BEAM:LP; give a beam size and a length penalty, e.g. --search 5:1.0") from None
    if beam_size < 1 or not length_penalty >= 0:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the beam size must be 1 or more and the length penalty 0 or more, e.g. --search 5:1.0")
    return beam_size, length_penalty


def score_searches(model, src, tgt, searches, sources, references, label):
    """One row per `(beam_size, length_penalty)`: val BLEU and chrF of `model`."""
    rows = []
    for beam_size, length_penalty in searches:
        translator = Translator(model, src, tgt, beam_size=beam_size, length_penalty=length_penalty)
        scores = corpus_scores(translator.translate_lines(sources), references)
        rows.append({"checkpoint": label, "beam_size": beam_size, "length_penalty": length_penalty,
                     "val_bleu": round(scores["bleu"], 2), "val_chrf": round(scores["chrf"], 2)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def files(args, split):
    source, target = args.pair.split("-")
    return f"{args.data}/{split}.{source}.gz", f"{args.data}/{split}.{target}.gz"


def require_corpus(args):
    """SystemExit naming --data and MULTI30K_DIR when the pair's files are
    not in `args.data` (they failed later as a bare FileNotFoundError)."""
    for split in ("train", "val", "test_2016_flickr"):
        for path in files(args, split):
            if not os.path.exists(path):
                raise SystemExit(f"{path} does not exist: pass the Multi30k folder as --data, or set "
                                 "MULTI30K_DIR.")


def config_for(args):
    (train_src, train_tgt), (val_src, val_tgt) = files(args, "train"), files(args, "val")
    return TrainingConfig(
        train_src=train_src, train_tgt=train_tgt, val_src=val_src, val_tgt=val_tgt,
        output_dir=args.run, preset="small", num_layers=args.num_layers,
        num_decoder_layers=args.num_decoder_layers, d_model=args.d_model,
        num_heads=4, dff=args.dff,
        src_vocab_size=args.vocab_size, tgt_vocab_size=args.vocab_size,
        shared_vocab=True, tie_embeddings="all", dropout_rate=args.dropout_rate,
        attention_dropout_rate=0.1, activation_dropout_rate=0.1,
        norm_first=args.norm_first,
        epochs=args.epochs, tokens_per_batch=args.tokens_per_batch, warmup_steps=args.warmup_steps,
        lr_scale=args.lr_scale, sequence_length=64,
        early_stopping_patience=10, time_budget=args.time_budget,
        # The last 10 epochs averaged; all of them in a run of fewer.
        keep_checkpoints=10, average_last=min(10, args.epochs), bleu_every=5, subword_alpha=args.subword_alpha,
        bidirectional_epochs=args.bidirectional_epochs, cooldown_epochs=args.cooldown_epochs, seed=args.seed,
        extra_train=args.extra_train, user_defined_symbols=args.user_defined_symbols,
        precision=args.precision,
    )


def subword_note(tc):
    """The card's words for subword regularization, when the run used it."""
    if tc.get("subword_alpha") is None:
        return ""
    return f" subword regularization (Kudo, 2018) of the training pairs at alpha {tc['subword_alpha']:g},"


def bidirectional_note(tc):
    """The card's words for bidirectional training, when the run used it."""
    if not tc.get("bidirectional_epochs"):
        return ""
    return (f" bidirectional training (BiT, Ding et al., 2021): epochs 1-{tc['bidirectional_epochs']} on the "
            "pairs in both directions, the rest source to target,")


def extra_note(tc):
    """The card's words for extra (synthetic) training pairs, when the run had them."""
    pairs = tc.get("extra_train") or []
    if not pairs:
        return ""
    return (f" the Multi30k pairs together with {len(pairs)} file pair(s) of synthetic pairs of the same "
            "sentences (`--extra-train`; how they were made: docs/models.md, \"Synthetic training pairs\"; "
            "the time of the models that made them is not in the wall time below)"
            + (", the vocabulary's user-defined pieces "
               + ", ".join(f"`{symbol}`" for symbol in tc["user_defined_symbols"])
               + " kept whole (a tag before each back-translated source: tagged back-translation, "
                 "Caswell et al., 2019)" if tc.get("user_defined_symbols") else "")
            + ",")


def cooldown_note(tc):
    """The card's words for the learning-rate cooldown, when the run used it."""
    if not tc.get("cooldown_epochs"):
        return ""
    return f" the learning rate falling linearly to 0 over the last {tc['cooldown_epochs']} epochs,"


def recipe_flags(tc, mc):
    """The command-line flags that reproduce a run where it differs from the recipe.

    `tc` and `mc` are the run's training and model configs (dicts).
    """
    flags = ""
    if tc["tokens_per_batch"] != 4096:
        flags += f" --tokens-per-batch {tc['tokens_per_batch']}"
    if tc["warmup_steps"] != 1000:
        flags += f" --warmup-steps {tc['warmup_steps']}"
    if tc["lr_scale"] != 0.8:
        flags += f" --lr-scale {tc['lr_scale']}"
    if tc.get("norm_first"):
        flags += " --norm-first"
    if tc.get("subword_alpha") is not None:
        flags += f" --subword-alpha {tc['subword_alpha']:g}"
    if tc.get("bidirectional_epochs"):
        flags += f" --bidirectional-epochs {tc['bidirectional_epochs']}"
    if tc.get("cooldown_epochs"):
        flags += f" --cooldown-epochs {tc['cooldown_epochs']}"
    if mc.get("dropout_rate", 0.2) != 0.2:
        flags += f" --dropout-rate {mc['dropout_rate']:g}"
    if tc.get("seed", 0) != 0:
        flags += f" --seed {tc['seed']}"
    if tc.get("src_vocab_size", 8000) != 8000:
        flags += f" --vocab-size {tc['src_vocab_size']}"
    for flag, key, recipe in (("--d-model", "d_model", 128), ("--num-layers", "num_layers", 4),
                              ("--dff", "dff", 512)):
        if mc.get(key, recipe) != recipe:
            flags += f" {flag} {mc[key]}"
    if mc.get("num_decoder_layers") is not None:
        flags += f" --num-decoder-layers {mc['num_decoder_layers']}"
    if tc.get("user_defined_symbols"):
        flags += "".join(f" --user-defined-symbols {shlex.quote(s)}" for s in tc["user_defined_symbols"])
    for extra_src, extra_tgt in tc.get("extra_train") or []:
        flags += f" --extra-train {shlex.quote(extra_src)} {shlex.quote(extra_tgt)}"
    if tc.get("precision", "auto") != "auto":
        flags += f" --precision {tc['precision']}"
    if tc.get("time_budget") not in (None, 7200):
        flags += f" --time-budget {tc['time_budget']:g}"
    return flags


def training_hardware(epochs):
    """Where the run trained, from its epoch records (every machine a
    resumed run went on, in order); records written before epochs held it
    give this machine's, said to be the shipping machine."""
    machines = list(dict.fromkeys(e["hardware"] for e in epochs if e.get("hardware")))
    if not machines:
        return f"{host_description()} (the machine that shipped it; the training machine was not recorded)"
    if any(not e.get("hardware") for e in epochs):
        machines.append("a machine not recorded for the earlier epochs")
    return "; ".join(machines)


def choose_on_val(args):
    """The checkpoint and search with the best val BLEU: `(which, beam_size,
    length_penalty, table)`, the table listing every candidate's scores."""
    val_src, val_tgt = files(args, "val")
    sources, references = read_parallel(val_src, val_tgt)
    table = []
    for which in ("best", "averaged"):
        if which == "averaged" and not os.path.exists(os.path.join(args.run, "averaged.keras")):
            continue
        model, src, tgt, _ = load_run(args.run, which=which)
        table += score_searches(model, src, tgt, args.search or SEARCHES, sources, references, which)
    top = max(table, key=lambda row: row["val_bleu"])
    return top["checkpoint"], top["beam_size"], top["length_penalty"], table


def ship(args):
    if not os.path.exists(os.path.join(args.run, "config.json")):
        raise SystemExit(f"{args.run} is not a training run folder (no config.json): pass the --run "
                         "that `train` wrote (default runs/multi30k-PAIR).")
    trained = model_languages(args.run)
    if trained is not None and "-".join(trained) != args.pair:
        raise SystemExit(f"{args.run} was trained {'-'.join(trained)} and --pair is {args.pair}: pass "
                         f"--pair {'-'.join(trained)}.")
    which, beam_size, length_penalty, table = choose_on_val(args)
    model, src, tgt, config = load_run(args.run, which=which)
    translator = Translator(model, src, tgt, beam_size=beam_size, length_penalty=length_penalty)
    epochs = []
    with open(os.path.join(args.run, "epochs.jsonl")) as f:
        epochs = [json.loads(line) for line in f if line.strip()]
    best_epoch = min(epochs, key=lambda e: e.get("val_loss", float("inf")))
    facts = {
        "epochs_trained": len(epochs), "best_epoch": best_epoch["epoch"],
        "steps": sum(e.get("steps", args.steps_per_epoch) for e in epochs),
        "train_seconds": round(sum(e["seconds"] for e in epochs)),
        "hardware": training_hardware(epochs),
        "model": config["model"], "training": config["training"],
        "pair": args.pair, "checkpoint": which,
        "search": {"beam_size": beam_size, "length_penalty": length_penalty},
        "chosen_on_val": table,
    }
    export_and_describe(args, translator, facts)


def refresh(args):
    """Export the shipped model again with this version of the library (the
    same weights, tokenizers and search: what serving does around them, such
    as input normalisation, is this version's), translate val and test with
    it, and rewrite its `metrics.json` and card; the training facts stay.
    With `--search`, the search is chosen again on val, among the shipped
    one and those, before the export."""
    from keras_transformer.loading import translator_from_saved_model

    for name in ("metrics.json", "keras_transformer.json"):
        if not os.path.exists(os.path.join(args.output, name)):
            raise SystemExit(f"{args.output} holds no {name}: refresh takes a model that `ship` wrote "
                             "(--output, default saved_models/multi30k-PAIR).")
    with open(os.path.join(args.output, "metrics.json")) as f:
        facts = json.load(f)
    with open(os.path.join(args.output, "keras_transformer.json")) as f:
        decoding = json.load(f)["decoding"]
    # The shipped model's own pair: scored on another's files, its card got the
    # scores of the wrong language pair (a new-user trial).
    shipped = facts.get("pair") or ("-".join(model_languages(args.output)) if model_languages(args.output) else None)
    if shipped is not None and shipped != args.pair:
        raise SystemExit(f"{args.output} translates {shipped} and --pair is {args.pair}: pass --pair {shipped}.")
    search = facts.setdefault("search", {"beam_size": decoding["beam_size"],
                                         "length_penalty": decoding["length_penalty"]})
    facts.setdefault("pair", args.pair)
    translator = translator_from_saved_model(args.output, beam_size=search["beam_size"],
                                             length_penalty=search["length_penalty"])
    if args.search:  # choose the search again, on val only, among the shipped one and these
        current = (search["beam_size"], search["length_penalty"])
        candidates = [current] + [s for s in dict.fromkeys(args.search) if s != current]
        rows = score_searches(translator.model, translator.src_tokenizer, translator.tgt_tokenizer,
                              candidates, *read_parallel(*files(args, "val")), "shipped weights")
        top = max(rows, key=lambda row: row["val_bleu"])  # a tie keeps the shipped search
        facts["searches_on_val"] = rows
        if (top["beam_size"], top["length_penalty"]) != current:
            search = facts["search"] = {"beam_size": top["beam_size"], "length_penalty": top["length_penalty"]}
            translator = Translator(translator.model, translator.src_tokenizer, translator.tgt_tokenizer,
                                    **search)
    facts["exported_again_by"] = "examples/multi30k.py refresh"
    with open(os.path.join(args.output, "MODEL_CARD.md"), encoding="utf-8") as f:
        card = f.read()
    export_and_describe(args, translator, facts, lambda out, m: refresh_card(out, m, card))


def refresh_card(out, m, card):
    """The shipped card with its results rows replaced by `m`'s."""
    import re

    t, v, search = m["test_2016_flickr"], m["val"], m["search"]
    card = re.sub(r"translated by this SavedModel: beam \d+, length penalty [\d.]+\)",
                  f"translated by this SavedModel: beam {search['beam_size']}, "
                  f"length penalty {search['length_penalty']})", card)
    card = re.sub(r"\| test_2016_flickr \(1,000\) \|.*\|",
                  f"| test_2016_flickr (1,000) | {t['bleu']:.2f} | {t['bleu_lowercase']:.2f} | {t['chrf']:.2f} |", card)
    card = re.sub(r"\| val \(1,014\) \|.*\|",
                  f"| val (1,014) | {v['bleu']:.2f} | {v['bleu_lowercase']:.2f} | {v['chrf']:.2f} |", card)
    note = ("\nExported again by `python examples/multi30k.py --pair " + m["pair"] + " refresh` with this "
            "version of the library: the same weights and tokenizers, with this version's input "
            "normalisation (NFC, Unicode spaces, invisible and control characters) and decoder; the figures above "
            "are this SavedModel's.\n")
    card = card.replace("\n## Configuration", note + "\n## Configuration", 1) if "Exported again" not in card else card
    if m.get("searches_on_val"):
        rows = "\n".join(f"| {r['beam_size']} | {r['length_penalty']} | {r['val_bleu']:.2f} | {r['val_chrf']:.2f} |"
                         for r in m["searches_on_val"])
        section = ("## Search chosen again on val\n\n`refresh --search ...` translated val with the shipped "
                   "weights (stored in float16) under each of these searches and kept the best (a tie keeps the "
                   "first, the search shipped before); the test set was translated once, by the resulting "
                   "SavedModel.\n\n| beam size | length penalty | val BLEU | val chrF |\n|---|---|---|---|\n"
                   f"{rows}\n\n")
        card = re.sub(r"## Search chosen again on val\n.*?\n\n(?=## )", "", card, flags=re.S)
        card = card.replace("## Configuration", section + "## Configuration", 1)
        # Reproduce: the refresh that chose this search follows the ship line.
        card = re.sub(r"python examples/multi30k\.py [^\n]* refresh --search [^\n]*\n", "", card)
        flags = " ".join(f"--search {r['beam_size']}:{r['length_penalty']}" for r in m["searches_on_val"][1:])
        if flags:
            # The refresh line is the ship line's, without ship's own searches.
            card = re.sub(r"(python examples/multi30k\.py [^\n]* --pair (\S+) ship\n)",
                          lambda g: g.group(1) + re.sub(r" --search \S+", "", g.group(1)[:-len(" ship\n")])
                          + f" refresh {flags}\n", card)
    with open(os.path.join(out, "MODEL_CARD.md"), "w", encoding="utf-8") as f:
        f.write(card)


def export_and_describe(args, translator, facts, describe=None):
    """Export `translator` (float16 weights) to `args.output`, translate val
    and test with the SavedModel, and write `metrics.json` and the card."""
    # Built in a fresh folder that replaces `args.output` only once the
    # evaluation is done: a failed ship leaves the old model in place, and
    # `size_bytes` counts this SavedModel's files, not an older card's.
    out = args.output.rstrip("/\\") + ".staging"
    if os.path.exists(out):
        shutil.rmtree(out)
    export_translator(translator, out, weights_dtype="float16", languages=tuple(facts["pair"].split("-")))
    serve = _load_saved_model(out)
    hypotheses_path = os.path.join(out, "test_2016_flickr.hyp")
    with contextlib.redirect_stdout(sys.stderr):  # progress bars; stdout is the scores
        val = evaluate_files(serve, *files(args, "val"))
        test = evaluate_files(serve, *files(args, "test_2016_flickr"), output=hypotheses_path)
    with open(hypotheses_path, encoding="utf-8") as f:
        hypotheses = f.read().splitlines()
    os.remove(hypotheses_path)  # keep the SavedModel folder clean
    _, references = read_parallel(*files(args, "test_2016_flickr"))
    test_slice = corpus_scores(hypotheses[:SLICE], references[:SLICE])
    size = sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(out) for name in names
    )
    metrics = {
        **facts, "test_2016_flickr": test, "val": val, f"test_2016_flickr_first_{SLICE}": test_slice,
        "size_bytes": size,
    }
    with open(os.path.join(out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    (describe or write_card)(out, metrics)
    if os.path.exists(args.output):
        shutil.rmtree(args.output)
    os.replace(out, args.output)
    print(json.dumps({k: metrics[k] for k in ("test_2016_flickr", "val")}, indent=2))


def ship_search_flags(m):
    """The `--search` flags of the grid `ship` chose from (`m["chosen_on_val"]`),
    or "" for its default grid."""
    tried = list(dict.fromkeys((r["beam_size"], r["length_penalty"]) for r in m["chosen_on_val"]))
    if tried == SEARCHES:
        return ""
    return "".join(f" --search {beam}:{penalty:g}" for beam, penalty in tried)


def write_card(out, m):
    t, v, mc, tc = m["test_2016_flickr"], m["val"], m["model"], m["training"]
    source, target = m["pair"].split("-")
    search = m["search"]
    tried = "\n".join(
        f"| {r['checkpoint']} | {r['beam_size']} | {r['length_penalty']} | {r['val_bleu']:.2f} | {r['val_chrf']:.2f} |"
        for r in m["chosen_on_val"]
    )
    card = f"""# multi30k-{m['pair']}: a small Transformer, {LANGUAGES[source]} -> {LANGUAGES[target]}

Trained with keras-transformer on the Multi30k task-1 corpus (29,000 training
pairs), on a CPU. Exported SavedModel; signature `serving_default`: `text` (tf.string, a batch
`[None]` or one string) -> `translation` (tf.string [None]), `score` (float32 [None]).
Needs `tensorflow` and `tensorflow_text` only (SentencePiece ops in the graph).

## Results (translated by this SavedModel: beam {search['beam_size']}, length penalty {search['length_penalty']})

| set | sacreBLEU (cased, 13a) | BLEU lowercased | chrF |
|---|---|---|---|
| test_2016_flickr (1,000) | {t['bleu']:.2f} | {t['bleu_lowercase']:.2f} | {t['chrf']:.2f} |
| val (1,014) | {v['bleu']:.2f} | {v['bleu_lowercase']:.2f} | {v['chrf']:.2f} |

Detokenized output against the raw references. Signature: `{t['bleu_signature']}`.

## Chosen on val only

The checkpoint and the search were picked by val BLEU among these; the test
set was translated once, by the chosen SavedModel.

| checkpoint | beam size | length penalty | val BLEU | val chrF |
|---|---|---|---|---|
{tried}

## Configuration

- Model: preset `small`: {mc['num_layers']} encoder + {mc.get('num_decoder_layers') or mc['num_layers']} decoder layers ({'pre-LN' if mc.get('norm_first') else 'post-LN'}),
  d_model {mc['d_model']}, {mc['num_heads']} heads, dff {mc['dff']}; dropout {mc['dropout_rate']}
  (attention {mc.get('attention_dropout_rate')}, feed-forward activation {mc.get('activation_dropout_rate')});
  sequence_length {mc.get('sequence_length', mc.get('max_length'))}; vocabulary {mc['src_vocab_size']} (source) / {mc['tgt_vocab_size']} (target),
  {'one SentencePiece model for both sides' if tc.get('shared_vocab') else 'separate SentencePiece models'};
  tied embeddings: {mc.get('tie_embeddings', 'none')}; cased, no lowercasing.
- Training: `kt.Adam` (0.9, 0.98, 1e-9), `WarmupSchedule(d_model={mc['d_model']}, warmup_steps={tc['warmup_steps']},
  scale={tc['lr_scale']})`, label smoothing {tc['label_smoothing']},{subword_note(tc)}{extra_note(tc)}{bidirectional_note(tc)}{cooldown_note(tc)} length-bucketed batches of about
  {tc['tokens_per_batch']} tokens per side, dtype policy `{mc.get('dtype', 'float32')}`, seed {tc['seed']}; early stopping patience
  {tc.get('early_stopping_patience')}; the last {tc.get('average_last')} epoch checkpoints averaged.
- Trained {m['epochs_trained']} epochs ({m['steps']} steps); best validation loss at
  epoch {m['best_epoch']}; shipped checkpoint: `{m['checkpoint']}`.
- Wall time: {m['train_seconds'] / 3600:.1f} h of training ({m['train_seconds']} s, the validation
  after each epoch included) on {m['hardware']}.
- Weights stored in float16 (computation in float32); SavedModel size {m['size_bytes'] / 2**20:.1f} MiB.

## Reproduce

```bash
python examples/multi30k.py --data ../shared/data/multi30k --pair {m['pair']} --epochs {tc['epochs']}{recipe_flags(tc, mc)} train
python examples/multi30k.py --data ../shared/data/multi30k{ship_search_flags(m)} --pair {m['pair']} ship
keras-transformer evaluate --saved-model saved_models/multi30k-{m['pair']} \\
    --src ../shared/data/multi30k/test_2016_flickr.{source}.gz --ref ../shared/data/multi30k/test_2016_flickr.{target}.gz
```

## Limitations

Multi30k is image-caption text: short, simple, descriptive sentences. Expect much
worse output on other domains. Inputs longer than {mc.get('sequence_length', mc.get('max_length')) - 1} subword tokens are truncated.
"""
    with open(os.path.join(out, "MODEL_CARD.md"), "w") as f:
        f.write(card)


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["train", "ship", "refresh"],
                        help="train; ship the run's model; or refresh: export the shipped model again "
                             "with this version of the library")
    parser.add_argument("--data", default=os.environ.get("MULTI30K_DIR", "../shared/data/multi30k"))
    parser.add_argument("--pair", default="en-de", choices=["en-de", "de-en", "en-fr"])
    parser.add_argument("--run", help="run folder (default: runs/multi30k-PAIR)")
    parser.add_argument("--output", help="SavedModel folder (default: saved_models/multi30k-PAIR)")
    parser.add_argument("--epochs", type=positive_int, default=60,
                        help="epochs at most (the recipe: 60; early stopping and --time-budget end it sooner)")
    parser.add_argument("--tokens-per-batch", type=int, default=4096,
                        help="tokens per batch and side (the recipe: 4096)")
    parser.add_argument("--warmup-steps", type=int, default=1000,
                        help="warm-up steps of the learning-rate schedule (the recipe: 1000)")
    parser.add_argument("--lr-scale", type=float, default=0.8,
                        help="factor on the learning-rate schedule (the recipe: 0.8)")
    parser.add_argument("--norm-first", action="store_true",
                        help="pre-LN blocks instead of the recipe's post-LN")
    parser.add_argument("--subword-alpha", type=float,
                        help="subword regularization of the training pairs, alpha in (0, 1] "
                             "(the recipe: off)")
    parser.add_argument("--bidirectional-epochs", type=int, default=0,
                        help="bidirectional training (BiT): the first N epochs on the pairs in both "
                             "directions, twice the steps (the recipe: 0, off)")
    parser.add_argument("--cooldown-epochs", type=int, default=0,
                        help="the learning rate falls linearly to 0 over the last N of --epochs; choose "
                             "--epochs that fit --time-budget (the recipe: 0, off)")
    parser.add_argument("--time-budget", type=float, default=7200,
                        help="seconds of training (the epochs' seconds, a resumed run's included): stop "
                             "at the epoch end after which the next epoch would pass it (the recipe: 7200)")
    parser.add_argument("--steps-per-epoch", type=int, default=133,
                        help="steps of an epoch, for logs written before steps were recorded")
    parser.add_argument("--dropout-rate", type=float, default=0.2,
                        help="dropout on the embeddings and sub-layer outputs (the recipe: 0.2)")
    parser.add_argument("--seed", type=int, default=0,
                        help="random seed of the weights, dropout and batch order (the recipe: 0)")
    parser.add_argument("--d-model", type=int, default=128,
                        help="model width; 256 or more trains in mixed_bfloat16 on a CPU with bfloat16 "
                             "instructions (the recipe: 128)")
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="training precision (keras_transformer.precision); auto: mixed_bfloat16 from "
                             "d_model 256 on a CPU with bfloat16 instructions, else float32 (the recipe: auto)")
    parser.add_argument("--num-layers", type=int, default=4,
                        help="encoder layers, and as many decoder layers unless --num-decoder-layers "
                             "(the recipe: 4)")
    parser.add_argument("--num-decoder-layers", type=int, default=None,
                        help="decoder layers (default: --num-layers)")
    parser.add_argument("--dff", type=int, default=512,
                        help="feed-forward width (the recipe: 512)")
    parser.add_argument("--extra-train", nargs=2, action="append", metavar=("SRC", "TGT"),
                        help="more aligned training files trained on beside the pair's (repeatable): "
                             "a model's translations of the training sources, or back-translations")
    parser.add_argument("--user-defined-symbols", action="append", metavar="PIECE",
                        help="a piece added to the vocabulary and never split (repeatable), e.g. '<BT>' for tagged "
                             "back-translation (the tag written before each line of a back-translated "
                             "--extra-train source file)")
    parser.add_argument("--search", type=search_setting, action="append", metavar="BEAM:LP",
                        help="a beam size and length penalty to try on val (repeat it for a grid); ship: "
                             "instead of its default three; refresh: beside the shipped model's own, keeping "
                             "the best on val")
    parser.add_argument("--vocab-size", type=int, default=8000,
                        help="pieces of the SentencePiece model shared by both sides (the recipe: 8000)")
    return parser


def main():
    args = build_parser().parse_args()
    args.run = args.run or f"runs/multi30k-{args.pair}"
    args.output = args.output or f"saved_models/multi30k-{args.pair}"
    require_corpus(args)
    if args.command == "train":
        start = time.time()
        try:
            train(config_for(args), verbose=2)
        except TrainingStopped as stopped:  # SIGTERM: saved; the same command resumes
            print(f"{stopped}. Run the same command again to resume.", file=sys.stderr)
            sys.exit(128 + stopped.signum)
        print(f"trained in {time.time() - start:.0f} s")
    elif args.command == "ship":
        ship(args)
    else:
        refresh(args)


if __name__ == "__main__":
    main()
