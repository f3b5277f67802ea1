"""Sweep training settings on the validation set only, and tabulate them.

    python examples/sweep.py --pair en-de --epochs 30 \
        --grid dropout_rate=0.1,0.3 --grid lr_scale=0.5,1.0

Each combination of the `--grid` values is one run of the `multi30k.py`
recipe with those `TrainingConfig` fields replaced (any field: `d_model`,
`num_layers`, `src_vocab_size`, `warmup_steps`, `dropout_rate`, ...), in its
own run folder under `--root`, so an interrupted sweep resumes where it
stopped. Its best val loss and best val BLEU (greedy, logged every
`bleu_every` epochs) go to `<root>/sweep.md`, one row per run. Beam size
and length penalty are chosen on val by `multi30k.py ship`. The test sets
are never read.
"""

import argparse
import dataclasses
import itertools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from multi30k import build_parser  # noqa: E402
from multi30k import config_for  # noqa: E402
from multi30k import positive_int  # noqa: E402
from multi30k import require_corpus  # noqa: E402

from keras_transformer.checkpoints import epoch_log  # noqa: E402
from keras_transformer.training import TrainingConfig, train  # noqa: E402


def parse_grid(items):
    """`["a=1,2", "b=x"]` -> `{"a": [1, 2], "b": ["x"]}`, values typed as the
    `TrainingConfig` field's default (int, float, bool or str)."""
    fields = {f.name: f for f in dataclasses.fields(TrainingConfig)}
    grid = {}
    for item in items:
        name, _, values = item.partition("=")
        if name not in fields or not values:
            raise SystemExit(f"--grid {item!r}: expected FIELD=V1,V2 with a TrainingConfig field")
        kind = {int: int, float: float, bool: lambda v: v.lower() in ("1", "true", "yes")}
        convert = kind.get(fields[name].type, str)
        try:
            grid[name] = [convert(v) for v in values.split(",")]
        except ValueError:
            raise SystemExit(f"--grid {item!r}: {name} takes {getattr(fields[name].type, '__name__', 'str')} "
                             "values") from None
    return grid


def summary(run_dir):
    log = epoch_log(run_dir).values()
    losses = [r["val_loss"] for r in log if "val_loss" in r]
    bleus = [r["val_bleu"] for r in log if "val_bleu" in r]
    return {"epochs": len(log), "best_val_loss": round(min(losses), 4) if losses else None,
            "best_val_bleu": round(max(bleus), 2) if bleus else None,
            "hours": round(sum(r.get("seconds", 0) for r in log) / 3600, 2)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.environ.get("MULTI30K_DIR", "../shared/data/multi30k"))
    parser.add_argument("--pair", default="en-de", choices=["en-de", "de-en", "en-fr"])
    parser.add_argument("--root", help="folder of the sweep's runs (default: runs/sweep-PAIR)")
    parser.add_argument("--epochs", type=positive_int, default=30)
    parser.add_argument("--grid", action="append", default=[], metavar="FIELD=V1,V2")
    args = parser.parse_args()
    root = args.root or f"runs/sweep-{args.pair}"
    grid = parse_grid(args.grid)
    # The recipe: multi30k.py's defaults, for this pair, data and epochs.
    recipe = build_parser().parse_args(["--data", args.data, "--pair", args.pair,
                                        "--epochs", str(args.epochs), "train"])
    require_corpus(recipe)
    os.makedirs(root, exist_ok=True)
    rows = []
    for values in itertools.product(*grid.values()):
        setting = dict(zip(grid, values))
        name = "_".join(f"{k}-{v}" for k, v in setting.items()) or "recipe"
        recipe.run = os.path.join(root, name)
        config = dataclasses.replace(config_for(recipe), **setting)
        train(config, verbose=2)
        rows.append({**setting, **summary(recipe.run)})
        print(json.dumps(rows[-1]), flush=True)
        write_table(root, grid, rows)


def write_table(root, grid, rows):
    columns = [*grid, "epochs", "best_val_loss", "best_val_bleu", "hours"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(row.get(c)) for c in columns) + " |" for row in rows]
    with open(os.path.join(root, "sweep.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
