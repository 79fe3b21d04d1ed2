"""Token scores: the log-probabilities an engine reports beside the tokens it samples.

One definition for every caller (``score_continuations`` is lm-eval's loglikelihood). The decode loop scores a request's prompt from the logits
of its prefill, and each sampled token from the logits it was sampled from, so a score is
read from the same forward pass as the token (steered when the row is), before temperature,
top-k or top-p. ``score_prompts`` and ``next_token_distributions`` are the in-process
entries: they run through ``engine.run``, so they take the engine's call guard and work on
every engine (vLLM's included, which reports no logits).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from steerlab.core.request import Request, Sampling, TokenScore
from steerlab.core.sampling import check_finite
from steerlab.core.steer import Steer

# A logit bias that makes greedy decoding pick its token: the largest a request may carry.
FORCE = 100.0
BATCH = 16  # rows per forward when scoring windows that fill the model's context
CHUNK = 1024  # positions read at a time: a [CHUNK, vocab] log-softmax, not one [rows, seq, vocab]

if TYPE_CHECKING:
    from steerlab.engine.protocol import Engine

# ``Sampling.logprobs`` past the vocabulary's size lists every token.
EVERY_TOKEN = 2**62


def token_scores(
    logprobs: torch.Tensor,  # [n, vocab], log-softmaxed
    targets: torch.Tensor,  # [n] token ids
    top: int,
) -> list[TokenScore]:
    """Each target's log-probability, with the ``top`` most likely tokens at its position.

    >>> token_scores(torch.tensor([[0.0, -1.0]]), torch.tensor([1]), 1)
    [TokenScore(token=1, logprob=-1.0, top=((0, 0.0),))]
    """
    targets = targets.to(logprobs.device)
    chosen = logprobs.gather(-1, targets[:, None])[:, 0].tolist()
    tops: list[tuple[tuple[int, float], ...]] = [()] * len(chosen)
    if top > 0:
        values, ids = logprobs.topk(min(top, logprobs.shape[-1]), dim=-1)
        tops = [tuple(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
    return [TokenScore(t, lp, k) for t, lp, k in zip(targets.tolist(), chosen, tops)]


def prompt_scores(
    logits: torch.Tensor,  # [batch, seq, vocab] for every column fed, prompts left-padded
    tokens: torch.Tensor,  # [batch, seq]
    lengths: Sequence[int],
    tops: Sequence[int | None],
) -> list[list[TokenScore | None]]:
    """Per row, a score for each of its last ``lengths[i]`` tokens (None for the first, which
    nothing before it predicts); an empty list for rows whose ``tops[i]`` is None."""
    seq = logits.shape[1]
    out: list[list[TokenScore | None]] = []
    for i, (n, top) in enumerate(zip(lengths, tops)):
        if top is None:
            out.append([])
            continue
        logprobs = logits[i, seq - n : seq - 1].float().log_softmax(-1)  # predicts the next
        out.append([None, *token_scores(logprobs, tokens[i, seq - n + 1 :], top)])
    return out


def score_prompts(
    engine: Engine,
    prompts: Sequence[Sequence[int]],
    *,
    top: int = 0,
    steers: Sequence[Steer] = (),
    wait: float = 0.0,
) -> list[list[TokenScore | None]]:
    """Score each prompt's tokens under the model (steered by ``steers``); nothing is sampled.

    >>> ids = lm.tokenizer.encode("Once upon a time")
    >>> [scores] = score_prompts(lm.engine, [ids])
    >>> scores[0], round(scores[1].logprob, 2)  # nothing predicts the first token
    (None, -0.87)
    """
    sampling = Sampling(max_new_tokens=0, prompt_logprobs=top)
    requests = [Request(tuple(p), tuple(steers), sampling, stream=str(i))
                for i, p in enumerate(prompts)]  # fmt: skip
    return [c.prompt_scores for c in engine.run(requests, wait=wait)]


def score_continuations(
    engine: Engine,
    pairs: Sequence[tuple[Sequence[int], int]],
    *,
    window: int,
    steers: Sequence[Steer] = (),
    shared: bool = True,
    wait: float = 0.0,
) -> list[tuple[float, bool]]:
    """Per ``(tokens, n)``: the log-probability of the last ``n`` tokens given those before
    them, summed, and whether each was the most likely token: lm-eval's loglikelihood.

    Cut as lm-eval's ``hf`` model cuts at ``max_length=window``: a sequence keeps its last
    ``window + 1`` tokens and the first ``window`` of them are fed, so the last token is
    scored from the logits after the last one fed. Two ways to read the same numbers:

    - ``shared`` (sequences that share their starts, as a multiple-choice context and its
      choices): a row feeds its tokens but the last, scored from the prefill with each shared
      start fed once (``local/scored.py``), and the last as a one-token greedy decode forced
      to it by a logit bias (reported log-probabilities are the model's own, before the bias;
      a token the bias could not force, another being more than 100 nats likelier, is
      refused, never misreported);
    - otherwise (lm-eval's rolling windows share nothing), and for a row that fills the
      model's context: ``BATCH`` rows a forward without a KV cache, read as ``hf`` reads its
      logits (a log-softmax, a gather, an argmax), with the head multiplied only at the
      positions that predict a scored token (no padding).

    >>> ids = lm.tokenizer.encode("Once upon a time")
    >>> [(logprob, greedy)] = score_continuations(lm.engine, [(ids, 3)], window=lm.n_ctx)
    >>> [scores] = score_prompts(lm.engine, [ids])  # the same tokens, scored in the prompt
    >>> abs(logprob - sum(s.logprob for s in scores[-3:])) < 1e-5, greedy
    (True, True)
    """
    if window < 1:
        raise ValueError(f"window must be at least 1 token; got {window}.")
    cuts = []
    for i, (tokens, n) in enumerate(pairs):
        cut = tuple(tokens)[-(window + 1) :]
        if not 1 <= n < len(cut):
            raise ValueError(f"pair {i}: {n} scored tokens of {len(tokens)} (at most "
                             f"{len(cut) - 1}: the first token has nothing to predict it).")  # fmt: skip
        cuts.append(cut)
    ns = [n for _, n in pairs]
    forward = engine.capabilities.forward
    decoded = [i for i, cut in enumerate(cuts) if (shared or not forward)
               and (engine.n_ctx is None or len(cut) <= engine.n_ctx)]  # fmt: skip
    if len(decoded) < len(cuts) and not forward:
        raise ValueError(f"window={window} fills this model's context ({engine.n_ctx} tokens), "
                         "which this engine can only score with a window below it.")  # fmt: skip
    out: dict[int, tuple[float, bool]] = {}
    if decoded:
        out.update(zip(decoded, _decoded(engine, [cuts[i] for i in decoded],
                                         [ns[i] for i in decoded], steers, wait)))  # fmt: skip
    rest = [i for i in range(len(cuts)) if i not in out]
    for start in range(0, len(rest), BATCH):
        rows = rest[start : start + BATCH]
        out.update(zip(rows, _forwarded(engine, [cuts[i] for i in rows], [ns[i] for i in rows],
                                        steers, wait)))  # fmt: skip
    return [out[i] for i in range(len(cuts))]


def _decoded(engine: Engine, cuts: Sequence[tuple[int, ...]], ns: Sequence[int],
             steers: Sequence[Steer], wait: float) -> list[tuple[float, bool]]:  # fmt: skip
    """Through ``engine.run``: the prefill's prompt scores, then the forced last token."""
    requests = [Request(cut[:-1], tuple(steers), Sampling(
        max_new_tokens=1, stop_at_eos=False, logprobs=1, prompt_logprobs=1,
        logit_bias=((cut[-1], FORCE),)), stream=str(i)) for i, cut in enumerate(cuts)]  # fmt: skip
    out = []
    for i, (cut, n, done) in enumerate(zip(cuts, ns, engine.run(requests, wait=wait))):
        last = done.scores[0] if done.scores else None
        if last is None or last.token != cut[-1]:
            raise RuntimeError(f"row {i}: its last token is more than {FORCE:g} nats less "
                               "likely than the likeliest; it cannot be scored this way.")  # fmt: skip
        scored = [s for s in done.prompt_scores[len(done.prompt_scores) - n + 1 :] if s]
        scored = [*scored, last][-n:]
        out.append((float(sum(s.logprob for s in scored)),
                    all(s.top and s.top[0][0] == s.token for s in scored)))  # fmt: skip
    return out


def _forwarded(engine: Engine, cuts: Sequence[tuple[int, ...]], ns: Sequence[int],
               steers: Sequence[Steer], wait: float) -> list[tuple[float, bool]]:  # fmt: skip
    """One forward of the rows' tokens but the last (left-padded), read as ``hf`` reads it:
    a log-softmax, a gather and an argmax, over only the positions that predict a scored
    token (the head skips the rest, padding included), ``CHUNK`` positions at a time."""
    fed = [Request(cut[:-1], tuple(steers), stream=str(i)) for i, cut in enumerate(cuts)]
    logits = engine.forward(fed, last=ns, wait=wait)[0]  # [sum(ns), vocab], row by row
    targets = torch.tensor([t for cut, n in zip(cuts, ns) for t in cut[-n:]],
                           device=logits.device)  # fmt: skip
    chosen = torch.empty(len(targets), device=logits.device)
    greedy = torch.empty(len(targets), dtype=torch.bool, device=logits.device)
    for start in range(0, len(targets), CHUNK):
        part = slice(start, start + CHUNK)
        logprobs = logits[part].float().log_softmax(-1)
        chosen[part] = logprobs.gather(-1, targets[part, None])[:, 0]
        greedy[part] = logprobs.argmax(-1) == targets[part]
    rows = torch.repeat_interleave(torch.arange(len(ns), device=logits.device),
                                   torch.tensor(list(ns), device=logits.device))  # fmt: skip
    sums = torch.zeros(len(ns), device=logits.device).index_add_(0, rows, chosen)
    check_finite(sums[:, None], 0, fed)  # a NaN or inf anywhere in a row reaches its sum
    missed = torch.zeros(len(ns), device=logits.device).index_add_(0, rows, (~greedy).float())
    return list(zip(sums.tolist(), (missed == 0).tolist()))


def next_token_distributions(
    engine: Engine, requests: Sequence[Request], *, wait: float = 0.0
) -> torch.Tensor:  # [rows, vocab]
    """Each request's log-probabilities over its first new token (steered as it is).

    An engine with full logits runs one forward; another (vLLM) one decode step with every
    token listed in the score of the token it samples: the distribution of the prefill's
    last position, as the engine samples from it.

    >>> ids = tuple(lm.tokenizer.encode("Once upon a time"))
    >>> logprobs = next_token_distributions(lm.engine, [Request(ids)])
    >>> logprobs.shape, logprobs.exp().sum(-1)
    (torch.Size([1, 678]), tensor([1.0000]))
    """
    if engine.capabilities.forward:  # the logits in hand: one forward, no per-token listing
        logits = engine.forward(requests, last_only=True, wait=wait)[0]
        return logits[:, -1].float().log_softmax(-1).cpu()
    sampling = Sampling(max_new_tokens=1, stop_at_eos=False, logprobs=EVERY_TOKEN)
    done = engine.run([replace(r, sampling=sampling) for r in requests], wait=wait)
    tops = [c.scores[0].top for c in done]
    out = torch.empty(len(tops), len(tops[0]))
    for row, top in enumerate(tops):
        ids, values = zip(*top)
        out[row, list(ids)] = torch.tensor(values)
    return out
