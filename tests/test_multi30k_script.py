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
])
def test_card_command_reproduces_the_flags(script, flags):
    c = config(script, flags)
    assert c.dropout_rate == float(shlex.split(flags)[shlex.split(flags).index("--dropout-rate") + 1])
    assert c.seed == int(shlex.split(flags)[-1])
    # The other two rates stay the recipe's: --dropout-rate sets the residual/embedding rate only.
    assert (c.attention_dropout_rate, c.activation_dropout_rate) == (0.1, 0.1)
    again = script.recipe_flags(dataclasses.asdict(c), model_config(c))
    assert config(script, again) == c
