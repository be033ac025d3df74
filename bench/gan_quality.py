"""Time to quality: every shipped GAN config, several seeds, classifier FID against
the real-vs-real floor measured in the same run.

    python bench/gan_quality.py                          # every config, 3 seeds: hours here
    python bench/gan_quality.py --configs dcgan --seeds 3
    python bench/gan_quality.py --configs wgan_gp --steps 2000 \
        --gin "gan.Experiment.augment = ('translation', 'cutout')"
    python bench/gan_quality.py --quick                  # one short, narrow seed per config (CI)

Each (config, seed) trains from scratch with `ctl train CONFIG` in a process of
its own (`gan.Experiment.seed = SEED`), evaluating every `fid_every` steps;
its time is wall time from the process's start, evaluation included. From
`<workdir>/metrics.jsonl` and the evaluations' TensorBoard times it reports
per config:
  - the time and step at which classifier FID first reached 10x, 5x and 3x the
    floor (the 5,000 training digits against the 5,000 held-out ones, the
    same evaluation as the generated digits'), over the seeds that reached it;
  - the best FID (mean ± std over seeds, and as a multiple of the floor), and
    the final evaluation's metrics (KID, precision, recall; label accuracy for
    a conditional GAN; encoder 1-NN accuracy and reconstruction ratio for BiGAN)
    as mean ± std;
  - the final sample grid of the first seed, copied to `--docs`.
Prints one JSON line per run and per config, then the Markdown table, which it
writes to `<docs>/quality.md` unless `--quick` or `--no-docs`.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = ("dcgan", "conditional_dcgan", "wgan_gp", "hinge_sn", "bigan", "tfgan_mnist")
MULTIPLES = (10, 5, 3)
# --quick: a few narrow steps per config, evaluated once at the end on 500 samples.
QUICK = ("gan.dcgan_generator.width = 8", "gan.dcgan_discriminator.width = 8",
         "gan.models.dcgan_encoder.width = 8", "gan.models.bigan_discriminator.width = 8",
         "gan.Experiment.batch_size = 16", "gan.Schedule.total_steps = 10",
         "gan.Schedule.steps_per_loop = 5", "gan.Schedule.fid_every = 5",
         "gan.Schedule.samples_every = 10", "gan.Schedule.checkpoint_every = 10",
         "gan.Experiment.fid_samples = 500")
# What the final evaluation reports, when the config measures it.
FINAL = ("classifier_fid", "classifier_kid", "precision", "recall", "density", "coverage",
         "classifier_score_32", "label_accuracy", "intra_class_fid", "encoder_1nn_accuracy",
         "random_encoder_1nn_accuracy", "pixels_1nn_accuracy", "reconstruction_ratio")


def floor():
  """Classifier FID of the training digits against the held-out ones."""
  import gan
  from gan import evaluation
  reference = evaluation.reference_outputs("test")
  real = evaluation.classifier_features(gan.data.load_mnist("train")[0])
  return evaluation.frechet_distance(real, reference["features"])


def eval_times(workdir):
  """step -> wall time (s since the epoch) of each classifier FID in events/eval."""
  from tensorboard.backend.event_processing import event_accumulator
  acc = event_accumulator.EventAccumulator(os.path.join(workdir, "events", "eval"),
                                           size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()
  if "classifier_fid" not in acc.Tags().get("tensors", []):
    return {}
  return {e.step: e.wall_time for e in acc.Tensors("classifier_fid")}


def run_one(config, seed, workdir, bindings):
  """Trains (config, seed) from scratch; its record: the FID curve with times."""
  shutil.rmtree(workdir, ignore_errors=True)
  command = [sys.executable, "-m", "ctl.cli", "train", config, "--workdir", workdir,
             "--gin", f"gan.Experiment.seed = {seed}"]
  for binding in bindings:
    command += ["--gin", binding]
  start = time.time()
  proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False,
                        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  seconds = time.time() - start
  if proc.returncode != 0:
    raise RuntimeError(f"{config} seed {seed} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
  from ctl.loop import history
  metrics = history.read_history(os.path.join(workdir, "metrics.jsonl"))
  times = eval_times(workdir)
  curve = []
  for row in metrics.rows():
    step = int(row.pop("step"))
    curve.append({"step": step, "seconds": times.get(step, start + seconds) - start, **row})
  samples = sorted(os.listdir(os.path.join(workdir, "samples")))
  return {"config": config, "seed": seed, "seconds": seconds, "curve": curve,
          "grid": os.path.join(workdir, "samples", samples[-1]) if samples else None}


def first_reached(curve, threshold):
  """(step, seconds) of the first evaluation at or below `threshold`, or None."""
  for point in curve:
    if point["classifier_fid"] <= threshold:
      return point["step"], point["seconds"]
  return None


def mean_std(values):
  values = [v for v in values if v is not None]
  if not values:
    return None
  return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarize(config, runs, floor_fid):
  """The config's row: thresholds reached, best FID, final metrics, time."""
  row = {"config": config, "seeds": len(runs), "floor": floor_fid,
         "minutes": mean_std([r["seconds"] / 60 for r in runs]),
         "steps": runs[0]["curve"][-1]["step"] if runs[0]["curve"] else None}
  for multiple in MULTIPLES:
    reached = [first_reached(r["curve"], multiple * floor_fid) for r in runs]
    row[f"reached_{multiple}x"] = sum(x is not None for x in reached)
    row[f"minutes_to_{multiple}x"] = mean_std([x[1] / 60 for x in reached if x])
    row[f"step_to_{multiple}x"] = mean_std([x[0] for x in reached if x])
  row["best_fid"] = mean_std([min(p["classifier_fid"] for p in r["curve"]) for r in runs])
  for key in FINAL:
    values = [r["curve"][-1].get(key) for r in runs if r["curve"]]
    if any(v is not None for v in values):
      row[f"final_{key}"] = mean_std(values)
  return row


def _pm(value, digits=2):
  return "–" if value is None else f"{value[0]:.{digits}f} ± {value[1]:.{digits}f}"


def markdown(rows, cpu, command):
  lines = ["# Time to quality: the GAN kit's configs on this CPU", "",
           f"Command: `{command}`. CPU: {cpu['cpu']}, {cpu['cores']} cores; "
           f"bfloat16 instructions: {'yes' if cpu['bfloat16_instructions'] else 'no'}.", "",
           "Classifier FID against the 5,000 held-out digits (5,000 samples), as a multiple "
           f"of the floor measured in the same run ({rows[0]['floor']:.3f}: the 5,000 "
           "training digits). Times are wall time from the training process's start, "
           "evaluation included; mean ± std over the seeds that reached each multiple "
           "(reached/seeds).", "",
           "| config | steps | minutes | to 10x: min (step) | to 5x | to 3x | best FID (x floor) |",
           "|---|---:|---:|---|---|---|---|"]
  for r in rows:
    cells = []
    for m in MULTIPLES:
      if r[f"reached_{m}x"]:
        cells.append(f"{_pm(r[f'minutes_to_{m}x'], 1)} ({r[f'step_to_{m}x'][0]:,.0f}) "
                     f"{r[f'reached_{m}x']}/{r['seeds']}")
      else:
        cells.append(f"not reached (0/{r['seeds']})")
    best = r["best_fid"]
    lines.append(f"| {r['config']} | {r['steps']:,} | {_pm(r['minutes'], 1)} | "
                 + " | ".join(cells) + f" | {_pm(best)} ({best[0] / r['floor']:.1f}x) |")
  lines += ["", "Final evaluation (mean ± std over seeds):", "",
            "| config | " + " | ".join(FINAL) + " |", "|---|" + "---|" * len(FINAL)]
  for r in rows:
    lines.append(f"| {r['config']} | " + " | ".join(
        _pm(r.get(f"final_{k}"), 3) for k in FINAL) + " |")
  lines += ["", "Sample grids of each config's first seed, final step: "
            "`docs/quality/<config>.png`.", ""]
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--configs", default=",".join(CONFIGS),
                      help=f"comma-separated shipped configs (default: {','.join(CONFIGS)})")
  parser.add_argument("--seeds", type=int, default=3, help="seeds 0 .. N-1 per config")
  parser.add_argument("--steps", type=int, help="train each to this step (default: the config's)")
  parser.add_argument("--gin", action="append", default=[], help="an extra binding for every run")
  parser.add_argument("--quick", action="store_true",
                      help="one seed, 10 narrow steps per config: checks the records (CI)")
  parser.add_argument("--workdir", default=os.path.join("runs", "quality"))
  parser.add_argument("--docs", default=os.path.join(ROOT, "docs"))
  parser.add_argument("--no-docs", action="store_true", help="print only")
  args = parser.parse_args(argv)
  configs = [c.strip() for c in args.configs.split(",") if c.strip()]
  unknown = [c for c in configs if c not in CONFIGS]
  if unknown:
    parser.error(f"--configs: unknown {unknown}; choose from {', '.join(CONFIGS)}")
  bindings = list(QUICK) if args.quick else []
  if args.steps:
    bindings.append(f"gan.Schedule.total_steps = {args.steps}")
  bindings += args.gin
  seeds = 1 if args.quick else args.seeds
  sys.path.insert(0, os.path.join(ROOT, "bench"))
  from run import cpu_features  # pylint: disable=import-outside-toplevel
  cpu = cpu_features()
  print(json.dumps(cpu), flush=True)
  floor_fid = floor()
  print(json.dumps({"floor": floor_fid}), flush=True)
  rows = []
  for config in configs:
    runs = []
    for seed in range(seeds):
      record = run_one(config, seed, os.path.join(args.workdir, config, f"seed{seed}"),
                       bindings)
      print(json.dumps({"run": record}), flush=True)
      runs.append(record)
    row = summarize(config, runs, floor_fid)
    print(json.dumps({"summary": row}), flush=True)
    rows.append(row)
    if not (args.quick or args.no_docs) and runs[0]["grid"]:
      os.makedirs(os.path.join(args.docs, "quality"), exist_ok=True)
      shutil.copyfile(runs[0]["grid"], os.path.join(args.docs, "quality", f"{config}.png"))
  command = "python bench/gan_quality.py " + " ".join(
      a if " " not in a else repr(a) for a in (argv if argv is not None else sys.argv[1:]))
  text = markdown(rows, cpu, command.strip())
  print(text)
  if not (args.quick or args.no_docs):
    with open(os.path.join(args.docs, "quality.md"), "w") as f:
      f.write(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
