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


def _contract_layers() -> list[list[str]]:
    """The layers of the import-linter contract that `make lint` checks, top first."""
    from pathlib import Path

    from importlinter.api import read_configuration

    config = read_configuration(str(Path(__file__).parents[1] / "pyproject.toml"))
    (layers,) = [c for c in config["contracts_options"] if c.get("containers") == ["steerlab"]]
    return [[name.strip() for name in layer.split("|")] for layer in layers["layers"]]


def test_type_annotations_point_down_too():
    """`make lint` exempts TYPE_CHECKING imports; none is needed: a module names nothing
    above its layer even in its annotations (core types against protocols, the facade names
    neither chat nor features)."""
    import grimp

    graph = grimp.build_graph("steerlab", exclude_type_checking_imports=False, cache_dir=None)
    layers = [grimp.Layer(*names, independent=True) for names in _contract_layers()]
    illegal = graph.find_illegal_dependencies_for_layers(layers=layers, containers={"steerlab"})
    assert sorted(f"{d.importer} -> {d.imported}" for d in illegal) == []
