"""Time to quality: every shipped GAN config, several seeds, classifier FID against
the real-vs-real floor measured in the same run.

    python bench/gan_quality.py                          # every config, 3 seeds: hours here
    python bench/gan_quality.py --configs dcgan --seeds 3
    python bench/gan_quality.py --configs wgan_gp --steps 2000 \
        --gin "gan.Experiment.augment = ('translation', 'cutout')"
    python bench/gan_quality.py --quick                  # one short, narrow seed per config (CI)

Each (config, seed) trains from scratch with `ctl train CONFIG` in a process of
its own (`gan.Experiment.seed = SEED`), evaluating every `fid_every` steps;
its time is wall time from the process's start, evaluation included. The
config `main_job` is README's first command, `python examples/mnist_dcgan.py
--seed SEED` (its hand-written step; `--steps` applies, `--gin` does not),
measured once, at its end. From
`<workdir>/metrics.jsonl` and the evaluations' TensorBoard times it reports
per config:
  - the time and step at which classifier FID first reached 10x, 5x, 3x and 2x the
    floor (the 5,000 training digits against the 5,000 held-out ones, the
    same evaluation as the generated digits'), over the seeds that reached it;
  - the best FID (mean ± std over seeds, and as a multiple of the floor), and
    the final evaluation's metrics (KID, precision, recall; label accuracy for
    a conditional GAN; encoder 1-NN accuracy and reconstruction ratio for BiGAN)
    as mean ± std;
  - for stacked_mnist (three digits as channels), the modes of 1,000 covered and
    the KL divergence of the mode distribution from the uniform; its FID is
    that of the samples' channel digits;
  - the final sample grid of the first seed, copied to `<docs>/quality/`;
  - whether the config met its target (TARGETS).
Prints one JSON line per run and per config, then the Markdown table. Unless
`--quick` or `--no-docs`, each config's runs (with the command, CPU and date)
go into `<docs>/quality/results.json`, and `<docs>/quality.md` is rewritten
from all the rows there: configs measured in separate invocations, or
sessions, end up in one table. Runs of the recipe already stored (same
`--steps` and `--gin`, same bindings in the .gin file or code of the main job,
same CPU) join its row, so a long measurement can be
spread over sessions (`--seeds 2 --first-seed 1` after `--seeds 1`); another
recipe replaces the config's row. With `--mixed-precision mixed_bfloat16` the
runs train under that Keras policy (`gan.Experiment.mixed_precision`, the main
job's `--mixed-precision`) and make rows of their own, `<config> (mixed_bfloat16)`,
beside the float32 ones.
"""

import argparse
import ast
import hashlib
import io
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN = "main_job"  # examples/mnist_dcgan.py, README's first command: FID at its end only
CONFIGS = (MAIN, "dcgan", "conditional_dcgan", "wgan_gp", "hinge_sn", "bigan", "tfgan_mnist",
           "stacked_mnist")
MULTIPLES = (10, 5, 3, 2)  # 2x: the conditional GAN's target
# --quick: a few narrow steps per config, evaluated once at the end on 500 samples.
QUICK = ("gan.dcgan_generator.width = 8", "gan.dcgan_discriminator.width = 8",
         "gan.models.dcgan_encoder.width = 8", "gan.models.bigan_discriminator.width = 8",
         "gan.Experiment.batch_size = 16", "gan.Schedule.total_steps = 10",
         "gan.Schedule.steps_per_loop = 5", "gan.Schedule.fid_every = 5",
         "gan.Schedule.samples_every = 10", "gan.Schedule.checkpoint_every = 10",
         "gan.Experiment.fid_samples = 500")
MAIN_QUICK = ("--steps", "10", "--steps-per-loop", "5", "--samples-every", "10",
              "--fid-samples", "500")
# What the final evaluation reports, when the config measures it.
FINAL = ("classifier_fid", "classifier_kid", "precision", "recall", "density", "coverage",
         "classifier_score_32", "score_32_ratio", "second_score_32_ratio", "label_accuracy",
         "intra_class_fid",
         "encoder_1nn_accuracy", "random_encoder_1nn_accuracy", "pixels_1nn_accuracy",
         "reconstruction_ratio", "modes", "mode_kl")


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


def command_of(config, seed, workdir, bindings, main_args):
  """The command that trains (config, seed) into `workdir`."""
  if config == MAIN:
    return [sys.executable, os.path.join("examples", "mnist_dcgan.py"), "--workdir", workdir,
            "--seed", str(seed), *main_args]
  command = [sys.executable, "-m", "ctl.cli", "train", config, "--workdir", workdir,
             "--gin", f"gan.Experiment.seed = {seed}"]
  for binding in bindings:
    command += ["--gin", binding]
  return command


def run_one(config, seed, workdir, bindings, main_args=()):
  """Trains (config, seed) from scratch; its record: the FID curve with times."""
  shutil.rmtree(workdir, ignore_errors=True)
  command = command_of(config, seed, workdir, bindings, main_args)
  start = time.time()
  proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  try:
    _, stderr = proc.communicate()
  finally:  # stopped (Ctrl-C, SIGTERM): the training process ends with the benchmark
    if proc.poll() is None:
      proc.terminate()
      try:
        proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
  seconds = time.time() - start
  if proc.returncode != 0:
    raise RuntimeError(f"{config} seed {seed} exited {proc.returncode}:\n{stderr[-3000:]}")
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


def source_digest(config):
  """A digest of what the config trains, comments and docstrings aside: the bindings of
  its .gin file, or the main job's code. Part of the recipe that stored runs must share."""
  if config == MAIN:
    tree = ast.parse(open(os.path.join(ROOT, "examples", "mnist_dcgan.py")).read())
    for node in ast.walk(tree):
      body = getattr(node, "body", None)
      if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
          and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
        node.body = body[1:]  # the docstring
    text = ast.dump(tree)
  else:
    with open(os.path.join(ROOT, "gan", "configs", f"{config}.gin")) as f:
      lines = f.read().splitlines()
    # Comments found as gin's own parser finds them (Python's tokenizer): a '#'
    # inside a string value is part of the binding.
    comments = {token.start[0]: token.start[1] for token in
                tokenize.generate_tokens(io.StringIO("\n".join(lines)).readline)
                if token.type == tokenize.COMMENT}
    kept = (line[:comments.get(row, len(line))].strip() for row, line in enumerate(lines, 1))
    text = "\n".join(line for line in kept if line)
  return hashlib.sha1(text.encode()).hexdigest()[:12]


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
  # One seed has no spread to show: None, not 0.0.
  return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None)


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
  for run in runs:  # the TF-GAN tutorial's figure: generated over real score, batches of 32
    final = run["curve"][-1] if run["curve"] else {}
    if final.get("classifier_score_32") and final.get("real_score_32"):
      final["score_32_ratio"] = final["classifier_score_32"] / final["real_score_32"]
    if final.get("second_score_32") and final.get("second_real_score_32"):  # the check
      final["second_score_32_ratio"] = final["second_score_32"] / final["second_real_score_32"]
  for key in FINAL:
    values = [r["curve"][-1].get(key) for r in runs if r["curve"]]
    if any(v is not None for v in values):
      row[f"final_{key}"] = mean_std(values)
  return row


# What each config is asked to reach (issue 34): its text, and the checks of a summary
# row that must all pass. Whether the digits are readable is for a person to judge from
# the grid.
def _within(multiple, minutes, *, whole_run=False):
  """Every seed reached `multiple` x the floor, on average within `minutes` (of the
  whole process with `whole_run`: the main job's time includes its export)."""
  def check(row):
    reached = row[f"reached_{multiple}x"] == row["seeds"]
    took = row["minutes"] if whole_run else row[f"minutes_to_{multiple}x"]
    return reached and (minutes is None or took[0] <= minutes)
  return check


def _final_at_most(key, limit):
  return lambda row: row.get(f"final_{key}") is not None and row[f"final_{key}"][0] <= limit


def _final_at_least(key, limit):
  return lambda row: row.get(f"final_{key}") is not None and row[f"final_{key}"][0] >= limit


def _encoder_beats_both(row):
  encoder = row.get("final_encoder_1nn_accuracy")
  return encoder is not None and encoder[0] > max(
      row["final_pixels_1nn_accuracy"][0], row["final_random_encoder_1nn_accuracy"][0])


TARGETS = {
    MAIN: ("≤ 10x in ≤ 3 min", [_within(10, 3, whole_run=True)]),
    "dcgan": ("≤ 2x in ≤ 30 min", [_within(2, 30)]),
    "conditional_dcgan": ("≤ 2x; label accuracy ≥ 0.97",
                          [_within(2, None), _final_at_least("label_accuracy", 0.97)]),
    "wgan_gp": ("≤ 5x in ≤ 15 min", [_within(5, 15)]),
    "hinge_sn": ("≤ 5x in ≤ 15 min", [_within(5, 15)]),
    "bigan": ("≤ 5x; encoder 1-NN ≥ 0.95, above pixels' and a random encoder's; "
              "reconstruction ratio ≤ 0.55",
              [_within(5, None), _encoder_beats_both,
               _final_at_least("encoder_1nn_accuracy", 0.95),
               _final_at_most("reconstruction_ratio", 0.55)]),
    # Issue 56: TF-GAN's own figure, under the shipped classifier and the second one.
    "tfgan_mnist": ("score_32 / real ≥ 0.90 under each classifier",
                    [_final_at_least("score_32_ratio", 0.90),
                     _final_at_least("second_score_32_ratio", 0.90)]),
    "stacked_mnist": ("≥ 990 of 1,000 modes; KL ≤ 0.1 (26,000 samples)",
                      [_final_at_least("modes", 990), _final_at_most("mode_kl", 0.1)]),
}


# What the field published for the same measure, under its own protocol (issue 56): beside
# each row, not judged. Where the protocols differ, tuning.md and the config say how.
ANCHORS = {
    "bigan": "BiGAN (Donahue et al. 2017): 1-NN accuracy of its encoder's features on "
             "full MNIST (their protocol; no figure of theirs is compared here)",
    "tfgan_mnist": "TF-GAN's tutorial: 0.89–0.90 (its own classifier: real digits 8.38; "
                   "ours 8.10, the second 8.24)",
    "stacked_mnist": "PacGAN (Lin et al. 2018, Table 2): DCGAN 99 modes, KL 3.40; "
                     "PacDCGAN2 1,000, KL 0.06",
}


def row_name(config, mixed_precision=None):
  """The key of a config's row: its name, with the policy when not float32."""
  return f"{config} ({mixed_precision})" if mixed_precision else config


def _config_of(name):
  return name.split(" (")[0]


def _slug(name):
  """A row's name as a file name: "main_job (mixed_bfloat16)" -> "main_job_mixed_bfloat16"."""
  return name.replace(" (", "_").replace(")", "")


def _pm(value, digits=2):
  if value is None:
    return "–"
  if value[1] is None:  # one seed
    return f"{value[0]:.{digits}f}"
  return f"{value[0]:.{digits}f} ± {value[1]:.{digits}f}"


def met(row):
  """'met' if the summary row passes every check of its config's target, else 'not met'."""
  checks = TARGETS[row["config"]][1]
  return "met" if all(check(row) for check in checks) else "not met"


def markdown(results):
  """docs/quality.md from `results` (config -> {"row", "commands", "cpu", "date", ...})."""
  configs = sorted((name for name in results if _config_of(name) in CONFIGS),
                   key=lambda name: (CONFIGS.index(_config_of(name)), name))
  lines = ["# Time to quality: the GAN kit's configs on this CPU", "",
           "Made by `bench/gan_quality.py`; each config's row keeps the commands, CPU and "
           "date of the runs that made it (`docs/quality/results.json`), so rows made in "
           "separate invocations live side by side.", "",
           "Classifier FID against the 5,000 held-out digits (5,000 samples), as a multiple "
           "of the floor measured in the same run (the 5,000 training digits against the "
           "held-out ones). Times are wall time from the training process's start, "
           "evaluation and start-up included; mean ± std over the seeds that reached each "
           "multiple (reached/seeds). `main_job` is README's first command "
           "(`examples/mnist_dcgan.py`), measured at its end only. The benchmark machine "
           "is a shared VM whose speed drifts between invocations (by how much: "
           "[quality/tuning.md](quality/tuning.md)): compare times within one row.", "",
           "| config | target | published anchor | result | steps | minutes | to 10x: min "
           "(step) | to 5x | to 3x | to 2x | best FID (x floor) |",
           "|---|---|---|---|---:|---:|---|---|---|---|---|"]
  for config in configs:
    r = results[config]["row"]
    cells = []
    for m in MULTIPLES:
      if f"reached_{m}x" not in r:  # a row saved before this multiple was measured
        cells.append("–")
      elif r[f"reached_{m}x"]:
        cells.append(f"{_pm(r[f'minutes_to_{m}x'], 1)} ({r[f'step_to_{m}x'][0]:,.0f}) "
                     f"{r[f'reached_{m}x']}/{r['seeds']}")
      else:
        cells.append(f"not reached (0/{r['seeds']})")
    best = r["best_fid"]
    lines.append(f"| {config} | {TARGETS[_config_of(config)][0]} | "
                 f"{ANCHORS.get(_config_of(config), '–')} | {met(r)} | {r['steps']:,} | "
                 f"{_pm(r['minutes'], 1)} | " + " | ".join(cells)
                 + f" | {_pm(best)} ({best[0] / r['floor']:.1f}x) |")
  keys = [k for k in FINAL if any(f"final_{k}" in results[c]["row"] for c in configs)]
  lines += ["", "Final evaluation (mean ± std over seeds):", "",
            "| config | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
  for config in configs:
    r = results[config]["row"]
    lines.append(f"| {config} | " + " | ".join(_pm(r.get(f"final_{k}"), 3) for k in keys)
                 + " |")
  lines += ["", "How each row was made (what was tried to reach these recipes: "
            "[quality/tuning.md](quality/tuning.md)):", ""]
  for config in configs:
    made = results[config]
    cpu = made["cpu"]
    commands = made.get("commands") or [made["command"]]  # "command": rows saved before
    lines.append(f"- {config}: " + ", then ".join(f"`{c}`" for c in commands)
                 + f" (last on {made['date']}); floor "
                 f"{made['row']['floor']:.3f}; CPU {cpu['cpu']}, {cpu['cores']} cores, "
                 f"bfloat16 instructions: {'yes' if cpu['bfloat16_instructions'] else 'no'}; "
                 f"samples of the first seed's final step: [quality/{_slug(config)}.png]"
                 f"(quality/{_slug(config)}.png).")
  lines.append("")
  return "\n".join(lines)


def save_runs(docs, name, runs, floor_fid, command, cpu, recipe):
  """Stores `runs` as row `name` (`row_name`) of `<docs>/quality/results.json`,
  summarized; returns all rows.

  Runs of the same recipe (the bindings and arguments that shape training, seeds
  aside) on the same CPU join the stored ones, a seed run again replacing its
  older record: `--seeds 1 --first-seed 2` adds seed 2 to a row of seeds 0 and 1,
  in another invocation or session. Another recipe or CPU replaces the entry.
  """
  path = os.path.join(docs, "quality", "results.json")
  results = {}
  if os.path.exists(path):
    with open(path) as f:
      results = json.load(f)
  old = results.get(name, {})
  commands, kept = [command], []
  differences = _differences(name, old, recipe, cpu)
  if old and not differences:
    seeds = {run["seed"] for run in runs}
    kept = [run for run in old["runs"] if run["seed"] not in seeds]
    # Another command's runs kept: it made the row too (none kept: only this one did).
    commands = [c for c in old["commands"] if c != command and kept] + [command]
  elif old:
    print(f"gan_quality: {name}'s stored row ({len(old.get('runs', ())) or old['row']['seeds']} "
          f"seeds) replaced, not joined: {'; '.join(differences)}", file=sys.stderr)
  runs = sorted(kept + [{k: v for k, v in run.items() if k != "grid"} for run in runs],
                key=lambda run: run["seed"])
  results[name] = {"row": summarize(_config_of(name), runs, floor_fid), "runs": runs,
                     "recipe": recipe, "commands": commands, "cpu": cpu,
                     "date": time.strftime("%Y-%m-%d")}
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + ".partial", "w") as f:
    json.dump(results, f, indent=1, sort_keys=True)
  os.replace(path + ".partial", path)
  return results


def stored_differences(docs, name, recipe, cpu):
  """What differs between these runs and row `name` stored in `<docs>`, which
  they would replace rather than join (see `save_runs`): [] when they join it
  or nothing is stored."""
  path = os.path.join(docs, "quality", "results.json")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return _differences(name, json.load(f).get(name), recipe, cpu)


def _differences(name, old, recipe, cpu):
  """Why runs of `recipe` on `cpu` cannot join the stored row `old` (None or {}:
  nothing stored, nothing to say); [] when they can."""
  if not old:
    return []
  stored = old.get("recipe") or {}
  differences = []
  if "runs" not in old or not stored:
    differences.append("it was stored without its runs or recipe (an older format)")
  for key, what in (("bindings", "gin bindings"), ("main_args", "main-job arguments")):
    if stored and stored.get(key) != recipe.get(key):
      differences.append(f"{what}: stored {stored.get(key)}, now {recipe.get(key)}")
  if stored and stored.get("source") != recipe.get("source"):
    differences.append(
        f"{'examples/mnist_dcgan.py' if name.startswith(MAIN) else 'the config file'} "
        f"changed since, comments and docstrings aside (digest {stored.get('source')}, now "
        f"{recipe.get('source')}; any code change counts, help texts too)")
  if old.get("cpu") != cpu:
    differences.append(f"CPU: stored {old.get('cpu')}, now {cpu}")
  return differences


def shown_command(argv):
  """The command as the docs show it: without where this machine kept its files, nor
  `--replace` (a rerun of the stored command should join its row, not replace it)."""
  shown, skip = [], False
  for arg in argv:
    if skip:
      skip = False
    elif arg in ("--workdir", "--docs"):
      skip = True
    elif arg != "--replace" and not arg.startswith(("--workdir=", "--docs=")):
      shown.append(arg)
  return " ".join(["python bench/gan_quality.py"] + [a if " " not in a else repr(a)
                                                     for a in shown])


def main(argv=None):
  parser = argparse.ArgumentParser(
      description=" ".join(__doc__.split("\n\n")[0].split()),
      epilog="Rows are stored in <docs>/quality/results.json and <docs>/quality.md; see the "
             "module's docstring.")
  parser.add_argument("--configs", default=",".join(CONFIGS),
                      help=f"comma-separated shipped configs (default: {','.join(CONFIGS)})")
  parser.add_argument("--seeds", type=int, help="how many seeds per config (default: 3)")
  parser.add_argument("--first-seed", type=int, default=0,
                      help="seeds FIRST .. FIRST+N-1; they join the stored row of the same "
                           "recipe (e.g. --seeds 1 --first-seed 2 adds a third seed)")
  parser.add_argument("--steps", type=int, help="train each to this step (default: the config's)")
  parser.add_argument("--gin", action="append", default=[],
                      help="an extra binding for every run (not main_job)")
  from ctl.runner import MIXED_PRECISIONS  # pylint: disable=import-outside-toplevel
  parser.add_argument("--mixed-precision", choices=MIXED_PRECISIONS,
                      help="train under this Keras policy: rows of their own, '<config> "
                           "(<policy>)'")
  parser.add_argument("--quick", action="store_true",
                      help="one seed, 10 narrow steps per config: checks the records (CI)")
  parser.add_argument("--workdir", default=os.path.join("runs", "quality"),
                      help="where the runs train, one folder each (default: runs/quality)")
  parser.add_argument("--docs", default=os.path.join(ROOT, "docs"),
                      help="where rows are stored and the table written (default: this "
                           "repository's docs/)")
  parser.add_argument("--no-docs", action="store_true", help="print only")
  parser.add_argument("--replace", action="store_true",
                      help="let these runs replace a stored row of another recipe or CPU "
                           "(without it, that is refused before anything trains)")
  args = parser.parse_args(argv)
  configs = [c.strip() for c in args.configs.split(",") if c.strip()]
  unknown = [c for c in configs if c not in CONFIGS]
  if unknown:
    parser.error(f"--configs: unknown {unknown}; choose from {', '.join(CONFIGS)}")
  if args.steps is not None and args.steps < 1:
    parser.error(f"--steps {args.steps}: give the step to train each run to, at least 1 "
                 "(leave it out for each config's own)")
  if args.quick and args.seeds is not None:
    parser.error(f"--quick --seeds {args.seeds}: --quick runs one short seed per config; "
                 "leave out --seeds, or --quick")
  args.seeds = 3 if args.seeds is None else args.seeds
  bindings = list(QUICK) if args.quick else []
  main_args = list(MAIN_QUICK) if args.quick else []
  if args.steps:
    bindings.append(f"gan.Schedule.total_steps = {args.steps}")
    main_args += ["--steps", str(args.steps)]
  if args.mixed_precision:
    bindings.append(f"gan.Experiment.mixed_precision = '{args.mixed_precision}'")
    main_args += ["--mixed-precision", args.mixed_precision]
  bindings += args.gin
  if args.seeds < 1 or args.first_seed < 0:
    parser.error(f"--seeds {args.seeds} --first-seed {args.first_seed}: give at least one "
                 "seed, the first at least 0")
  seeds = range(args.first_seed, args.first_seed + (1 if args.quick else args.seeds))
  sys.path.insert(0, os.path.join(ROOT, "bench"))
  from run import cpu_features  # pylint: disable=import-outside-toplevel
  cpu = cpu_features()
  recipes = {config: {"bindings": bindings, "main_args": main_args,
                      "source": source_digest(config)} for config in configs}
  if not (args.quick or args.no_docs or args.replace):
    for config in configs:  # before anything trains: a stored measurement is never lost
      name = row_name(config, args.mixed_precision)
      differences = stored_differences(args.docs, name, recipes[config], cpu)
      if differences:
        parser.error(
            f"{os.path.join(args.docs, 'quality', 'results.json')} holds row '{name}', "
            f"which these runs would replace rather than join: " + "; ".join(differences)
            + ". Give --replace to replace it (its seeds run again), --docs DIR to store "
            "rows elsewhere, or --no-docs to print only.")
  print(json.dumps(cpu), flush=True)
  floor_fid = floor()
  print(json.dumps({"floor": floor_fid}), flush=True)
  command = shown_command(argv if argv is not None else sys.argv[1:])
  results = {}
  for config in configs:
    name = row_name(config, args.mixed_precision)
    recipe = recipes[config]
    runs = []
    for seed in seeds:
      record = run_one(config, seed, os.path.join(args.workdir, _slug(name),
                                                  f"seed{seed}"), bindings, main_args)
      print(json.dumps({"run": record}), flush=True)
      runs.append(record)
    row = summarize(config, runs, floor_fid)
    print(json.dumps({"summary": row}), flush=True)
    if args.quick or args.no_docs:
      results[name] = {"row": row, "commands": [command.strip()], "cpu": cpu,
                       "date": time.strftime("%Y-%m-%d")}
      continue
    results = save_runs(args.docs, name, runs, floor_fid, command.strip(), cpu, recipe)
    if runs[0]["grid"] and runs[0]["seed"] == results[name]["runs"][0]["seed"]:
      os.makedirs(os.path.join(args.docs, "quality"), exist_ok=True)  # the first seed's
      shutil.copyfile(runs[0]["grid"], os.path.join(args.docs, "quality", _slug(name) + ".png"))
    if len(results[name]["runs"]) > len(runs):
      print(json.dumps({"summary_with_stored_runs": results[name]["row"]}), flush=True)
    with open(os.path.join(args.docs, "quality.md"), "w") as f:
      f.write(markdown(results))
  print(markdown(results))
  return 0


def as_a_command():
  """What the command line sets up before `main`: TensorFlow without its log lines
  (CTL_VERBOSE=1 shows them), and SIGTERM (`timeout`, `kill`) ending the benchmark
  through its `finally`s as Ctrl-C does, so that the training process it waits on
  ends with it."""
  from ctl.cli import quiet  # pylint: disable=import-outside-toplevel
  quiet.apply()
  signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


if __name__ == "__main__":
  as_a_command()
  sys.exit(main())
