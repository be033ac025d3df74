"""Turns bench/run.py's JSON lines into the Markdown tables of docs/performance.md.

    python bench/run.py > bench.txt && python bench/table.py bench.txt
"""

import json
import sys


def read_rows(lines):
  """run.py's records: {"rows", "first_step", "parameter_server", "targets": lists;
  "kernel", "cpu": the one such line or None}."""
  out = {"rows": [], "first_step": [], "parameter_server": [], "targets": [],
         "kernel": None, "cpu": None}
  for line in lines:
    if not line.startswith("{"):
      continue
    record = json.loads(line)
    if "kernel" in record:
      out["kernel"] = record
    elif "bfloat16_instructions" in record:
      out["cpu"] = record
    elif "target" in record:
      out["targets"].append(record)
    elif record.get("measure") in ("first_step", "parameter_server"):
      out[record["measure"]].append(record)
    else:
      out["rows"].append(record)
  return out


def markdown(records):
  rows, kernel, cpu = records["rows"], records["kernel"], records["cpu"]
  out = []
  if cpu:
    features = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in cpu["features"].items())
    out += [f"CPU: {cpu['cpu']}, {cpu['cores']} cores; {features}; oneDNN "
            f"{'on' if cpu['onednn'] else 'off'}; bfloat16 instructions: "
            f"{'yes' if cpu['bfloat16_instructions'] else 'no'}.", ""]
  out += ["| workload | strategy | variant | ms/step | examples/s | ratio to hand-written "
          "| floor | ratio to floor | GFLOP/s | share of ceiling | traces after first call |",
          "|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|"]
  for r in rows:
    share = "" if r["share_of_ceiling"] is None else f"{r['share_of_ceiling']:.2f}"
    out.append(f"| {r['workload']} | {r['strategy']} | {r['variant']} | "
               f"{r['ms_per_step']:.3f} | {r['examples_per_s']:.1f} | "
               f"{r['ratio_to_handwritten']:.3f} | {r.get('floor', 'handwritten')} | "
               f"{r.get('ratio_to_floor', r['ratio_to_handwritten']):.3f} | "
               f"{r['gflop_per_s']:.2f} | {share} | {r['traces_after_first_call']} |")
  if records["first_step"]:
    out += ["", "Time from models built to the first step's result (fresh processes):", "",
            "| workload | variant | median s | min s | max s | ratio to hand-written |",
            "|---|---|---:|---:|---:|---:|"]
    for r in records["first_step"]:
      out.append(f"| {r['workload']} | {r['variant']} | {r['first_step_s']:.3f} | "
                 f"{r['min_s']:.3f} | {r['max_s']:.3f} | {r['ratio_to_handwritten']:.3f} |")
  if records["parameter_server"]:
    r0 = records["parameter_server"][0]
    out += ["", f"Parameter servers ({r0['workers']} workers, {r0['ps']} ps, local "
            f"processes), {r0['workload']}:", "",
            "| variant | ms/step | steps/s | ratio to one step per call |", "|---|---:|---:|---:|"]
    for r in records["parameter_server"]:
      out.append(f"| {r['variant']} | {r['ms_per_step']:.3f} | {r['steps_per_s']:.1f} | "
                 f"{r['ratio_to_one_step_per_call']:.3f} |")
  if kernel:
    out.append("")
    speed = kernel["bfloat16_speed_vs_float32"]
    out.append(f"Kernel ceiling ({kernel['kernel']}, forward and backward, float32): "
               f"{kernel['ceiling_gflop_per_s']:.1f} GFLOP/s" + ("." if speed is None else
               f"; its forward in bfloat16 runs at {speed:.2f}x float32's speed."))
    out.append("")  # a Markdown list needs a blank line before it
  for r in rows:
    if "input_wait_share" in r:
      out.append(f"- {r['workload']} ({r['strategy']}): input wait "
                 f"{100 * r['input_wait_share']:.1f}% of the step.")
    for key, gap in r.get("loss_gap", {}).items():
      out.append(f"- {r['workload']} mixed_bfloat16, {key}: mean |gap| to float32 "
                 f"{gap['mean_abs_gap']} over {gap['steps']} steps (means "
                 f"{gap['float32_mean']} float32, {gap['mixed_bfloat16_mean']} bfloat16).")
  out.append(f"- Peak resident memory of the benchmark process: "
             f"{max((r['peak_rss_mb'] for r in rows), default=0):.0f} MB.")
  if records["targets"]:
    out += ["", "| target | value | met |", "|---|---|---|"]
    for t in records["targets"]:
      met = {True: "yes", False: "no", None: "not measured"}.get(t["met"], t["met"])
      out.append(f"| {t['target']} | {t['value']} | {met} |")
  return "\n".join(out)


def main():
  with open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin as f:
    print(markdown(read_rows(f)))


if __name__ == "__main__":
  main()
