"""The steering methods a benchmark compares: each a name, a way to make its steer from a
concept's data, and the factors its strength is chosen from.

The default factor grids are AxBench's (Wu et al., 2025):

- ``VECTOR_FACTORS`` (2, 4 ... 20, 25, 30, 40, 50) for a RePS vector, which trains at
  those strengths and is used as trained (m = 1);
- ``FACTORS`` (0.2, 0.4 ... 2.0, 2.5, 3, 4, 5) for LoReFT, BiPO and the baselines;
- ``LOREFT_FACTORS`` (0.2 ... 2.0) for a RePS-trained LoReFT, which trains at those.

A unit-norm direction (mean difference, PCA, the random control) is scaled by AxBench's
rule before its factor: m, the largest detection latent ``h·v̂`` over the concept's
positive texts (50 when that is not above 0), so factor 1 moves the residual as far as the
concept's strongest token already sits along the direction.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from steerlab.core.concepts import ConceptData
from steerlab.core.errors import SteerError
from steerlab.core.scalars import list_of, real_list
from steerlab.evals.detection import token_latents
from steerlab.train import bipo, reft, reps
from steerlab.train.reft import LOREFT_FACTORS
from steerlab.vectors import SteeringVector, extract, mean_diff, pca_diff

FACTORS = (0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.5, 3.0, 4.0, 5.0)
VECTOR_FACTORS = (2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0, 18.0, 20.0, 25.0, 30.0, 40.0, 50.0)
NO_LATENT = 50.0  # AxBench's m when the concept's largest latent is not above 0

Make = Callable[[Any, ConceptData, str], Any]


@dataclass(frozen=True)
class Method:
    """A steering method: ``make(lm, data, site)`` returns its steer for one concept.

    Args:
        name: the method's row in the leaderboard.
        make: builds the steer (a ``SteeringVector``, ``Steer``, ``LoReFT`` or a list).
        factors: the strengths the selection split chooses from; each multiplies the steer.
        needs: the ``ConceptData`` fields ``make`` reads (refused up front when empty).
        in_process: ``make`` reads activations or trains, which needs an in-process model
            (refused up front on vLLM).
        site: where this method's steer acts, when not at the benchmark's ``site=`` (its
            ``make`` is given this site); a steer made elsewhere is refused.

    >>> Method("twice-mean", make=lambda lm, data, site: None, factors=[1, 2]).factors
    (1.0, 2.0)
    """

    name: str
    make: Make
    factors: Sequence[float] = FACTORS
    needs: tuple[str, ...] = ()
    in_process: bool = False
    site: str | None = None

    def __post_init__(self) -> None:
        _check_name(self.name, "Method")
        if self.site is not None and not isinstance(self.site, str):
            raise SteerError(f"Method {self.name!r}: site must be a site name or None; got "
                             f"{self.site!r:.60}.")  # fmt: skip
        if not callable(self.make):
            raise SteerError(f"Method {self.name!r}: make must be a function "
                             "(lm, data, site) -> steer.")  # fmt: skip
        object.__setattr__(self, "factors",
                           tuple(real_list(self.factors, f"Method {self.name!r} factors")))  # fmt: skip
        object.__setattr__(self, "needs", tuple(list_of(self.needs, f"Method {self.name!r} needs")))


@dataclass(frozen=True)
class Prompting:
    """The prompting baseline: the unsteered model, told the concept in its prompt.

    Args:
        prompt: the prompt; None: the judge's model writes one per concept, as AxBench
            does (the judge needs ``write_prompt(concept)``).
        template: how the prompt and an instruction become the model's input: ``{prompt}``
            and ``{instruction}`` are filled in by name, every other brace is text (JSON
            included). A template without ``{prompt}`` is the unsteered model on the
            instruction alone (``Prompting(template="{instruction}", name="unsteered")``):
            no prompt is written or given.
        name: the arm's row in the leaderboard.
        factors: the arm's factor (prompting has no strength; kept for the tables).
    """

    prompt: str | None = None
    template: str = "{prompt}\n\nQuestion: {instruction}"
    name: str = "prompt"
    factors: Sequence[float] = field(default=(1.0,))
    needs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_name(self.name, "Prompting")
        if self.prompt is not None and (not isinstance(self.prompt, str) or not self.prompt):
            raise SteerError(f"Prompting prompt must be a non-empty string or None; got "
                             f"{self.prompt!r:.60}.")  # fmt: skip
        _check_template(self.template)
        if self.prompt is not None and "{prompt}" not in self.template:
            raise SteerError(f"Prompting template {self.template!r:.60} has no {{prompt}}, so the "
                             f"prompt {self.prompt!r:.40} would never be used: leave prompt=None "
                             "for the instruction alone, or put {prompt} in the template.",
                             "prompt")  # fmt: skip
        object.__setattr__(self, "factors", tuple(real_list(self.factors, "Prompting factors")))
        object.__setattr__(self, "needs", tuple(list_of(self.needs, "Prompting needs")))

    def inputs(self, prompt: str, instructions: Sequence[str]) -> list[str]:
        """The model's input for each instruction: the template, filled by name."""
        return [_fill(self.template, {"prompt": prompt, "instruction": i})
                for i in list_of(instructions, "instructions")]  # fmt: skip

    @property
    def asks_judge(self) -> bool:
        """Whether the judge writes this arm's prompt (none given, and the template uses one)."""
        return self.prompt is None and "{prompt}" in self.template

    def prompt_for(self, judge: Any, concept: str) -> str:
        """This arm's prompt for ``concept``: its own, or the one the judge writes (checked:
        a prompt the judge wrote in no usable form is refused, naming the concept)."""
        if self.prompt is not None:
            return self.prompt
        if not self.asks_judge:
            return ""  # the template uses no prompt
        return check_written_prompt(judge.write_prompt(concept), concept)


_FIELD = re.compile(r"\{(prompt|instruction)\}")  # the template's only fields, by name


def _fill(template: str, values: dict[str, str]) -> str:
    """``template`` with each ``{name}`` replaced, in one pass: a value is never read again
    (an instruction holding "{prompt}" stays as it is)."""
    return _FIELD.sub(lambda m: values[m[1]], template)


_FIELD_LIKE = re.compile(r"\{(?:prompt|instruction)[.\[!:][^{}]*\}")  # str.format's extras


def _check_template(template: Any) -> None:
    """A template with ``{instruction}``; a field with ``str.format``'s attribute, index,
    conversion or format spec (``{instruction.upper}``, ``{prompt!r}``) is refused by name,
    since it is not filled: only plain ``{prompt}`` and ``{instruction}`` are."""
    extra = _FIELD_LIKE.search(template) if isinstance(template, str) else None
    if extra:
        raise SteerError(f"Prompting template has the field {extra[0]!r:.60}: only {{prompt}} "
                         "and {instruction} are filled in, as they are (every other brace is "
                         "text).", "template")  # fmt: skip
    if not isinstance(template, str) or "{instruction}" not in template:
        raise SteerError("Prompting template must contain {instruction} (and may contain "
                         f"{{prompt}}); got {template!r:.80}.", "template")  # fmt: skip


_FUNCTION_WORDS = frozenset({"a", "an", "and", "are", "as", "at", "be", "by", "for", "from",
                             "in", "into", "is", "it", "of", "on", "or", "that", "the",
                             "their", "this", "to", "with", "about"})  # fmt: skip


def check_written_prompt(prompt: Any, concept: str) -> str:
    """A judge-written prompt, refused by the concept's name when it is not a usable
    prompt: not a non-empty string, holding a ``Rating:`` (the judge answered as if
    rating), or naming nothing of the concept (none of its words, each matched by its
    first four letters, so "oceans" matches "ocean").

    >>> check_written_prompt("Always bring the ocean into your answers.", "oceans")
    'Always bring the ocean into your answers.'
    """
    if not isinstance(prompt, str) or not prompt.strip():
        raise SteerError(f"The judge wrote no prompt for the concept {concept!r} (its "
                         f"write_prompt returned {prompt!r:.60}); give "
                         "sl.evals.Prompting(prompt='...').")  # fmt: skip
    prompt = prompt.strip()
    if "rating:" in prompt.lower():
        raise SteerError(f"The prompt the judge wrote for the concept {concept!r} holds a "
                         f"'Rating:', as if it were rating, not writing a prompt: "
                         f"{prompt!r:.120}.")  # fmt: skip
    words = re.findall(r"\w+", concept.lower())
    content = [w for w in words if w not in _FUNCTION_WORDS] or words
    text = prompt.lower()
    if content and not any(w[:4] in text for w in content):
        raise SteerError(f"The prompt the judge wrote for the concept {concept!r} names none "
                         f"of the concept's words: {prompt!r:.120}.")  # fmt: skip
    return prompt


def _check_name(name: Any, kind: str) -> None:
    if not isinstance(name, str) or not name.strip():
        raise SteerError(f"{kind} name must be a non-empty string; got {name!r:.60}.", "name")


def _scaled_direction(method: Any) -> Make:
    """A unit direction from positives and negatives, times AxBench's m."""

    def make(lm: Any, data: ConceptData, site: str) -> SteeringVector:
        vec = extract(lm, list(data.positives), list(data.negatives), [site], method,
                      token="mean", progress=False).normalized()  # fmt: skip
        return vec * concept_scale(lm, data, site, vec[site])

    return make


def concept_scale(lm: Any, data: ConceptData, site: str, direction: torch.Tensor) -> float:
    """AxBench's m: the largest ``h·v̂`` over the positives' tokens; 50 if not above 0."""
    top = float(token_latents(lm, list(data.positives), site, direction).max())
    return top if top > 0 else NO_LATENT


def _random(lm: Any, data: ConceptData, site: str) -> SteeringVector:
    """A random unit direction (seeded by a hash of the concept's name) with mean
    difference's m."""
    reference = _scaled_direction(mean_diff)(lm, data, site)
    seed = int.from_bytes(hashlib.sha256(data.name.encode()).digest()[:8], "little")
    direction = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(seed))
    return SteeringVector({site: direction / direction.norm()}, 1.0) * reference.scale


def _trained(train: Callable[..., Any], **settings: Any) -> Make:
    def make(lm: Any, data: ConceptData, site: str) -> Any:
        return train(lm, list(data.pairs), site=site, progress=False, **settings)[0]

    return make


def _reft_on_examples(lm: Any, data: ConceptData, site: str) -> Any:
    return reft(lm, data.examples, site=site, progress=False)[0]


_DIRECTION = ("positives", "negatives")
BUILT_IN: dict[str, Method | Prompting] = {
    "mean_diff": Method("mean_diff", _scaled_direction(mean_diff), FACTORS, _DIRECTION, True),
    "pca": Method("pca", _scaled_direction(pca_diff), FACTORS, _DIRECTION, True),
    "bipo": Method("bipo", _trained(bipo), FACTORS, ("pairs",), True),
    "reps": Method("reps", _trained(reps), VECTOR_FACTORS, ("pairs",), True),
    "reft": Method("reft", _reft_on_examples, FACTORS, ("pairs",), True),
    "reps_reft": Method(
        "reps_reft", _trained(reft, objective="reps"), LOREFT_FACTORS, ("pairs",), True
    ),  # fmt: skip
    "prompt": Prompting(),
    "random": Method("random", _random, FACTORS, _DIRECTION, True),
}


def resolve_methods(methods: Any) -> list[Method | Prompting]:
    """Names and ``Method``/``Prompting`` objects as methods; an unknown name is refused
    with the closest known one."""
    if isinstance(methods, (str, Method, Prompting)):
        methods = [methods]
    if not isinstance(methods, Sequence) or not methods:
        raise SteerError(f"methods must be a non-empty list of names or sl.evals.Method; got "
                         f"{methods!r:.80}.")  # fmt: skip
    out: list[Method | Prompting] = []
    for item in methods:
        if isinstance(item, (Method, Prompting)):
            out.append(item)
        elif isinstance(item, str) and item in BUILT_IN:
            out.append(BUILT_IN[item])
        elif isinstance(item, str):
            close = difflib.get_close_matches(item, list(BUILT_IN), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise SteerError(f"Unknown method {item!r}.{hint} Known: {', '.join(BUILT_IN)}; "
                             "or pass sl.evals.Method(name, make=..., factors=...).")  # fmt: skip
        else:
            raise SteerError(f"A method is a name or an sl.evals.Method; got "
                             f"{type(item).__name__} {item!r:.60}.")  # fmt: skip
    names = [m.name for m in out]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise SteerError(f"Method names repeat: {repeated}; give each method its own name.")
    return out
