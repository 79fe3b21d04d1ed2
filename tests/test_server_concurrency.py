"""32 concurrent mixed requests decode in shared batches, and each equals its solo run;
clients that disconnect free their rows, a failing vector fails its request alone."""

import json
import threading

import httpx
import torch
from server_helpers import HEADERS, post, served

import steerlab as sl

MODEL = "steerlab-tiny"
PROMPTS = ["Once upon a time", "Hi", "The sea was", "A fox"]


def _request(i: int, vectors: list[torch.Tensor]) -> dict:
    site = f"blocks.{i % 4}.hook_resid_pre"
    steer = [] if i % 5 == 0 else [{"site": site, "vector": vectors[i % 3].tolist(),
                                     "alpha": float(i % 7 - 3) * 2, "positions": "generated"}]  # fmt: skip
    return {"model": MODEL, "prompt": PROMPTS[i % 4], "max_tokens": 4 + (i * 5) % 17,
            "temperature": [0.0, 0.8, 1.2][i % 3], "seed": i, "steering": steer,
            "stream": i % 4 == 1}  # fmt: skip


def _solo(ref: sl.SteerableModel, body: dict) -> list[int]:
    steers = [sl.Steer(s["site"], torch.tensor(s["vector"]), s["alpha"], s["positions"])
              for s in body["steering"]]  # fmt: skip
    out = ref.generate(body["prompt"], steers, max_new_tokens=body["max_tokens"],
                       temperature=body["temperature"], seed=body["seed"])  # fmt: skip
    return out.tokens[0]


def _send(url: str, body: dict, disconnect: bool) -> dict:
    with httpx.Client(headers=HEADERS, timeout=120) as client:
        if not body["stream"]:
            reply = client.post(f"{url}/v1/completions", json=body)
            return {"status": reply.status_code, **reply.json()}
        tokens: list[int] = []
        with client.stream("POST", f"{url}/v1/completions", json=body) as reply:
            for line in reply.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    return {"status": event["error"]["code"], **event}
                tokens += event["choices"][0]["token_ids"]
                if disconnect and len(tokens) >= 2:
                    return {"status": "disconnected"}  # leaving the block closes the connection
        return {"status": 200, "tokens": tokens}


def test_concurrent_mixed_requests_each_equal_their_solo_run():
    ref, lm = sl.load(MODEL, backend="hf"), sl.load(MODEL, backend="hf")
    gen = torch.Generator().manual_seed(0)
    vectors = [torch.randn(ref.d_model, generator=gen) for _ in range(3)]
    bodies = [_request(i, vectors) for i in range(32)]
    failing = 7  # a finite vector so large that the steered activations overflow to NaN
    bodies[failing]["steering"] = [{"site": "blocks.1.hook_resid_pre", "alpha": 1e10,
                                    "vector": [3e38] * ref.d_model}]  # fmt: skip
    leaving = {1, 13}  # streaming requests whose clients go away after two tokens
    for i in leaving:
        bodies[i]["max_tokens"] = 120
    expected = {i: _solo(ref, b) for i, b in enumerate(bodies) if i != failing and i not in leaving}
    results: dict[int, dict] = {}
    with served(lm, window_ms=50, max_batch_rows=64) as url:
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(
            i, _send(url, bodies[i], i in leaving))) for i in range(32)]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        health = httpx.get(f"{url}/health", headers=HEADERS).json()
        after = post(url, "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 3})
    for i, want in expected.items():
        got = results[i]["tokens"] if bodies[i]["stream"] else results[i]["choices"][0]["token_ids"]
        assert got == want, f"request {i}"
    assert results[failing]["status"] == 422
    assert results[failing]["error"]["param"] == "steering"
    assert all(results[i]["status"] == "disconnected" for i in leaving)
    assert health["batches"] < 16  # the requests shared batches
    assert health["cancelled"] == 2 and health["hooks"] == 0 and lm.hook_count() == 0
    assert after.status_code == 200
