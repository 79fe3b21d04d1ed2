"""``connect``: a steering server as a model, with ``generate`` and ``stream`` like a local one.

>>> remote = sl.connect("http://127.0.0.1:8000")  # needs a running steerlab server  # doctest: +SKIP
>>> remote.generate("Once upon a time", max_new_tokens=5).text  # needs that server  # doctest: +SKIP
[', there was a little']

Requests go to the server's ``/v1/batch`` endpoint, which lays rows out and seeds them as
``lm.generate`` does in-process: the same call gives the same tokens either way. Steers
travel as data (site, the vector's floats, alphas, positions, op); custom operations,
activation capture and KV caches stay in-process. Needs ``httpx`` (the ``server`` extra).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from steerlab.core.doors import takes_options
from steerlab.core.monitors import as_monitors
from steerlab.core.prompts import Prompt, normalise
from steerlab.core.request import Readout, Sampling
from steerlab.core.results import Generation, Step, read_fields
from steerlab.core.rows import SteerArg, as_steers
from steerlab.core.scalars import flag


class ServerError(RuntimeError):
    """A request the server refused or failed: its status, message and the field at fault."""

    def __init__(self, status: int, message: str, param: str | None) -> None:
        where = f" ({param})" if param else ""
        super().__init__(f"{status}{where}: {message}")
        self.status, self.message, self.param = status, message, param


class RemoteModel:
    """A model behind a steerlab server; build it with ``connect``."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout: float = 600.0) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        card = self._get("/v1/models")["data"][0]
        self.name: str = card["id"]
        self.n_layers: int = card["n_layers"]
        self.d_model: int = card["d_model"]
        self.n_ctx: int | None = card["n_ctx"]
        self.pins: dict[str, str] = {}  # vector name -> the sha256 this client uploaded
        self._sites: list[str] = card["sites"]
        self.amplifies: bool = bool(card.get("amplifies", False))  # it holds a 'before' model
        self.beta: float | None = card.get("beta")  # its default beta (None: no amplification)

    def sites(self) -> list[str]:
        return list(self._sites)

    def hook_count(self) -> int:
        """Steerlab hooks on the server's models right now (0 between batches)."""
        return int(self._get("/health")["hooks"])

    @takes_options
    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        steer: SteerArg = None,
        *,
        chat: bool = False,
        capture: Sequence[str] = (),
        use_cache: bool = True,
        cache: Any = None,
        keep_cache: bool = False,
        amplify: float | None = None,
        monitor: Any = None,
        **options: Any,
    ) -> Generation:
        """``SteerableModel.generate`` on the server; ``amplify=beta`` asks for LDA.
        Conditioned steers and ``monitor=`` come back as ``out.fired``,
        ``out.condition_scores`` and ``out.monitors``, as from a local model."""
        body = self._body(prompts, steer, locals())
        return _generation(self._post("/v1/batch", body), body)

    @takes_options
    def stream(
        self,
        prompts: Prompt | Sequence[Prompt],
        steer: SteerArg = None,
        *,
        chat: bool = False,
        capture: Sequence[str] = (),
        use_cache: bool = True,
        cache: Any = None,
        keep_cache: bool = False,
        amplify: float | None = None,
        monitor: Any = None,
        **options: Any,
    ) -> Iterator[Step]:
        """``SteerableModel.stream`` on the server: a ``Step`` per decode step.

        Closing the generator early closes the connection, which frees the rows.
        """
        body = self._body(prompts, steer, locals())
        return _steps(self._events("/v1/batch", {**body, "stream": True}), body)

    def upload_vector(self, name: str, vector: Any, replace: bool = False) -> str:
        """Send a ``SteeringVector`` or an ``sl.LoReFT`` (or a ``.safetensors`` /
        ``.reft.safetensors`` path) to the server as ``name``; returns its content
        fingerprint (sha256), which ``pins[name]`` keeps.

        The same content again is a no-op; other content under a held name is refused
        (``ServerError`` 409) unless ``replace``. Steering entries that name the vector can
        carry ``pins[name]`` as their ``sha256``, so a later replacement is a 409, never a
        silent change (this client sends its own steers inline, by value).
        """
        import tempfile

        if isinstance(vector, (str, Path)):
            data = Path(vector).read_bytes()
        else:
            with tempfile.TemporaryDirectory() as folder:
                data = vector.save(Path(folder) / "vector.safetensors").read_bytes()
        params = {"name": name, "replace": "true" if replace else "false"}
        stored = self._check(self._http.post("/v1/vectors", params=params, content=data))
        self.pins[name] = stored["sha256"]
        return stored["sha256"]

    def vectors(self) -> list[dict[str, Any]]:
        return self._get("/v1/vectors")["data"]

    def delete_vector(self, name: str) -> None:
        self._check(self._http.delete(f"/v1/vectors/{name}"))

    def close(self) -> None:
        self._http.close()

    def __repr__(self) -> str:
        return f"RemoteModel({self.name!r} at {self.url}, n_layers={self.n_layers}, d_model={self.d_model})"

    # --- wire -------------------------------------------------------------------------

    def _body(self, prompts: Any, steer: SteerArg, args: dict[str, Any]) -> dict[str, Any]:
        flag(args["use_cache"], "use_cache")  # one rule for boolean options (``core.scalars``)
        if args["capture"] or args["cache"] is not None or flag(args["keep_cache"], "keep_cache"):
            raise ValueError(
                "capture, cache and keep_cache run in-process only; use a local model."
            )
        listed = normalise(prompts)
        sampling = Sampling.of(args["options"])  # checked here, sent by wire name
        body: dict[str, Any] = {
            "model": self.name, **sampling.wire(), "chat": flag(args["chat"], "chat"),
            "steering": [s.to_data() for s in as_steers(steer)],
            "prompts": [p if isinstance(p, str) else {"prompt": p} for p in listed],
        }  # fmt: skip
        if args["amplify"] is not None:
            body["amplify"] = {"beta": args["amplify"]}
        monitors = as_monitors(args["monitor"])
        if monitors:
            body["monitor"] = [{"name": m.name, "site": m.site,
                                "vector": m.direction.float().tolist()} for m in monitors]  # fmt: skip
        body["_prompts"] = listed  # kept client-side for the Generation
        return body

    def _get(self, path: str) -> dict[str, Any]:
        return self._check(self._http.get(path))

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        wire = {k: v for k, v in body.items() if not k.startswith("_")}
        return self._check(self._http.post(path, json=wire))

    def _events(self, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        wire = {k: v for k, v in body.items() if not k.startswith("_")}
        with self._http.stream("POST", path, json=wire) as response:
            if response.status_code >= 400:
                response.read()
                self._check(response)
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: ") :])
                if "error" in event:
                    error = event["error"]
                    raise ServerError(error.get("code", 500), error["message"], error.get("param"))
                yield event

    @staticmethod
    def _check(response: Any) -> dict[str, Any]:
        if response.status_code >= 400:
            try:
                error = response.json()["error"]
            except (ValueError, KeyError, TypeError):
                error = {"message": response.text, "param": None}
            raise ServerError(response.status_code, error["message"], error.get("param"))
        return response.json()


def connect(url: str, *, api_key: str | None = None, timeout: float = 600.0) -> RemoteModel:
    """A model served by ``steerlab serve`` at ``url``, with ``generate`` and ``stream``.

    >>> remote = connect("http://127.0.0.1:8000")  # needs a running steerlab server  # doctest: +SKIP
    """
    return RemoteModel(url, api_key=api_key, timeout=timeout)


def _generation(reply: dict[str, Any], body: dict[str, Any]) -> Generation:
    rows = [(result, row) for result in reply["results"] for row in result["rows"]]
    return Generation(
        text=[row["text"] for _, row in rows],
        tokens=[row["token_ids"] for _, row in rows],
        prompt_tokens=[result["prompt_token_ids"] for result, _ in rows],
        finish_reasons=[row["finish_reason"] for _, row in rows],
        prompt_index=[result["index"] for result, _ in rows],
        alphas=[tuple(row["alphas"]) for _, row in rows],
        logprobs=[row["logprobs"] or [] for _, row in rows],
        prompts=body["_prompts"],
        seed=reply["seed"],
        **_reads([row for _, row in rows]),
    )


def _reads(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``Generation``'s read fields from the rows' steerlab extension fields."""

    def floats(values: list[float | None]) -> tuple[float, ...]:
        return tuple(math.nan if v is None else v for v in values)

    parsed = [(row.get("fired"), floats([row.get("condition_score")])[0],
               {name: Readout(m["site"], floats(m["prompt"]), floats(m["generated"]))
                for name, m in (row.get("monitors") or {}).items()})
              for row in rows]  # fmt: skip
    fired, scores, monitors = read_fields(parsed)
    return {"fired": fired, "condition_scores": scores, "monitors": monitors}


class _RemoteStates:
    """Each row's text after each step, as the server streamed it (for ``Step.text``)."""

    def __init__(self, n: int) -> None:
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.logprobs: list[list[float]] = [[] for _ in range(n)]
        self.texts: list[dict[int, str]] = [{0: ""} for _ in range(n)]
        self.reasons, self.done = ["length"] * n, [False] * n

    def add(self, delta: dict[str, Any]) -> None:
        r = delta["row"]
        self.tokens[r] += delta["tokens"]
        self.logprobs[r] += delta["logprobs"]
        self.texts[r][len(self.tokens[r])] = self.text(r) + delta["text"]
        self.done[r], self.reasons[r] = (
            delta["done"],
            delta["reason"] if delta["done"] else "length",
        )

    def text(self, row: int, length: int | None = None, reason: str | None = None) -> str:
        texts = self.texts[row]
        n = len(self.tokens[row]) if length is None else length
        return texts[max(k for k in texts if k <= n)]


def _steps(events: Iterator[dict[str, Any]], body: dict[str, Any]) -> Iterator[Step]:
    plan = next(events)
    n = len(plan["prompt_index"])
    states = _RemoteStates(n)
    lengths = [0] * n
    pending: list[dict[str, Any]] = []
    final: dict[str, Any] = {}  # the read fields, from the result that ends the stream

    def step(index: int, deltas: list[dict[str, Any]]) -> Step:
        nonlocal lengths
        before = lengths
        for delta in deltas:
            states.add(delta)
        lengths = [len(t) for t in states.tokens]
        new = [-1] * n
        for delta in deltas:
            if delta["tokens"]:
                new[delta["row"]] = delta["tokens"][-1]
        reasons = list(states.reasons)
        snapshot = (list(lengths), reasons)

        def result(given: list[int] | None) -> Generation:
            at = given or snapshot[0]
            return Generation(
                text=[states.text(r, at[r]) for r in range(n)],
                tokens=[states.tokens[r][: at[r]] for r in range(n)],
                prompt_tokens=plan["prompt_token_ids"], finish_reasons=snapshot[1],
                prompt_index=plan["prompt_index"], alphas=[tuple(a) for a in plan["alphas"]],
                logprobs=[states.logprobs[r][: at[r]] for r in range(n)],
                prompts=body["_prompts"], seed=plan["seed"], **final,
            )  # fmt: skip

        return Step(index, new, list(states.done), result, states, list(lengths), before, reasons)

    for event in events:
        if event.get("object") != "batch.delta":
            rows = [row for result in event.get("results", []) for row in result["rows"]]
            final.update(_reads(rows) if rows else {})
            break
        if pending and event["step"] != pending[0]["step"]:
            yield step(pending[0]["step"], pending)
            pending = []
        pending.append(event)
    if pending:
        yield step(pending[0]["step"], pending)
