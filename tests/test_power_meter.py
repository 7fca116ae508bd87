"""accel_kit.devices.power, the package's face: every part's names re-exported, and no vendor library loaded."""
import os
import subprocess
import sys
from pathlib import Path

from accel_kit.devices import power
from accel_kit.devices.power import counter, hlml, meter, nvml, rapl, zeus_gpu

ROOT = Path(__file__).resolve().parent.parent
VENDOR = ("zeus", "pynvml", "pyhlml", "amdsmi")  # the packages the readers (and Zeus) import


def test_the_face_re_exports_every_part():
    """The adapters and the engine import these names from accel_kit.devices.power: the same objects as the parts'."""
    for name in power.__all__:
        assert hasattr(power, name), name
    assert power.EnergyWindow is meter.EnergyWindow and power.UnavailableMeter is meter.UnavailableMeter
    assert power.CounterMeter is counter.CounterMeter and power.rapl_meter is rapl.rapl_meter
    assert power.zeus_gpu_meter is zeus_gpu.zeus_gpu_meter and power.nvml_meter is nvml.nvml_meter
    assert power.hlml_meter is hlml.hlml_meter


_CHECK = f"""
import importlib, pkgutil, sys
VENDOR = {VENDOR!r}
import torch  # torch.cuda tries pynvml on import: drop what torch loaded, so that an import of ours shows
for name in [n for n in sys.modules if n.split(".")[0] in VENDOR]:
    del sys.modules[name]
import accel_kit.devices.power as power
for part in pkgutil.iter_modules(power.__path__):
    importlib.import_module("accel_kit.devices.power." + part.name)
print("after import:", sorted(n for n in sys.modules if n.split(".")[0] in VENDOR))
power.zeus_gpu_meter(0, api="test"), power.nvml_meter(0), power.hlml_meter(0)
print("after the readers:", sorted(n for n in sys.modules if n.split(".")[0] in VENDOR))
"""


def test_importing_the_package_loads_no_vendor_library(tmp_path):
    """In a fresh interpreter where every vendor package can be imported (empty stand-ins on the path), importing
    the package and all its parts (after torch, which loads pynvml itself) leaves none in sys.modules; asking the
    readers for a meter imports them."""
    (tmp_path / "zeus").mkdir()
    for path in ("zeus/__init__.py", "zeus/device.py", "zeus/monitor.py", "pynvml.py", "pyhlml.py", "amdsmi.py"):
        (tmp_path / path).write_text("")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))
    proc = subprocess.run([sys.executable, "-c", _CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "after import: []" in proc.stdout
    # the stand-ins were importable, so a module-level import would have shown above
    assert "after the readers: ['pyhlml', 'pynvml', 'zeus', 'zeus.device']" in proc.stdout, proc.stdout
