"""Train a small Keras classifier on a folder of images in a bucket, fetched by gpuhop.

    gpuhop run --data s3://my-bucket/digits:digits examples/bucket/train.py

The GPU host fetches the prefix while the job waits (the next job with the same prefix
fetches nothing), and the job reads it read-only at $GPUHOP_DATA/digits: one folder per
class, as `keras.utils.image_dataset_from_directory` takes it (upload.py puts drawn digits
there). Locally, the same script reads a folder of your own: `python train.py --data DIR`.
Under gpuhop the per-epoch metrics go to `gpuhop show`, and what the job was given (how
many objects, how many fetched rather than cached, the listing's digest) is in its
"fetched" row.
"""

import argparse
import os

import keras


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        default=os.path.join(os.environ.get("GPUHOP_DATA", "."), "digits"),
        help="the folder of class folders (default: $GPUHOP_DATA/digits)",
    )
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    shared = {"image_size": (8, 8), "color_mode": "grayscale", "batch_size": 32, "seed": 1}
    train, val = keras.utils.image_dataset_from_directory(
        args.data, validation_split=0.2, subset="both", **shared
    )
    print("classes", " ".join(train.class_names))
    model = keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(len(train.class_names)),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(train, validation_data=val, epochs=args.epochs, verbose=2)


if __name__ == "__main__":
    main()
