"""Does Keras 3's `fit` train multi-worker under Ray Train? docs/strategies.md's claim, re-checked.

    python bench/ray_keras_fit.py     # needs pip install 'ctl-loops[ray]'; a few minutes

Starts a local Ray cluster and runs, on 2 workers of Ray Train's
`TensorflowTrainer`, the loop Ray's TensorFlow guide shows: a
`MultiWorkerMirroredStrategy`, a one-layer model compiled in its scope, and
`fit` on a small `tf.data` dataset; once with `import keras` (Keras 3) and once
with `tf.keras` (which Ray's `TF_USE_LEGACY_KERAS=1` would send to Keras 2,
were tf_keras installed). Prints, for each, whether it trained or the error.
The same cluster shape trains through ctl (`ctl.cli.ray_train.train`, tests/test_ray.py).
"""

import os
import sys
import time


def loop(config):
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  strategy = tf.distribute.MultiWorkerMirroredStrategy()
  if config["keras"] == "tf.keras":
    keras = tf.keras
  else:
    import keras  # pylint: disable=import-outside-toplevel
  with strategy.scope():
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
  x = np.arange(64, dtype="float32").reshape(-1, 1)
  model.fit(tf.data.Dataset.from_tensor_slices((x, x + 1)).batch(8), epochs=2, verbose=0)


def main():
  os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
  import keras  # pylint: disable=import-outside-toplevel
  import ray  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from ray.train import RunConfig  # pylint: disable=import-outside-toplevel
  from ray.train import ScalingConfig  # pylint: disable=import-outside-toplevel
  from ray.train.tensorflow import TensorflowTrainer  # pylint: disable=import-outside-toplevel
  print(f"ray {ray.__version__}, tensorflow {tf.__version__}, keras {keras.__version__}")
  ray.init(include_dashboard=False)
  for which in ("keras", "tf.keras"):
    start = time.monotonic()
    trainer = TensorflowTrainer(loop, train_loop_config={"keras": which},
                                scaling_config=ScalingConfig(num_workers=2),
                                run_config=RunConfig(name=f"keras_fit_{which}"))
    try:
      error = trainer.fit().error
    except Exception as e:  # pylint: disable=broad-except
      error = e
    first = str(error).strip().splitlines()
    outcome = "trained" if error is None else "failed: " + next(
        (line.strip() for line in first if "Error:" in line), first[0] if first else "")
    print(f"{which:9s} fit on 2 Ray workers: {outcome} ({time.monotonic() - start:.0f} s)")
  ray.shutdown()
  return 0


if __name__ == "__main__":
  sys.exit(main())
