"""Figures the lessons and slides share."""
from __future__ import annotations

CATEGORIES = ("params", "grads", "optimizer", "activations", "temporaries")
COLORS = {"params": "tab:purple", "grads": "tab:red", "optimizer": "tab:green", "activations": "tab:orange",
          "temporaries": "tab:gray"}


def stacked_peak_chart(predict, configs, seqs, batch: int = 1, precision: str = "amp", optimizer: str = "adamw",
                       recompute_modes=("none", "full")):
    """One panel per model: the predicted peak of a training step, stacked by category, against sequence
    length; one bar per recompute mode (hatched when recomputing). `predict` is a lesson-02 predictor."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(configs), figsize=(5 * len(configs), 4), squeeze=False)
    width = 0.8 / len(recompute_modes)
    for ax, cfg in zip(axes[0], configs):
        for k, mode in enumerate(recompute_modes):
            bottoms = [0.0] * len(seqs)
            peaks = [predict(cfg, batch, s, precision, optimizer, mode) for s in seqs]
            xs = [i + (k - (len(recompute_modes) - 1) / 2) * width for i in range(len(seqs))]
            for cat in CATEGORIES:
                heights = [p[cat] / 2**30 for p in peaks]
                ax.bar(xs, heights, width, bottom=bottoms, color=COLORS[cat], edgecolor="white",
                       hatch="//" if mode != "none" else None, label=cat if k == 0 else None)
                bottoms = [b + h for b, h in zip(bottoms, heights)]
        ax.set_xticks(range(len(seqs)), [f"{s // 1024}K" for s in seqs])
        ax.set_title(cfg.name or f"{cfg.n_layers} layers, h={cfg.d_model}")
        ax.set_xlabel(f"sequence length (batch {batch}); hatched: recompute={recompute_modes[-1]}")
    axes[0][0].set_ylabel(f"predicted peak, GiB ({precision}, {optimizer})")
    axes[0][0].legend(loc="upper left")
    fig.tight_layout()
    return fig
