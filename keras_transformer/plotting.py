"""Attention heat maps, as in the paper's figures 3-5 and the TF tutorial."""


def plot_attention(source_tokens, output_tokens, weights, path, title=None):
    """Draw one heat map per head: output tokens (rows) against source tokens.

    Args:
        source_tokens: list of `str`, the source pieces (columns).
        output_tokens: list of `str`, the output pieces (rows).
        weights: array `(num_heads, len(output_tokens), len(source_tokens))`.
        path: image file to write (`.png`, `.pdf`, ...).
        title: optional figure title.

    Returns:
        `path`.

    Raises:
        ValueError: if the shape of `weights` does not match the tokens.
        ImportError: without matplotlib (`pip install keras-transformer[plot]`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    weights = np.asarray(weights)
    if weights.ndim != 3 or weights.shape[1:] != (len(output_tokens), len(source_tokens)):
        raise ValueError(
            f"weights of shape {weights.shape} do not match {len(output_tokens)} output "
            f"and {len(source_tokens)} source tokens; expected (heads, outputs, sources)."
        )
    heads = weights.shape[0]
    columns = min(heads, 4)
    rows = -(-heads // columns)
    size = 0.35 * max(len(source_tokens), len(output_tokens)) + 1.5
    fig, axes = plt.subplots(rows, columns, figsize=(size * columns, size * rows), squeeze=False)
    for head, ax in enumerate(axes.flat):
        if head >= heads:
            ax.axis("off")
            continue
        ax.imshow(weights[head], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(source_tokens)), source_tokens, rotation=90, fontsize=8)
        ax.set_yticks(range(len(output_tokens)), output_tokens, fontsize=8)
        ax.set_title(f"head {head + 1}", fontsize=10)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
