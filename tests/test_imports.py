"""``import steerlab`` stays light: the notebook layer and model libraries load on first use."""

import subprocess
import sys


def test_core_import_loads_no_notebook_or_model_libraries():
    code = (
        "import sys, steerlab\n"
        "heavy = {'plotly', 'ipywidgets', 'kaleido', 'transformers', 'transformer_lens'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
