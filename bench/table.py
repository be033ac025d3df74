"""Turns bench/run.py's JSON lines into the Markdown tables of docs/performance.md.

    python bench/run.py > bench.txt && python bench/table.py bench.txt
"""

import json
import sys


def read_rows(lines):
  """The benchmark rows and the kernel line from run.py's output."""
  rows, kernel = [], None
  for line in lines:
    if not line.startswith("{"):
      continue
    record = json.loads(line)
    if "kernel" in record:
      kernel = record
    else:
      rows.append(record)
  return rows, kernel


def markdown(rows, kernel):
  out = ["| workload | strategy | variant | ms/step | examples/s | ratio to hand-written "
         "| GFLOP/s | share of ceiling | traces after first call |",
         "|---|---|---|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    share = "" if r["share_of_ceiling"] is None else f"{r['share_of_ceiling']:.2f}"
    out.append(f"| {r['workload']} | {r['strategy']} | {r['variant']} | "
               f"{r['ms_per_step']:.3f} | {r['examples_per_s']:.1f} | "
               f"{r['ratio_to_handwritten']:.3f} | {r['gflop_per_s']:.2f} | {share} | "
               f"{r['traces_after_first_call']} |")
  if kernel:
    out.append("")
    speed = kernel["bfloat16_speed_vs_float32"]
    out.append(f"Kernel ceiling ({kernel['kernel']}, forward and backward, float32): "
               f"{kernel['ceiling_gflop_per_s']:.1f} GFLOP/s" + ("." if speed is None else
               f"; its forward in bfloat16 runs at {speed:.2f}x float32's speed."))
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
  return "\n".join(out)


def main():
  with open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin as f:
    print(markdown(*read_rows(f)))


if __name__ == "__main__":
  main()
