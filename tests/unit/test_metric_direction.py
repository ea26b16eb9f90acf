"""Which way a metric gets better (gpuhop.api.metrics): losses and errors down, scores up,
a name the rule does not know down. The sweep page ranks runs by the same rule, from the
agent (tests/e2e/test_dashboard_browser.py checks that the browser reads it alike)."""

from __future__ import annotations

import pytest

from gpuhop.api.metrics import higher_is_better

LOWER = [
    "loss",
    "val_loss",
    "train/loss",
    "epoch_loss",
    "mae",
    "val_mae",
    "mse",
    "rmse",
    "val_rmse",
    "mape",  # Keras's mean absolute percentage error: "map" in it is no mAP
    "val_mape",
    "mean_absolute_percentage_error",
    "msle",
    "mean_squared_logarithmic_error",
    "perplexity",
    "val_perplexity",
    "reconstruction_error",
    "categorical_crossentropy",
    "kl_divergence",
    "accuracy_loss",  # a loss, whatever else it names
    "iou_loss",
    "f1_error",
    # Names the rule does not know, though they hold a score's letters.
    "heatmap_sum",
    "previous_grad_norm",
    "accumulated_steps",
    "lr",
]
HIGHER = [
    "accuracy",
    "val_accuracy",
    "acc",
    "val_acc",
    "sparse_categorical_accuracy",
    "top_k_categorical_accuracy",
    "eval/accuracy",
    "auc",
    "val_auc_1",
    "precision",
    "recall_1",
    "f1",
    "f1_score",
    "mean_io_u",  # Keras's MeanIoU
    "iou",
    "miou",
    "map",
    "map50",
    "mAP@0.5",
    "bleu",
    "rouge1",
    "rougeL",
    "episode_reward_mean",
    "r2",
    "r2_score",
    "cosine_similarity",
    "Val_Accuracy",
]


@pytest.mark.parametrize("name", LOWER)
def test_a_loss_an_error_or_an_unknown_name_is_better_lower(name):
    assert not higher_is_better(name)


@pytest.mark.parametrize("name", HIGHER)
def test_a_score_is_better_higher(name):
    assert higher_is_better(name)
