"""The distribution `ctl-loops`, installed from its wheel, runs outside the repo.

The sdist is built from a copy of what it needs (ctl/, gan/, pyproject.toml,
README.md), and the wheel from the sdist (`python -m build`, no network), so
the sdist is shown to hold what the wheel needs. The wheel goes into a fresh
venv that sees this environment's packages (TensorFlow, gin, ...) through a
.pth file instead of installing them again (minutes and gigabytes), without
this environment's own (editable) ctl-loops, so that `ctl` and `gan` come
from the wheel. From a directory that is not the repo, `ctl train dcgan` then
trains the packaged config for a few steps.
"""

import glob
import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import time
import venv
import zipfile

import pytest

from helpers import QUIET
from helpers import ROOT
from helpers import TINY_GAN

pytestmark = pytest.mark.slow  # builds, installs, and trains in a subprocess
NAMES = ["bigan", "conditional_dcgan", "dcgan", "hinge_sn", "stacked_mnist", "tfgan_mnist",
         "wgan_gp"]


def _run(args, cwd, timeout=300):
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TF_CONFIG")}
  start = time.perf_counter()
  proc = subprocess.run(args, cwd=cwd, env=dict(env, **QUIET), capture_output=True, text=True,
                        timeout=timeout)
  seconds = time.perf_counter() - start
  print(f"{seconds:6.1f} s  {' '.join(os.path.basename(a) if os.sep in a else a for a in args)}")
  assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
  return proc


def _link_dependencies(venv_dir, farm):
  """Makes the venv at `venv_dir` see this environment's packages but its ctl-loops.

  `farm` gets a link to each entry of this environment's site-packages except
  ctl-loops' own (its metadata, the editable install's finder and .pth, and
  any ctl/ or gan/), and a .pth file in the venv adds it as a site directory.
  """
  os.makedirs(farm)
  for directory in site.getsitepackages():
    for name in os.listdir(directory):
      plain = name.lower().replace("-", "_")
      if (plain.startswith(("ctl_loops", "__editable__")) or name in ("ctl", "gan")
          or os.path.exists(os.path.join(farm, name))):
        continue
      os.symlink(os.path.join(directory, name), os.path.join(farm, name))
  python = os.path.join(venv_dir, "bin", "python")
  purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                            "['purelib'])"], capture_output=True, text=True, check=True)
  with open(os.path.join(purelib.stdout.strip(), "_dev_dependencies.pth"), "w") as f:
    f.write(f"import site; site.addsitedir({farm!r})\n")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
  """The sdist and wheel built, the wheel installed in a fresh venv, and `ctl train
  dcgan` run there from an empty directory; (sdist, wheel, venv, the directory, the
  output of pip and of ctl train)."""
  tmp = tmp_path_factory.mktemp("wheel")
  source = tmp / "source"
  for name in ("ctl", "gan"):
    shutil.copytree(os.path.join(ROOT, name), source / name,
                    ignore=shutil.ignore_patterns("__pycache__"))
  for name in ("pyproject.toml", "README.md"):
    shutil.copy(os.path.join(ROOT, name), source / name)
  dist = tmp / "dist"
  _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
       cwd=tmp)
  (sdist,), (wheel,) = glob.glob(str(dist / "*.tar.gz")), glob.glob(str(dist / "*.whl"))
  env_dir = str(tmp / "venv")
  venv.create(env_dir, with_pip=False)  # this environment's pip installs into it
  _link_dependencies(env_dir, str(tmp / "dependencies"))
  python = os.path.join(env_dir, "bin", "python")
  # --no-index: nothing is downloaded; the dependencies must be found installed.
  pip = _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-index",
              wheel], cwd=tmp)
  workdir = tmp / "elsewhere"
  workdir.mkdir()
  train = _run([os.path.join(env_dir, "bin", "ctl"), "train", "dcgan", *TINY_GAN],
               cwd=workdir)
  return sdist, wheel, env_dir, workdir, pip, train


def test_the_wheel_installs_and_trains_a_shipped_config_outside_the_repo(installed):
  sdist, wheel, env_dir, workdir, pip, train = installed
  assert os.path.basename(wheel) == "ctl_loops-0.1.0-py3-none-any.whl"
  with tarfile.open(sdist) as archive:
    in_sdist = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
  with zipfile.ZipFile(wheel) as archive:
    in_wheel = set(archive.namelist())
  for name in ["README.md", "gan/data/mnist_train_5k.npz", "gan/data/mnist_test_5k.npz",
               "gan/data/mnist_classifier_v1.weights.h5",
               "gan/data/mnist_second_classifier_v1.weights.h5", "ctl/py.typed",
               "gan/py.typed"] + [
                   f"gan/configs/{n}.gin" for n in NAMES]:
    assert name in in_sdist, name
    assert name in in_wheel or name == "README.md", name
  # pip found every dependency installed (--no-index would have failed otherwise)
  assert "Requirement already satisfied: tensorflow" in pip.stdout
  assert "Successfully installed ctl-loops-0.1.0" in pip.stdout

  # ctl, gan and every config are the wheel's, not the repo's (nor the editable install's)
  where = json.loads(_run([
      os.path.join(env_dir, "bin", "python"), "-c", "import json, ctl, gan; from ctl.tools "
      "import configs; print(json.dumps([ctl.__file__, gan.__file__, configs.shipped()]))"],
      cwd=workdir).stdout)
  assert list(where[2]) == NAMES, where
  venv_root = os.path.realpath(env_dir)
  for path in where[:2] + list(where[2].values()):
    assert os.path.realpath(path).startswith(venv_root + os.sep), where
    assert not os.path.realpath(path).startswith(os.path.realpath(ROOT) + os.sep), where

  assert f"outputs in {os.path.join('runs', 'dcgan')}" in train.stdout
  checkpoints = workdir / "runs" / "dcgan" / "checkpoints"
  assert any(n.startswith("ckpt-4") for n in os.listdir(checkpoints)), os.listdir(checkpoints)
  operative = (checkpoints / "operative_config.gin").read_text()
  assert "Schedule.total_steps = 4" in operative
