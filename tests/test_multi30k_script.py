"""examples/multi30k.py: its flags reach the run's config, and the card's command reproduces them."""

import dataclasses
import importlib.util
import shlex
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "multi30k.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("multi30k_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def config(script, flags):
    args = script.build_parser().parse_args(shlex.split(flags) + ["train"])
    args.run = "runs/x"
    return script.config_for(args)


def model_config(c):
    return {"dropout_rate": c.dropout_rate, "d_model": c.d_model, "num_layers": c.num_layers, "dff": c.dff,
            "num_decoder_layers": c.num_decoder_layers}


def test_defaults_are_the_recipe(script):
    c = config(script, "")
    assert (c.dropout_rate, c.attention_dropout_rate, c.activation_dropout_rate, c.seed) == (0.2, 0.1, 0.1, 0)
    assert (c.src_vocab_size, c.tgt_vocab_size, c.shared_vocab) == (8000, 8000, True)
    assert (c.num_layers, c.d_model, c.num_heads, c.dff) == (4, 128, 4, 512)
    assert script.recipe_flags(dataclasses.asdict(c), model_config(c)) == ""


@pytest.mark.parametrize("flags", [
    "--dropout-rate 0.3 --seed 7",
    "--warmup-steps 2000 --lr-scale 2 --norm-first --subword-alpha 0.3 --dropout-rate 0.25 --vocab-size 5000 --seed 1",
    "--d-model 256 --num-layers 3 --dff 1024 --norm-first --dropout-rate 0.3 --seed 2",
    "--num-layers 6 --num-decoder-layers 2 --norm-first --dropout-rate 0.2 --seed 3",
    "--norm-first --subword-alpha 0.3 --bidirectional-epochs 14 --dropout-rate 0.2 --seed 4",
    "--norm-first --subword-alpha 0.3 --cooldown-epochs 20 --dropout-rate 0.2 --seed 5",
    "--norm-first --extra-train kd.en kd.de --extra-train 'b t.en' bt.de --dropout-rate 0.2 --seed 6",
    "--norm-first --user-defined-symbols '<BT>' --user-defined-symbols '<FT>' --extra-train bt.en bt.de "
    "--dropout-rate 0.2 --seed 8",
    "--norm-first --precision mixed_bfloat16 --dropout-rate 0.2 --seed 9",
])
def test_card_command_reproduces_the_flags(script, flags):
    c = config(script, flags)
    assert c.dropout_rate == float(shlex.split(flags)[shlex.split(flags).index("--dropout-rate") + 1])
    assert c.seed == int(shlex.split(flags)[-1])
    # The other two rates stay the recipe's: --dropout-rate sets the residual/embedding rate only.
    assert (c.attention_dropout_rate, c.activation_dropout_rate) == (0.1, 0.1)
    again = script.recipe_flags(dataclasses.asdict(c), model_config(c))
    assert config(script, again) == c


def test_search_flags_parse_to_a_grid(script):
    args = script.build_parser().parse_args(["--search", "6:1.2", "--search", "10:0", "refresh"])
    assert args.search == [(6, 1.2), (10, 0.0)]
    assert script.build_parser().parse_args(["ship"]).search is None  # ship's default grid


@pytest.mark.parametrize("text", ["5", "5:x", "0:1.0", "4:-0.5", "4:nan", "4.5:1.0"])
def test_bad_search_flags_are_refused(script, text, capsys):
    with pytest.raises(SystemExit):
        script.build_parser().parse_args(["--search", text, "refresh"])
    assert "e.g. --search 5:1.0" in capsys.readouterr().err


CARD = """# multi30k-en-de

## Results (translated by this SavedModel: beam 5, length penalty 1.0)

| set | sacreBLEU (cased, 13a) | BLEU lowercased | chrF |
|---|---|---|---|
| test_2016_flickr (1,000) | 40.33 | 40.78 | 65.30 |
| val (1,014) | 43.08 | 43.29 | 65.50 |

## Chosen on val only

| best | 5 | 1.0 | 43.03 | 65.49 |

## Configuration

- Model

## Reproduce

```bash
python examples/multi30k.py --data ../shared/data/multi30k --pair en-de --epochs 150 train
python examples/multi30k.py --data ../shared/data/multi30k --pair en-de ship
keras-transformer evaluate --saved-model saved_models/multi30k-en-de
```
"""


def scores(bleu):
    return {"bleu": bleu, "bleu_lowercase": bleu + 0.5, "chrf": 60.0}


def test_refresh_card_records_the_search_chosen_again(script, tmp_path):
    rows = [{"checkpoint": "shipped weights", "beam_size": 5, "length_penalty": 1.0, "val_bleu": 43.0,
             "val_chrf": 65.5},
            {"checkpoint": "shipped weights", "beam_size": 6, "length_penalty": 1.2, "val_bleu": 43.25,
             "val_chrf": 65.6}]
    m = {"pair": "en-de", "search": {"beam_size": 6, "length_penalty": 1.2}, "searches_on_val": rows,
         "test_2016_flickr": scores(40.5), "val": scores(43.31)}
    script.refresh_card(str(tmp_path), m, CARD)
    card = (tmp_path / "MODEL_CARD.md").read_text()
    assert "translated by this SavedModel: beam 6, length penalty 1.2)" in card
    assert "| test_2016_flickr (1,000) | 40.50 | 41.00 | 60.00 |" in card
    assert "| val (1,014) | 43.31 | 43.81 | 60.00 |" in card
    assert "| 5 | 1.0 | 43.00 | 65.50 |\n| 6 | 1.2 | 43.25 | 65.60 |\n\n## Configuration" in card
    # Reproduce names the searches that refresh chose among.
    assert ("--pair en-de ship\npython examples/multi30k.py --data ../shared/data/multi30k --pair en-de "
            "refresh --search 6:1.2\nkeras-transformer evaluate") in card
    # Done again, the card keeps one such section, with the new rows, and the rest as it was.
    m["searches_on_val"] = rows[:1]
    m["search"] = {"beam_size": 5, "length_penalty": 1.0}
    script.refresh_card(str(tmp_path), m, card)
    again = (tmp_path / "MODEL_CARD.md").read_text()
    assert again.count("## Search chosen again on val") == 1 and "| 6 | 1.2 |" not in again
    assert "beam 5, length penalty 1.0)" in again and again.count("Exported again") == 1
    assert again.split("## Chosen on val only")[0].count("## ") == 1
    assert again.split("## Configuration")[1] == CARD.split("## Configuration")[1]  # one search: no refresh line


def test_card_hardware_is_where_the_epochs_trained(script, monkeypatch):
    monkeypatch.setattr(script, "host_description", lambda: "Shipper CPU, 2 cores, no GPU")
    a, b = "Xeon X, 2 cores, no GPU", "EPYC Y, 2 cores, no GPU"
    assert script.training_hardware([{"hardware": a}, {"hardware": a}, {"hardware": b}]) == f"{a}; {b}"
    assert script.training_hardware([{}, {"hardware": b}]) == f"{b}; a machine not recorded for the earlier epochs"
    unrecorded = script.training_hardware([{"epoch": 1}])
    assert unrecorded.startswith("Shipper CPU, 2 cores, no GPU (the machine that shipped it;")


def test_a_run_of_fewer_than_10_epochs_averages_them_all(script):
    """`--epochs 5` met the recipe's 10 averaged epochs and was refused (a
    new-user trial, after `train` began refusing average_last > epochs)."""
    assert (config(script, "--epochs 5").average_last, config(script, "").average_last) == (5, 10)
    with pytest.raises(SystemExit):
        script.build_parser().parse_args(["--epochs", "0", "train"])


def test_sweep_runs_the_recipe_with_the_grid_fields_replaced(script, tmp_path, monkeypatch):
    """sweep.py failed on every run: it handed its own arguments, which lack
    the recipe's, to `config_for` (AttributeError: no num_layers; a new-user
    trial). Each grid point is the recipe with those fields replaced."""
    import sys

    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("sweep_script", SCRIPT.parent / "sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "val", "test_2016_flickr"):
        for language in ("en", "de"):
            (data / f"{split}.{language}.gz").write_bytes(b"")
    trained = []
    monkeypatch.setattr(sweep, "train", lambda config, verbose: trained.append(config))
    monkeypatch.setattr(sweep, "summary", lambda run: {"epochs": 1})
    monkeypatch.setattr(sys, "argv", ["sweep.py", "--data", str(data), "--root", str(tmp_path / "sw"),
                                      "--epochs", "3", "--grid", "dropout_rate=0.1,0.3"])
    sweep.main()
    assert [c.dropout_rate for c in trained] == [0.1, 0.3]
    assert [c.output_dir for c in trained] == [str(tmp_path / "sw" / "dropout_rate-0.1"),
                                              str(tmp_path / "sw" / "dropout_rate-0.3")]
    recipe = config(script, "--epochs 3")
    for c in trained:
        assert dataclasses.replace(c, dropout_rate=0.2, output_dir="runs/x", train_src=recipe.train_src,
                                   train_tgt=recipe.train_tgt, val_src=recipe.val_src,
                                   val_tgt=recipe.val_tgt) == recipe
    assert (tmp_path / "sw" / "sweep.md").read_text().count("| 1 |") == 2
    monkeypatch.setattr(sys, "argv", ["sweep.py", "--data", str(data), "--grid", "num_layers=abc"])
    with pytest.raises(SystemExit, match="num_layers takes int values"):
        sweep.main()


def test_refresh_refuses_the_files_of_another_pair(script, tmp_path):
    """`refresh --pair de-en` on an en-de model scored it on German sources
    and rewrote its card with BLEU 0.01 (a new-user trial)."""
    import json

    (tmp_path / "metrics.json").write_text(json.dumps({"pair": "en-de"}))
    (tmp_path / "keras_transformer.json").write_text(json.dumps({"decoding": {"beam_size": 4, "length_penalty": 0.6}}))
    args = script.build_parser().parse_args(["--pair", "de-en", "--output", str(tmp_path), "refresh"])
    with pytest.raises(SystemExit, match="translates en-de and --pair is de-en: pass --pair en-de"):
        script.refresh(args)
    args.output = str(tmp_path / "nothing")
    with pytest.raises(SystemExit, match="holds no metrics.json"):
        script.refresh(args)


def test_the_cards_ship_line_names_the_searches_ship_chose_from(script):
    """A model shipped with `--search 1:0.6` got a card whose "Reproduce"
    said plain `ship`, which tries the default three searches (a new-user
    trial); the refresh line drops ship's own searches."""
    rows = lambda searches: [{"beam_size": b, "length_penalty": lp} for which in ("best", "averaged")  # noqa: E731
                             for b, lp in searches]
    assert script.ship_search_flags({"chosen_on_val": rows(script.SEARCHES)}) == ""
    assert script.ship_search_flags({"chosen_on_val": rows([(1, 0.6), (5, 1.5)])}) == " --search 1:0.6 --search 5:1.5"
    args = script.build_parser().parse_args(["--search", "1:0.6", "--search", "5:1.5", "ship"])
    assert args.search == [(1, 0.6), (5, 1.5)]
    # Refreshed, such a card's refresh line is the ship line without ship's searches.
    import pathlib
    import tempfile

    card = CARD.replace("--pair en-de ship\n", "--search 1:0.6 --pair en-de ship\n")
    rows = [{"checkpoint": "shipped weights", "beam_size": b, "length_penalty": lp, "val_bleu": 43.0,
             "val_chrf": 65.5} for b, lp in ((1, 0.6), (6, 1.2))]
    m = {"pair": "en-de", "search": {"beam_size": 6, "length_penalty": 1.2}, "searches_on_val": rows,
         "test_2016_flickr": {"bleu": 1.0, "bleu_lowercase": 1.0, "chrf": 1.0},
         "val": {"bleu": 1.0, "bleu_lowercase": 1.0, "chrf": 1.0}}
    with tempfile.TemporaryDirectory() as out:
        script.refresh_card(out, m, card)
        refreshed = (pathlib.Path(out) / "MODEL_CARD.md").read_text()
    assert ("--data ../shared/data/multi30k --search 1:0.6 --pair en-de ship\npython examples/multi30k.py "
            "--data ../shared/data/multi30k --pair en-de refresh --search 6:1.2\n") in refreshed
