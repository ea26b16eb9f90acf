"""Train a small Keras classifier on 8x8 digits, then export it.

The data (1,797 8x8 images of digits, as many as the UCI handwritten set) is drawn by
`drawn_digits.py`, beside this script: no download, nothing to install but TensorFlow.
Runs the same on a laptop (`python examples/digits/train.py`) and on a GPU host
(`gpuhop run examples/digits/train.py`); under gpuhop the per-epoch metrics go to
`gpuhop show`, TensorBoard's logs to `gpuhop tensorboard JOB` (live, while it trains), and
the SavedModel comes back with `gpuhop pull` (or `run --pull DIR`).
"""

import argparse

import numpy as np
import tensorflow as tf
from drawn_digits import draw

import gpuhop.tf

DIGITS = 1797  # as many as the UCI set; one in five kept for the test


def load_data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    images, labels = draw(DIGITS, seed)
    x = images.reshape(DIGITS, -1) / 16.0
    test = DIGITS // 5
    return x[test:], x[:test], labels[test:], labels[:test]


def build_model() -> tf.keras.Model:
    model = tf.keras.Sequential(
        [
            tf.keras.Input(shape=(64,), name="pixels"),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dropout(0.1),
            tf.keras.layers.Dense(10, activation="softmax", name="digit"),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    tf.keras.utils.set_random_seed(args.seed)
    x_train, x_test, y_train, y_test = load_data(args.seed)
    print(f"devices: {[d.name for d in tf.config.list_logical_devices()]}")
    print(f"training on {len(x_train)} digits, testing on {len(x_test)}")

    model = build_model()
    model.fit(
        x_train,
        y_train,
        validation_data=(x_test, y_test),
        epochs=args.epochs,
        batch_size=args.batch_size,
        callbacks=gpuhop.tf.callbacks(tensorboard=True),
        verbose=2,
    )
    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    print(f"test accuracy: {accuracy:.4f} (loss {loss:.4f})")

    export_dir = gpuhop.tf.artifacts_dir() / "digits_savedmodel"
    model.export(str(export_dir), verbose=False)
    print(f"saved model: {export_dir.name}")


if __name__ == "__main__":
    main()
