"""The main job and README's example run, for a few steps, in fresh processes."""

import os
import re
import struct

import pytest

import helpers


def png_size(path):
  with open(path, "rb") as f:
    header = f.read(24)
  assert header[:8] == b"\x89PNG\r\n\x1a\n", path
  return struct.unpack(">II", header[16:24])


@pytest.mark.parametrize("strategy", [[], ["--strategy", "mirrored", "--logical-cpus", "2"]])
def test_main_job_trains_and_writes_samples(strategy, tmp_path):
  proc = helpers.python(["examples/mnist_dcgan.py", "--steps", "6", "--steps-per-loop", "3",
                         "--workdir", str(tmp_path)] + strategy)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("step ")]
  assert [l.split()[1] for l in lines] == ["3/6", "6/6"]
  losses = [float(v) for v in re.findall(r"_loss (\S+)", lines[-1])]
  assert len(losses) == 2 and all(0 < v < 10 for v in losses)
  assert png_size(os.path.join(tmp_path, "samples.png")) == (224, 224)


def test_readme_example_runs(tmp_path):
  with open(os.path.join(helpers.ROOT, "README.md")) as f:
    blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
  assert len(blocks) == 1
  code = blocks[0].replace("runner.train(1000)", "runner.train(4)")
  code += "\nassert history['generator_loss'].shape == (4,), history\nprint('ok')\n"
  script = tmp_path / "readme_example.py"
  script.write_text(code)
  assert helpers.python([str(script)]).stdout.strip().endswith("ok")
