"""Inspect AI's ``steerlab`` provider (issue 50): a task run through it equals ``lm.generate``
of the same prompts sample by sample, steered and not; Inspect's own OpenAI-compatible
provider against a steerlab server with the same preset gives the same texts; the ``inspect
eval`` command finds the provider through the entry point; bad arguments and settings it
cannot honour are refused by name, before the model loads or any compute."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import GenerateConfig, get_model
from inspect_ai.tool import ToolInfo
from server_helpers import KEY, served

import steerlab as sl
from steerlab.core.errors import SamplingError
from steerlab.evals import inspect_provider  # noqa: F401  # registers it (installed: the entry point)
from steerlab.evals.inspect_steering import InspectArgError
from steerlab.server.presets import Preset, load_file

REPO = Path(__file__).parents[1]
SITE_A, SITE_B = "blocks.1.hook_resid_pre", "blocks.2.hook_resid_pre"
PROMPTS = [f"Tell me a story about the number {i}." for i in range(32)]
NEW = 10


def _vector(site: str, seed: int) -> sl.SteeringVector:
    v = torch.randn(128, generator=torch.Generator().manual_seed(seed))
    return sl.SteeringVector({site: v}, scale=2.0)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("vectors")
    return {"a": _vector(SITE_A, 3).save(folder / "a.safetensors"),
            "b": _vector(SITE_B, 4).save(folder / "b.safetensors")}  # fmt: skip


def _task(prompts: list[str] = PROMPTS) -> Task:
    return Task(dataset=[Sample(input=p) for p in prompts])


def _texts(log) -> list[str]:
    assert log.status == "success", log.error
    by_id = sorted(log.samples, key=lambda s: s.id)
    return [s.output.completion for s in by_id]


def _expected(lm, steer, prompts: list[str] = PROMPTS, **options) -> sl.Generation:
    messages = [[{"role": "user", "content": p}] for p in prompts]
    return lm.generate(messages, steer, chat=True, max_new_tokens=NEW, **options)


def _count_engine_calls(monkeypatch, lm) -> list[int]:
    calls: list[int] = []
    stream = lm.engine.stream

    def counted(requests, **kwargs):
        calls.append(len(requests))
        return stream(requests, **kwargs)

    monkeypatch.setattr(lm.engine, "stream", counted)
    return calls


@pytest.mark.parametrize("steered", [False, True])
def test_a_task_equals_lm_generate_per_sample_in_far_fewer_engine_calls(
    toy_lm, files, monkeypatch, tmp_path, steered
):
    vec = sl.SteeringVector.load(files["a"], model=toy_lm) if steered else None
    calls = _count_engine_calls(monkeypatch, toy_lm)
    model = sl.evals.inspect_model(toy_lm, steer=vec, alpha=4 if steered else None,
                                   config=GenerateConfig(max_tokens=NEW))  # fmt: skip
    [log] = eval(_task(), model=model, display="none", log_dir=str(tmp_path))
    monkeypatch.undo()
    assert sum(calls) == 32 and len(calls) <= 8, calls  # Inspect's 32 concurrent calls, batched
    want = _expected(toy_lm, vec * 4 if steered else None)
    assert _texts(log) == want.text
    plain = _expected(toy_lm, None).text
    assert (_texts(log) != plain) == steered  # the steer changes the texts
    # usage: the chat prompt's tokens as transformers renders them, and the new tokens
    tok = toy_lm.tokenizer
    for sample, tokens in zip(sorted(log.samples, key=lambda s: s.id), want.tokens):
        text = tok.apply_chat_template([{"role": "user", "content": sample.input}],
                                       tokenize=False, add_generation_prompt=True)  # fmt: skip
        prompt = len(tok(text, add_special_tokens=False)["input_ids"])
        usage = sample.output.usage
        assert (usage.input_tokens, usage.output_tokens) == (prompt, len(tokens))
        assert usage.total_tokens == prompt + len(tokens)
    if steered:  # the log says what steered the model, and at what alpha
        [line] = log.eval.model_args["steer"]
        assert line.endswith(f"@4 (sha256 {vec.sha256[:16]})")
        assert log.samples[0].output.metadata["steer"] == [line]
    else:
        assert log.eval.model_args["steer"] == []


def test_steer_files_at_alphas_by_name_equal_lm_generate_with_both(toy_lm, files, tmp_path):
    args = {"steer": [f"{files['a']}@4", f"{files['b']}@-2"], "backend": "hf"}
    [log] = eval(_task(PROMPTS[:6]), model="steerlab/steerlab-tiny", model_args=args,
                 display="none", log_dir=str(tmp_path), max_tokens=NEW)  # fmt: skip
    a, b = (sl.SteeringVector.load(files[k], model=toy_lm) for k in "ab")
    assert _texts(log) == _expected(toy_lm, [a * 4, b * -2], PROMPTS[:6]).text
    steered = log.samples[0].output.metadata["steer"]
    assert [s.split(" ")[0] for s in steered] == [f"{files['a']}@4", f"{files['b']}@-2"]


def test_inspects_openai_provider_against_a_server_preset_gives_the_same_texts(
    toy_lm, files, tmp_path, monkeypatch
):
    prompts = PROMPTS[:6]
    config = GenerateConfig(max_tokens=NEW, temperature=0.0)
    [ours] = eval(_task(prompts), model="steerlab/steerlab-tiny", display="none",
                  model_args={"steer": f"{files['a']}@4"}, log_dir=str(tmp_path / "ours"),
                  **config.model_dump(exclude_none=True))  # fmt: skip
    preset = Preset("happy", load_file(str(files["a"]), toy_lm), 4.0)
    monkeypatch.setenv("STEERLAB_API_KEY", KEY)
    with served(toy_lm, presets=[preset]) as url:
        [theirs] = eval(_task(prompts), model="openai-api/steerlab/happy", display="none",
                        model_base_url=url + "/v1", log_dir=str(tmp_path / "theirs"),
                        **config.model_dump(exclude_none=True))  # fmt: skip
    assert _texts(theirs) == _texts(ours)
    assert _texts(ours) != _expected(toy_lm, None, prompts).text  # steered


def _entry_point_path(tmp_path: Path) -> list[str]:
    """Where ``inspect`` finds the provider: the installed steerlab's entry point (``pip
    install -e .``, as CI installs it), else the one ``pyproject.toml`` declares, given to the
    subprocess as a distribution's metadata of its own (a checkout that is not installed)."""
    declared = re.search(r"\[project\.entry-points\.inspect_ai\]\n(.+?)\n",
                         (REPO / "pyproject.toml").read_text()).group(1)  # fmt: skip
    name, value = (part.strip().strip('"') for part in declared.split("="))
    if any(ep.name == name and ep.value == value for ep in entry_points(group="inspect_ai")):
        return [str(REPO)]
    info = tmp_path / "steerlab_inspect_entry-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: steerlab-inspect-entry\n"
                                   "Version: 0\n")  # fmt: skip
    (info / "entry_points.txt").write_text(f"[inspect_ai]\n{name} = {value}\n")
    return [str(REPO), str(tmp_path)]


def test_the_inspect_command_steers_by_repeated_m_arguments(toy_lm, files, tmp_path):
    task = tmp_path / "task.py"
    task.write_text(
        "from inspect_ai import Task, task\nfrom inspect_ai.dataset import Sample\n\n"
        f"@task\ndef stories():\n    return Task(dataset=[Sample(input=p) for p in {PROMPTS[:4]!r}])\n"
    )
    paths = _entry_point_path(tmp_path / "ep")
    command = [sys.executable, "-m", "inspect_ai", "eval", task.name, "--model",
               "steerlab/steerlab-tiny", "-M", f"steer={files['a']}@4", "-M",
               f"steer={files['b']}@-2", "-M", "backend=hf", "--max-tokens", str(NEW),
               "--display", "none", "--log-format", "json", "--log-dir", str(tmp_path / "logs")]  # fmt: skip
    env = {"PYTHONPATH": ":".join(paths), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    [path] = (tmp_path / "logs").glob("*.json")
    log = json.loads(path.read_text())
    assert log["status"] == "success" and log["eval"]["model"] == "steerlab/steerlab-tiny"
    samples = sorted(log["samples"], key=lambda s: s["id"])
    a, b = (sl.SteeringVector.load(files[k], model=toy_lm) for k in "ab")
    want = _expected(toy_lm, [a * 4, b * -2], PROMPTS[:4]).text
    assert [s["output"]["choices"][0]["message"]["content"] for s in samples] == want
    steered = samples[0]["output"]["metadata"]["steer"]
    assert [s.split(" ")[0] for s in steered] == [f"{files['a']}@4", f"{files['b']}@-2"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"stear": "a.safetensors@4"}, r"-M stear"),
        ({"steer": "missing.safetensors@4"}, r"-M steer='missing.safetensors@4': no such file"),
        ({"steer": "FILE@abc"}, r"-M steer='.*@abc': ALPHA must be a number; got 'abc'"),
        ({"steer": "FILE"}, r"-M steer='.*': write VECTOR_FILE@ALPHA"),
        ({"steer": "FILE@4", "alpha": 2}, r"-M alpha"),
        ({"backend": "tf"}, r"-M backend='tf'"),
        ({"window_ms": "fast"}, r"-M window_ms='fast'"),
    ],
)
def test_a_bad_model_argument_is_refused_before_the_model_loads(files, monkeypatch, args,
                                                                message):  # fmt: skip
    def no_load(*_, **__):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("steerlab.evals.inspect_steering.load", no_load)
    args = {k: (v.replace("FILE", str(files["a"])) if isinstance(v, str) else v)
            for k, v in args.items()}  # fmt: skip
    with pytest.raises(InspectArgError, match=message):
        get_model("steerlab/steerlab-tiny", memoize=False, **args)


@pytest.mark.parametrize(
    ("config", "tools", "field"),
    [
        (GenerateConfig(num_choices=2), [], "num_choices"),
        (GenerateConfig(logprobs=True), [], "logprobs"),
        (GenerateConfig(top_logprobs=3), [], "top_logprobs"),
        (GenerateConfig(reasoning_effort="high"), [], "reasoning_effort"),
        (GenerateConfig(), [ToolInfo(name="add", description="Adds.")], "tools"),
    ],
)
def test_what_steerlab_cannot_honour_is_refused_by_name_before_compute(
    toy_lm, monkeypatch, config, tools, field
):
    model = sl.evals.inspect_model(toy_lm)
    calls = _count_engine_calls(monkeypatch, toy_lm)
    with pytest.raises(SamplingError, match=field) as error:
        asyncio.run(model.generate("Hi", tools=tools, config=config))
    assert error.value.field == field and calls == []


def test_a_closed_model_says_so_instead_of_waiting_for_good(toy_lm):
    with sl.evals.inspect_model(toy_lm) as model:
        assert asyncio.run(model.generate("Hi", config=GenerateConfig(max_tokens=2))).completion
    with pytest.raises(RuntimeError, match="is closed"):
        asyncio.run(model.generate("Hi"))


def test_generate_settings_are_honoured_as_lm_generate_takes_them(toy_lm):
    model = sl.evals.inspect_model(toy_lm)
    prompt = PROMPTS[0]
    options = {"temperature": 0.9, "top_p": 0.9, "top_k": 20, "seed": 7}
    free = _expected(toy_lm, None, [prompt], **options)
    stop = free.text[0][3:7]  # cut inside the text: the row ends there, the stop left out
    want = _expected(toy_lm, None, [prompt], stop=[stop], **options)
    assert want.text[0] == free.text[0][: free.text[0].index(stop)]
    config = GenerateConfig(max_tokens=NEW, stop_seqs=[stop], **options)
    out = asyncio.run(model.generate(prompt, config=config))
    assert out.completion == want.text[0] and out.stop_reason == "stop"
    out = asyncio.run(model.generate(prompt, config=GenerateConfig(max_tokens=NEW, **options)))
    assert out.completion == free.text[0]
    assert out.stop_reason == ("max_tokens" if len(free.tokens[0]) == NEW else "stop")


def test_the_readme_recipe_runs_as_written(tmp_path, monkeypatch):
    text = (REPO / "README.md").read_text()
    section = text[text.index("**Inspect AI.**") :]
    [block] = re.findall(r"```python\n(.*?)```", section[: section.index("\n## ")], flags=re.S)
    monkeypatch.chdir(tmp_path)  # Inspect writes its log under ./logs
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["log"].status == "success"
    [line] = namespace["log"].eval.model_args["steer"]
    assert line.startswith("SteeringVector(mean_diff)@4 ")
