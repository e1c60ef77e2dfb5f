"""test_package.py: `import dcomm` without torch, on 3 ranks under dcomm-run."""
import os
import re

from conftest import HERE, run_ranks


def test_numpy_and_buffers(tmp_path):
    rc, outs, text = run_ranks(str(tmp_path / "ckpt"), 3, script=os.path.join(HERE, "np_worker.py"))
    assert rc == 0, text
    assert len([o for o in outs.values() if re.search(r"^OK package", o, re.M)]) == 3, text


def test_import_needs_no_torch():
    import subprocess
    import sys
    code = "import sys; sys.modules['torch'] = None; import dcomm; print(dcomm.__version__)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and re.match(r"\d+\.\d+\.\d+", p.stdout), p.stdout + p.stderr
