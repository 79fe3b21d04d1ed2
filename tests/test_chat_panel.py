"""The chat panel: two sessions side by side, driven through its Python state."""

from __future__ import annotations

import torch

import steerlab as sl


def test_chat_panel_runs_two_sessions_side_by_side():
    lm = sl.load("steerlab-tiny", backend="hf")
    vector = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(0))
    steer = sl.Steer("blocks.1.hook_resid_pre", 4 * vector / vector.norm(), alpha=8.0)
    panel = sl.ChatPanel(lm, steer, system="You are a storyteller.", max_new_tokens=8)
    panel.send("Tell me a story.")
    panel.input.value = "What then?"
    panel.send()  # the text box's content
    base, steered = panel.baseline.history, panel.steered.history
    assert [m["role"] for m in base] == ["system", "user", "assistant", "user", "assistant"]
    assert [m["content"] for m in base if m["role"] == "user"] == ["Tell me a story.", "What then?"]
    assert base[2]["content"] != steered[2]["content"]  # each side continues its own replies
    assert base[2]["content"] in panel.baseline_pane.value
    ref = lm.generate(steered[:-1], steer, chat=True, max_new_tokens=8)
    assert ref.text[0] == steered[-1]["content"]
    assert panel.input.value == "" and panel.error is None and lm.hook_count() == 0
    panel.undo()
    assert len(panel.baseline.history) == len(panel.steered.history) == 3
    panel.steer = None
    panel.send("Again?")
    unsteered = lm.generate(panel.steered.history[:-1], chat=True, max_new_tokens=8)
    assert unsteered.text[0] == panel.steered.history[-1]["content"]  # the new steer (none)
    panel.close()
    panel.send("closed")  # the error shows in the panel instead of raising
    assert panel.error is not None and "closed" in panel.error
