"""``steerability``: does a steer move the concept, and what does it cost in fluency?

One batched generation carries every prompt x alpha (x sample) row through the engine, one
scoring pass reads every completion's likelihood under the unsteered model, and one forward
gives each prompt's next-token distribution at every alpha beside the unsteered one. Each
alpha then gets, with bootstrap intervals (``evals.intervals``):

- ``concept``: the scorer's mean over the alpha's completions (``text -> float``, or an LLM
  judge's ratings: ``Judge.concept``);
- ``perplexity``: the completions' pooled perplexity under the unsteered model (fluency);
- ``kl``: ``KL(steered || unsteered)`` of the first new token's distribution;
- ``length``: new tokens per completion.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from steerlab.core.ops import SteerError
from steerlab.core.prompts import Prompt, normalise
from steerlab.core.rows import SteerArg, as_steers
from steerlab.core.scalars import as_int, as_real, real_list
from steerlab.core.steer import Steer, at_alphas
from steerlab.core.table import Table
from steerlab.evals.intervals import check_bootstrap, mean_interval, perplexity_interval
from steerlab.evals.judge import Criterion, prompt_text
from steerlab.vectors.scoring import completion_nll, kl_divergence, next_token_logprobs

if TYPE_CHECKING:
    from steerlab.model import SteerableModel

Concept = Callable[[str], float] | Criterion
FORMATS = {"alpha": "g", "concept": ".3f", "instruction": ".3f", "fluency": ".3f",
           "judge": ".3f", "perplexity": ".3g", "kl": ".3g", "length": ".3g"}  # fmt: skip


@dataclass(frozen=True)
class SteerabilityResult:
    """Every completion of a ``steerability`` run, and its per-alpha summary.

    Attributes:
        rows: one dict per completion: ``prompt`` (its index), ``alpha``, ``text``, the
            concept metrics, ``nll`` and ``tokens`` (its summed negative log-likelihood
            under the unsteered model, and its token count), ``kl`` and ``length``.
        summary: one dict per alpha: each metric with ``_low``/``_high`` interval bounds,
            and ``n`` (completions).
        metrics: the concept metrics present: ``("concept",)`` for a scorer function;
            ``("concept", "instruction", "fluency", "judge")`` for a judge.
        headline: the metric the trade-off figure puts on its y axis.
        level: the intervals' confidence level.
        seed: the sampling seed, to repeat the run.

    >>> from steerlab.toy import concept_score
    >>> vec = sl.extract(lm, ["The day was happy"], ["The day was sad"], ["blocks.2.hook_resid_pre"])
    >>> res = steerability(lm, vec, "Once upon a time", [0, 4], concept=concept_score,
    ...                    max_new_tokens=8, temperature=0, n_boot=100, progress=False)
    >>> res.texts(4.0)
    [', there was a happy joy. The']
    """

    rows: list[dict[str, Any]]
    summary: list[dict[str, Any]]
    metrics: tuple[str, ...]
    headline: str
    level: float
    seed: int

    @property
    def alphas(self) -> list[float]:
        return [r["alpha"] for r in self.summary]

    def table(self) -> Table:
        """Per alpha: the concept metrics, perplexity, KL and length, with intervals."""
        columns = ["alpha", *self.metrics, "perplexity", "kl", "length", "n"]
        title = (f"steerability: {len(self.rows)} completions, "
                 f"{self.level:.0%} bootstrap intervals")  # fmt: skip
        return Table(title, columns, self.summary, FORMATS)

    def texts(self, alpha: float) -> list[str]:
        """The completions at ``alpha``, in prompt order."""
        if alpha not in self.alphas:
            raise KeyError(f"alpha {alpha!r} was not run; the alphas are {self.alphas}.")
        return [r["text"] for r in self.rows if r["alpha"] == alpha]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.summary)

    def __repr__(self) -> str:
        return repr(self.table())

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()


def steerability(
    lm: SteerableModel,
    steer: SteerArg,
    prompts: Prompt | Sequence[Prompt],
    alphas: Sequence[float] = (-8.0, -4.0, 0.0, 4.0, 8.0),
    *,
    concept: Concept | None = None,
    max_new_tokens: int = 40,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int | None = 0,
    samples: int = 1,
    chat: bool = False,
    level: float = 0.95,
    n_boot: int = 1000,
    progress: bool = True,
) -> SteerabilityResult:
    """Steer at each alpha, and measure the concept against the cost in fluency.

    Args:
        lm: the model.
        steer: a steering vector (its ``scale`` included), a ``Steer`` or a list of them.
            Each alpha multiplies the steer's own alpha (1 unless set), as
            ``vector.steers(alpha)`` does.
        prompts: the prompts every alpha completes.
        alphas: steering strengths; include 0 for the unsteered baseline's own row.
        concept: ``text -> float`` (any real number: a Python, numpy or 0-d torch one;
            ``nan`` for "no evidence", skipped in the mean; on the toy,
            ``steerlab.toy.concept_score``), or ``judge.concept("...")``, an LLM judge's 0-2
            ratings of concept, instruction-following and fluency with their harmonic mean
            as the headline. None measures fluency and KL only. A scorer function is first
            called once on the first prompt's text, before anything is generated: an
            answer that is not a number (None, a string, a bool, a list, an infinity) is
            refused then, not after the run. Its answers on the completions are checked
            the same way (a scorer that fails only on some texts fails at the first such
            completion, right after generation). A judge is not probed: each rating is a
            request, and its replies are checked as they come.
        max_new_tokens: completion length.
        temperature: 1 samples the model's own distribution (the default: an evaluation
            of what the steered model says, not of its single most likely text); 0 is
            greedy.
        top_p: nucleus sampling.
        seed: sampling and bootstrap seed; rows of one prompt share random numbers, so
            alphas differ by the steer, not by chance. None draws one (``result.seed``).
        samples: completions per prompt and alpha.
        chat: apply the chat template to the prompts.
        level: confidence level of the intervals.
        n_boot: bootstrap resamples per interval.
        progress: show progress bars on long work (a judge's ratings).

    >>> from steerlab.toy import concept_score
    >>> vec = sl.extract(lm, ["The day was happy"], ["The day was sad"], ["blocks.2.hook_resid_pre"])
    >>> res = steerability(lm, vec, "Once upon a time", [0, 4], concept=concept_score,
    ...                    max_new_tokens=8, temperature=0, n_boot=100, progress=False)
    >>> [(r["alpha"], r["concept"]) for r in res]
    [(0.0, nan), (4.0, 1.0)]
    """
    prompts = normalise(prompts)
    alphas = _alphas(alphas)
    base = _steers(steer)
    scorer = _scorer(concept)
    if as_int(samples) is None or samples < 1:
        raise ValueError(f"samples must be an int >= 1; got {samples!r}.")
    samples = int(samples)
    check_bootstrap(level, n_boot)
    if isinstance(scorer, _FunctionScorer):
        scorer.check(prompt_text(prompts[0]))  # its answer's type, before any compute

    rows_in = [p for p in prompts for _ in range(samples)]  # repeats get streams of their own
    gen = lm.generate(rows_in, at_alphas(base, alphas), max_new_tokens=max_new_tokens,
                      temperature=temperature, top_p=top_p, seed=seed, chat=chat)  # fmt: skip
    k = len(alphas)
    metrics = scorer.score([prompt_text(rows_in[r // k]) for r in range(len(gen.text))],
                           gen.text, progress=progress)  # fmt: skip
    nll = completion_nll(lm, gen.prompt_tokens, gen.tokens)
    logprobs = next_token_logprobs(lm, prompts, at_alphas(base, [0.0, *alphas]), chat=chat)
    logprobs = logprobs.unflatten(0, (len(prompts), k + 1))  # [prompts, 1 + alphas, vocab]
    kl = kl_divergence(logprobs[:, 1:], logprobs[:, :1]).tolist()  # [prompts][alphas]

    # gen's rows are prompt-major: row = (prompt * samples + sample) * k + alpha
    rows: list[dict[str, Any]] = []
    for r, text in enumerate(gen.text):
        p, j = r // (samples * k), r % k
        rows.append({"prompt": p, "alpha": alphas[j], "text": text, "nll": nll[r][0],
                     "tokens": nll[r][1], "kl": kl[p][j], "length": len(gen.tokens[r])})  # fmt: skip
    for row, scores in zip(rows, metrics):
        row.update(scores)
    names = scorer.metrics
    boot: dict[str, Any] = dict(level=level, n_boot=n_boot, seed=gen.seed)
    summary = []
    for alpha in alphas:
        cell = [r for r in rows if r["alpha"] == alpha]
        record: dict[str, Any] = {"alpha": alpha}
        for name in (*names, "kl", "length"):
            _put(record, name, mean_interval([float(r[name]) for r in cell], **boot))
        _put(record, "perplexity",
             perplexity_interval([(r["nll"], r["tokens"]) for r in cell], **boot))  # fmt: skip
        record["n"] = len(cell)
        summary.append(record)
    return SteerabilityResult(rows, summary, names, scorer.headline, level, gen.seed)


def _put(record: dict[str, Any], name: str, estimate: Any) -> None:
    record[name], record[f"{name}_low"], record[f"{name}_high"] = (
        estimate.value, estimate.low, estimate.high)  # fmt: skip


def _alphas(alphas: Sequence[float]) -> list[float]:
    """A list, tuple, numpy array or tensor of finite numbers (``core.scalars.real_list``),
    each once."""
    out = real_list(alphas, "alphas")
    if len(set(out)) != len(out):
        raise SteerError(f"alphas repeat a value: {out}; use samples= for more completions.",
                         "alphas")  # fmt: skip
    return out


def _steers(steer: SteerArg) -> list[Steer]:
    steers = as_steers(steer)  # a SteeringVector: every site, at its scale
    if not steers:
        raise SteerError("steerability needs a steer: a steering vector or a Steer.")
    at_alphas(steers, [1.0])  # refuses a steer that carries a list of alphas, before compute
    return steers


@dataclass(frozen=True)
class _FunctionScorer:
    fn: Callable[[str], float]
    metrics: tuple[str, ...] = ("concept",)
    headline: str = "concept"

    def score(self, prompts: list[str], texts: list[str], *, progress: bool) -> list[dict]:
        return [{"concept": self.check(text)} for text in texts]

    def check(self, text: str) -> float:
        """The scorer's answer for ``text`` as a float (``nan`` kept); anything else refused.

        Raises:
            TypeError: the answer is not a real number, or is infinite (named).
        """
        value = self.fn(text)
        number = as_real(value, nan=True)
        if number is None:
            raise TypeError(
                f"concept must return a finite real number, or nan for no evidence; it returned "
                f"{type(value).__name__} {value!r:.60} for {text!r:.60}."
            )
        return number


@dataclass(frozen=True)
class _NoScorer:
    metrics: tuple[str, ...] = ()
    headline: str = "kl"

    def score(self, prompts: list[str], texts: list[str], *, progress: bool) -> list[dict]:
        return [{} for _ in texts]


def _scorer(concept: Concept | None) -> Any:
    if concept is None:
        return _NoScorer()
    if isinstance(concept, Criterion):
        return concept
    if callable(concept):
        return _FunctionScorer(concept)
    raise TypeError(f"concept must be a function text -> float or judge.concept(...); got "
                    f"{type(concept).__name__}.")  # fmt: skip
