"""The README's quickstart blocks run as written (the hub-only large-model block aside)."""

import re
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


def test_quickstart_blocks_run(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    # the large-model block needs a hub and 8 GPUs; the training block's data is the
    # reader's (tutorial 11 trains on the toy under nbval); the Inspect recipe runs in
    # tests/test_inspect.py, the real-model benchmark recipe on the toy in
    # tests/test_concept_data.py
    runnable = [b for b in blocks if "meta-llama" not in b and "sl.train." not in b
                and "inspect_ai" not in b and "write_concept_data" not in b]  # fmt: skip
    assert len(runnable) == 9
    monkeypatch.chdir(tmp_path)  # the quickstart writes happy.safetensors and norms.pdf
    namespace: dict = {}
    for block in runnable:
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["lm"].hook_count() == 0
    assert len(namespace["out"].text) == 1
    assert (tmp_path / "happy.safetensors").stat().st_size > 0
    assert (tmp_path / "happy.gguf").read_bytes().startswith(b"GGUF")  # llama.cpp's format
    assert namespace["back"].directions.keys() == namespace["happy"].directions.keys()
    assert (tmp_path / "norms.pdf").read_bytes().startswith(b"%PDF-")
    assert namespace["acts"].sae is namespace["sae"]  # the SAE block ran
    assert [r["alpha"] for r in namespace["res"].summary] == [-8, -4, 0, 4, 8]  # evaluations
    board = {r["method"]: r["score"] for r in namespace["result"].leaderboard}  # the benchmark
    assert set(board) == {"mean_diff", "prompt", "random"}
    kept, merged = namespace["kept"], namespace["merged"]  # a run folder, and two shards'
    capability = namespace["capability"]  # the lm-eval recipe: both models on both toy tasks
    for side in (capability.unsteered, capability.steered):
        assert {"toy_sentiment", "toy_stories"} <= set(side["results"])
    assert capability.unsteered["results"] != capability.steered["results"]
    assert repr(list(merged.table)) == repr(list(kept.table)) and len(kept.table) == 4
