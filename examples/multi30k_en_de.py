"""Train, evaluate and ship the Multi30k English->German model.

    python examples/multi30k_en_de.py --data ../shared/data/multi30k train
    python examples/multi30k_en_de.py --data ../shared/data/multi30k ship

`train` is resumable: run it again on the same `--run` folder to continue
after an interruption (or with a larger `--epochs`). `ship` exports the best
checkpoint (lowest validation loss) with float16 weight storage to
`saved_models/multi30k-en-de/`, translates val and test_2016_flickr with the
exported SavedModel (beam 4, length penalty 0.6), and writes `metrics.json`
and `MODEL_CARD.md` there. Nothing is tuned on the test set.
"""

import argparse
import json
import os
import platform
import shutil
import time

from keras_transformer.cli import _load_saved_model, evaluate_files
from keras_transformer.data.text_files import read_parallel
from keras_transformer.evaluation import corpus_scores
from keras_transformer.export import export_translator
from keras_transformer.training import TrainingConfig, load_run, train
from keras_transformer.translator import Translator

SLICE = 200  # test sentences the shipped-model test re-translates


def config_for(args):
    d = args.data
    return TrainingConfig(
        train_src=f"{d}/train.en.gz", train_tgt=f"{d}/train.de.gz",
        val_src=f"{d}/val.en.gz", val_tgt=f"{d}/val.de.gz",
        output_dir=args.run, preset="small", src_vocab_size=8000, tgt_vocab_size=8000,
        epochs=args.epochs, tokens_per_batch=4096, warmup_steps=800, lr_scale=0.5, max_length=64,
    )


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def ship(args):
    model, src, tgt, config = load_run(args.run, which="best")
    translator = Translator(model, src, tgt, beam_size=4, length_penalty=0.6)
    # Built in a fresh folder that replaces `args.output` only once the
    # evaluation is done: a failed ship leaves the old model in place, and
    # `size_bytes` counts this SavedModel's files, not an older card's.
    out = args.output.rstrip("/\\") + ".staging"
    if os.path.exists(out):
        shutil.rmtree(out)
    export_translator(translator, out, weights_dtype="float16")
    serve = _load_saved_model(out)
    d = args.data
    val = evaluate_files(serve, f"{d}/val.en.gz", f"{d}/val.de.gz")
    hypotheses_path = os.path.join(out, "test_2016_flickr.hyp.de")
    test = evaluate_files(
        serve, f"{d}/test_2016_flickr.en.gz", f"{d}/test_2016_flickr.de.gz", output=hypotheses_path
    )
    with open(hypotheses_path, encoding="utf-8") as f:
        hypotheses = f.read().splitlines()
    os.remove(hypotheses_path)  # keep the SavedModel folder clean
    _, references = read_parallel(f"{d}/test_2016_flickr.en.gz", f"{d}/test_2016_flickr.de.gz")
    test_slice = corpus_scores(hypotheses[:SLICE], references[:SLICE])
    epochs = []
    with open(os.path.join(args.run, "epochs.jsonl")) as f:
        epochs = [json.loads(line) for line in f if line.strip()]
    best_epoch = min(epochs, key=lambda e: e.get("val_loss", float("inf")))
    size = sum(
        os.path.getsize(os.path.join(root, name))
        for root, _, names in os.walk(out) for name in names
    )
    metrics = {
        "test_2016_flickr": test, "val": val, f"test_2016_flickr_first_{SLICE}": test_slice,
        "epochs_trained": len(epochs), "best_epoch": best_epoch["epoch"],
        "steps": sum(e.get("steps", args.steps_per_epoch) for e in epochs),
        "train_seconds": round(sum(e["seconds"] for e in epochs)),
        "size_bytes": size, "hardware": f"{cpu_name()}, {os.cpu_count()} cores, no GPU",
        "model": config["model"], "training": config["training"],
    }
    with open(os.path.join(out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    write_card(out, metrics)
    if os.path.exists(args.output):
        shutil.rmtree(args.output)
    os.replace(out, args.output)
    print(json.dumps({k: metrics[k] for k in ("test_2016_flickr", "val")}, indent=2))


def write_card(out, m):
    t, v, mc, tc = m["test_2016_flickr"], m["val"], m["model"], m["training"]
    card = f"""# multi30k-en-de: a small Transformer, English -> German

Trained with keras-transformer on the Multi30k task-1 corpus (29,000 training
pairs), on a CPU. Exported SavedModel; signature `serving_default`: `text` (tf.string, a batch
`[None]` or one string) -> `translation` (tf.string [None]), `score` (float32 [None]).
Needs `tensorflow` and `tensorflow_text` only (SentencePiece ops in the graph).

## Results (beam 4, length penalty 0.6, translated by this SavedModel)

| set | sacreBLEU (cased, 13a) | BLEU lowercased | chrF |
|---|---|---|---|
| test_2016_flickr (1,000) | {t['bleu']:.2f} | {t['bleu_lowercase']:.2f} | {t['chrf']:.2f} |
| val (1,014) | {v['bleu']:.2f} | {v['bleu_lowercase']:.2f} | {v['chrf']:.2f} |

Detokenized output against the raw references. Signature: `{t['bleu_signature']}`.
The checkpoint was chosen by validation loss; nothing was tuned on the test set.

## Configuration

- Model: preset `small`: {mc['num_layers']} encoder + {mc['num_layers']} decoder layers (post-LN),
  d_model {mc['d_model']}, {mc['num_heads']} heads, dff {mc['dff']}, dropout {mc['dropout_rate']},
  max_length {mc['max_length']}; source vocabulary {mc['src_vocab_size']}, target {mc['tgt_vocab_size']}
  (separate SentencePiece unigram models, cased, no lowercasing).
- Training: `kt.Adam` (0.9, 0.98, 1e-9), `WarmupSchedule(d_model={mc['d_model']}, warmup_steps={tc['warmup_steps']},
  scale={tc['lr_scale']})`, label smoothing {tc['label_smoothing']}, length-bucketed batches of about
  {tc['tokens_per_batch']} tokens per side, seed {tc['seed']}.
- Trained {m['epochs_trained']} epochs ({m['steps']} steps); best validation loss at
  epoch {m['best_epoch']}, which is the shipped checkpoint.
- Wall time: {m['train_seconds'] / 3600:.1f} h of training ({m['train_seconds']} s, the validation
  after each epoch included) on {m['hardware']}.
- Weights stored in float16 (computation in float32); SavedModel size {m['size_bytes'] / 2**20:.1f} MiB.

## Reproduce

```bash
python examples/multi30k_en_de.py --data ../shared/data/multi30k --epochs {m['epochs_trained']} train
python examples/multi30k_en_de.py --data ../shared/data/multi30k ship
```

## Limitations

Multi30k is image-caption text: short, simple, descriptive sentences. Expect much
worse output on other domains. Inputs longer than {mc['max_length'] - 1} subword tokens are truncated.
"""
    with open(os.path.join(out, "MODEL_CARD.md"), "w") as f:
        f.write(card)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["train", "ship"])
    parser.add_argument("--data", default=os.environ.get("MULTI30K_DIR", "../shared/data/multi30k"))
    parser.add_argument("--run", default="runs/multi30k-en-de")
    parser.add_argument("--output", default="saved_models/multi30k-en-de")
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--steps-per-epoch", type=int, default=133,
                        help="steps of an epoch, for logs written before steps were recorded")
    args = parser.parse_args()
    if args.command == "train":
        start = time.time()
        train(config_for(args), verbose=2)
        print(f"trained in {time.time() - start:.0f} s")
    else:
        ship(args)


if __name__ == "__main__":
    main()
