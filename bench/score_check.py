"""How the two classifiers' score ratio (batches of 32, against the held-out digits)
judges real and degraded digits: near 1 for real ones, lower for blur, noise and
dropped classes. Three seeds of shuffling (and noise); mean ± std.

    python bench/score_check.py
"""

import numpy as np
from scipy import ndimage

import gan
from gan import evaluation


def main():
  reference = evaluation.reference_outputs("test")
  order = np.random.default_rng(0).permutation(reference["num_samples"])
  real = [evaluation.score_in_batches(reference[key][order])
          for key in ("logits", "second_logits")]
  images, labels = gan.data.load_mnist("train")
  unit = images.astype(np.float32) / 127.5 - 1
  cases = {
      "training digits (real)": lambda rng: unit,
      "blurred (sigma 1 px)": lambda rng: np.stack([ndimage.gaussian_filter(i, 1.0)
                                                    for i in unit]),
      "noise (std 0.5)": lambda rng: np.clip(unit + rng.normal(0, 0.5, unit.shape),
                                             -1, 1).astype(np.float32),
      "5 classes of 10": lambda rng: np.concatenate([unit[labels < 5]] * 2),
      "1 class of 10": lambda rng: np.concatenate([unit[labels == 3]] * 10),
  }
  print("| digits | shipped classifier | second classifier |\n|---|---|---|")
  for name, make in cases.items():
    ratios = []
    for seed in range(3):
      rng = np.random.default_rng(seed)
      digits = make(rng)
      digits = digits[rng.permutation(len(digits))]
      ratios.append([evaluation.score_in_batches(evaluation.classifier_logits(digits,
                                                                              second=second))
                     / score for second, score in zip((False, True), real)])
    mean, std = np.mean(ratios, 0), np.std(ratios, 0)
    print(f"| {name} | {mean[0]:.3f} ± {std[0]:.3f} | {mean[1]:.3f} ± {std[1]:.3f} |")


if __name__ == "__main__":
  main()
