"""The panel's site and position controls, locked where the chosen steer fixes them itself."""

from __future__ import annotations

from typing import Any

from steerlab.core.reft import LoReFT
from steerlab.core.sites import Site
from steerlab.widgets.controls import POSITIONS, Controls

CLAMP_SITE_TIP = "a clamp acts at the SAE's own site"
TRAINED_SITE_TIP = "a trained LoReFT acts at the site it was trained at"
TRAINED_POSITIONS_TIP = "a trained LoReFT acts on the positions it was trained on"


class SiteLock:
    """Locks the layer, hook point and positions controls while a steer fixes them.

    A clamp reads the SAE's own encoding, so it fixes the layer and hook point at the
    SAE's site; a trained LoReFT fixes those and the positions it was trained on. The
    locked controls show the steer's own values, disabled, with a tooltip saying why;
    leaving a lock puts back what the user had chosen before it.
    """

    def __init__(self, controls: Controls) -> None:
        self.controls = controls
        # (layer, hook, positions) as the user left them when a steer locked them
        self.unlocked: tuple[int, str, Any] | None = None

    def sync(self, trained: LoReFT | None, clamp_site: str | None) -> None:
        """Lock the controls to ``trained`` (a LoReFT) or a clamp at ``clamp_site``, or
        unlock them when neither is given. The caller mutes the controls' observers."""
        controls = self.controls
        own = trained.site if trained is not None else clamp_site
        if own is not None and self.unlocked is None:
            self.unlocked = (controls.layer.value, controls.hook.value, controls.positions.value)
        if own is not None:
            site = Site.parse(own)
            if site.layer is not None:
                controls.layer.value = site.layer
            controls.hook.value = site.kind
        self._sync_positions(trained)
        if own is None and self.unlocked is not None:
            controls.layer.value, controls.hook.value, _ = self.unlocked
            self.unlocked = None
        tip = TRAINED_SITE_TIP if trained is not None else CLAMP_SITE_TIP
        for control in (controls.layer, controls.hook):
            control.disabled = own is not None
            control.tooltip = tip if own is not None else None

    def _sync_positions(self, trained: LoReFT | None) -> None:
        """A trained LoReFT's positions, as the one locked entry; else the usual choices, at
        the user's own choice from before any lock."""
        dropdown = self.controls.positions
        if trained is not None:
            dropdown.options = [(f"{trained.positions} (trained)", trained.positions)]
            dropdown.value = trained.positions
        elif dropdown.disabled:
            dropdown.options = POSITIONS
            dropdown.value = "all" if self.unlocked is None else self.unlocked[2]
        dropdown.disabled = trained is not None
        dropdown.tooltip = TRAINED_POSITIONS_TIP if trained is not None else None
