"""Which way a metric a job logs gets better: up (accuracy) or down (loss, an error).

Runs on both sides, and in the dashboard's browser: the sweep page ranks runs by a metric
with the two patterns below, which it gets from the agent (`/ui/api/metric-rule`) and
compiles as JavaScript regular expressions, case-insensitive. So they use only what both
languages read alike: alternatives, `(?:...)` groups, `[^a-z]` and `^`/`$`.

The standard library only.
"""

from __future__ import annotations

import re

__all__ = ["HIGHER_IS_BETTER", "LOWER_IS_BETTER", "higher_is_better"]

# A short name stands alone between other characters than letters ("val_mae", "map50"), so
# that "heatmap_sum" is no mAP and "previous" no IoU.
_ALONE = r"(?:^|[^a-z])(?:{})(?:$|[^a-z])"

# Losses and errors, whatever else their name says ("accuracy_loss" is a loss): Keras's
# mae, mse, msle, mape (mean_absolute_percentage_error), their root forms, perplexity.
LOWER_IS_BETTER = "|".join(
    [
        "loss",
        "error",
        "perplexity",
        "crossentropy",
        "divergence",
        "hinge",
        "logcosh",
        _ALONE.format("mae|mse|rmse|mape|smape|msle|rmsle|nll|ppl"),
    ]
)
# Scores: accuracy, AUC, precision and recall, F1, IoU (Keras's MeanIoU is "mean_io_u"),
# mAP, BLEU, ROUGE, a reward, R², a similarity.
HIGHER_IS_BETTER = "|".join(
    [
        "accuracy",
        "precision",
        "recall",
        "score",
        "bleu",
        "rouge",
        "reward",
        "similarity",
        "psnr",
        "ssim",
        "ndcg",
        _ALONE.format("acc|auc|f1|iou|miou|io_u|map|r2"),
    ]
)

_LOWER = re.compile(LOWER_IS_BETTER, re.IGNORECASE)
_HIGHER = re.compile(HIGHER_IS_BETTER, re.IGNORECASE)


def higher_is_better(name: str) -> bool:
    """Whether more of metric `name` is better. A loss or an error is not, and neither is a
    name the rule does not know: most of what training logs is a loss of some kind."""
    return not _LOWER.search(name) and bool(_HIGHER.search(name))
