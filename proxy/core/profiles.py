"""Which profile a task runs under, chosen on its first call and remembered for its later ones.

A bounded LRU of task id -> Selection, so a task's later calls skip the selection rules (and the
classifier); a task's choice is dropped when the task ends. Pure: no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping

from ..config import BudgetsConfig
from .budget import BAGGAGE_PROFILE, Selection, first_query, select_profile

MAX_REMEMBERED = 100_000


class Profiles:
    def __init__(self, cfg: BudgetsConfig, classify: Callable[[str], tuple[str, str]] | None) -> None:
        self.cfg = cfg
        self._classify = classify if cfg.classes else None
        self._chosen: OrderedDict[str, Selection] = OrderedDict()

    def choose(self, task_id: str, route: str, headers: Mapping[str, str], baggage: Mapping[str, str],
               prompt_texts: list[str], query: str | None, user_text: str | None) -> Selection:
        """The task's profile: the one chosen for it before, unless baggage now names another one
        (which the store checks against the task's recorded profile)."""
        sel = self._chosen.get(task_id)
        if sel is None or (baggage.get(BAGGAGE_PROFILE) not in (None, sel.profile) and sel.source != "task"):
            sel = select_profile(self.cfg, route, headers, baggage, first_query(prompt_texts, query, user_text),
                                 self._classify)
            self.remember(task_id, sel)
        else:
            self._chosen.move_to_end(task_id)
        return sel

    def remember(self, task_id: str, sel: Selection) -> None:
        self._chosen[task_id] = sel
        while len(self._chosen) > MAX_REMEMBERED:
            self._chosen.popitem(last=False)

    def forget(self, task_id: str) -> None:
        self._chosen.pop(task_id, None)
