"""Named model sizes: pick a name, override any field.

`base` and `big` are table 3 of Vaswani et al. (2017). `small` is sized
for Multi30k-scale corpora (30k sentence pairs) on a CPU, `tiny` for the
demo and tests.
"""

PRESETS = {
    "base": dict(num_layers=6, d_model=512, num_heads=8, dff=2048, dropout_rate=0.1),
    "big": dict(num_layers=6, d_model=1024, num_heads=16, dff=4096, dropout_rate=0.3),
    "small": dict(num_layers=3, d_model=256, num_heads=4, dff=1024, dropout_rate=0.1),
    "tiny": dict(num_layers=2, d_model=128, num_heads=4, dff=512, dropout_rate=0.1),
}


def get_preset(name, **overrides):
    """The hyper-parameters of preset `name`, updated with `overrides`.

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    if name not in PRESETS:
        raise ValueError(
            f"Unknown preset {name!r}; choose one of {sorted(PRESETS)}."
        )
    config = dict(PRESETS[name])
    config.update({k: v for k, v in overrides.items() if v is not None})
    return config
