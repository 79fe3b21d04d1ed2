"""``ChatPanel``: one conversation, baseline and steered replies side by side.

Each side is its own ``ChatSession`` and continues its own conversation: the steered
side's history holds the steered replies, the baseline's the unsteered ones, and both get
the same user messages and sampling settings.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets

from steerlab.chat import ChatSession
from steerlab.core.rows import SteerArg
from steerlab.model import SteerableModel


class ChatPanel:
    """Chat with a model steered and unsteered at once; replies stream into two panes.

    Args:
        lm: the model.
        steer: the steered side's steers (``chat.steer`` rules: one alpha each).
        system: the system prompt of both sessions.
        max_new_tokens, temperature, seed: sampling for every turn (same on both sides).
        overflow: what a turn past the context window does (see ``lm.chat``).

    >>> vec = sl.extract(lm, ["The day was happy"], ["The day was sad"], ["blocks.2.hook_resid_pre"])
    >>> panel = sl.ChatPanel(lm, vec.steers(alpha=4.0), max_new_tokens=8)
    >>> panel.send("Tell me a story.")
    >>> [side.history[-1]["content"] for side in (panel.baseline, panel.steered)]
    ['Once upon a time, there was a', ' joy. joy joy joy joy joy joy']
    >>> panel.close()
    """

    def __init__(self, lm: SteerableModel, steer: SteerArg, system: str | None = None, *,
                 max_new_tokens: int = 40, temperature: float = 0.0, seed: int = 0,
                 overflow: str = "drop_oldest") -> None:  # fmt: skip
        self.lm = lm
        self.baseline = lm.chat(system, overflow=overflow)
        self.steered = lm.chat(system, steer, overflow=overflow)
        self.max_new_tokens, self.temperature, self.seed = max_new_tokens, temperature, seed
        self.error: str | None = None
        self._build_view()
        self._render()

    @property
    def steer(self) -> list:
        return self.steered.steer

    @steer.setter
    def steer(self, steer: SteerArg) -> None:
        """New steers for the steered side, from its next turn on."""
        self.steered.steer = steer
        self._render()

    def send(self, message: str | None = None) -> None:
        """Send ``message`` (the text box's content when None) to both sides."""
        text = self.input.value if message is None else message
        if not text.strip():
            return
        self.input.value = ""
        self.error = None
        try:
            for session, pane in ((self.baseline, self.baseline_pane),
                                  (self.steered, self.steered_pane)):  # fmt: skip
                steps = session.stream(text, max_new_tokens=self.max_new_tokens,
                                       temperature=self.temperature, seed=self.seed)  # fmt: skip
                for step in steps:
                    pane.value = _transcript(session, user=text, partial=step.text[0])
        except Exception as error:  # show it, keep the panel alive
            self.error = f"{type(error).__name__}: {error}"
        self._render()

    def undo(self) -> None:
        """Drop the last exchange on both sides."""
        for session in (self.baseline, self.steered):
            if session.history and session.history[-1]["role"] == "assistant":
                session.undo()
        self._render()

    def close(self) -> None:
        self.baseline.close()
        self.steered.close()
        self.widget.close()

    def _build_view(self) -> None:
        self.input = widgets.Text(placeholder="Your message", layout=widgets.Layout(width="70%"))
        self.send_button = widgets.Button(description="Send", button_style="primary")
        self.undo_button = widgets.Button(description="Undo")
        self.send_button.on_click(lambda _: self.send())
        self.undo_button.on_click(lambda _: self.undo())
        self.input.on_submit(lambda _: self.send())
        self.baseline_pane, self.steered_pane = widgets.HTML(), widgets.HTML()
        self.steer_label, self.stats_label = widgets.HTML(), widgets.HTML()
        self.error_box = widgets.HTML()
        half = widgets.Layout(width="50%")
        columns = widgets.HBox([
            widgets.VBox([widgets.HTML("<b>baseline</b>"), self.baseline_pane], layout=half),
            widgets.VBox([self.steer_label, self.steered_pane], layout=half),
        ])  # fmt: skip
        controls = widgets.HBox([self.input, self.send_button, self.undo_button])
        self.widget = widgets.VBox([columns, controls, self.error_box, self.stats_label])

    def _render(self) -> None:
        self.baseline_pane.value = _transcript(self.baseline)
        self.steered_pane.value = _transcript(self.steered)
        steers = ", ".join(f"{s.site} α={s.alpha[0]:g} ({s.positions})" for s in self.steer)
        self.steer_label.value = f"<b>steered</b> · {html.escape(steers or 'no steer')}"
        self.error_box.value = f"<pre>{html.escape(self.error)}</pre>" if self.error else ""
        self.stats_label.value = (
            f"<small>cache: baseline {self.baseline.cache_length} tokens, steered "
            f"{self.steered.cache_length} · steerlab hooks on model: {self.lm.hook_count()}</small>"
        )

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        return self.widget._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        return f"ChatPanel({self.steered!r})"


def _transcript(session: ChatSession, user: str | None = None, partial: str | None = None) -> str:
    """The conversation as HTML, with a turn in progress when ``partial`` is given."""
    messages = [m for m in session.history if m["role"] != "system"]
    if partial is not None:
        messages += [{"role": "user", "content": user or ""},
                     {"role": "assistant", "content": partial + " …"}]  # fmt: skip
    rows = "".join(
        f"<div style='margin:2px 0'><b>{html.escape(m['role'])}</b>: "
        f"{html.escape(m['content'])}</div>"
        for m in messages
    )
    return f"<div class='steerlab-chat'>{rows}</div>"
