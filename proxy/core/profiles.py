"""Which profile a task runs under, chosen on its first call and remembered for its later ones.

A bounded LRU of task id -> Selection, so a task's later calls skip the selection rules (and the
classifier); a task's choice is dropped when the task ends. Baggage may name a profile by trust:
unsigned, only one no more generous than the task would otherwise get. Pure: no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping

from ..config import BudgetsConfig, Profile
from .budget import BAGGAGE_PROFILE, Selection, first_query, select_profile

MAX_REMEMBERED = 100_000

# (baggage, task id) -> the signature covers the baggage's profile member (signing.signed_profile)
ProfileSigned = Callable[[Mapping[str, str], str], bool]


class Profiles:
    def __init__(self, cfg: BudgetsConfig, classify: Callable[[str], tuple[str, str]] | None,
                 signed: ProfileSigned | None = None) -> None:
        self.cfg = cfg
        self._classify = classify if cfg.classes else None
        self._signed = signed or (lambda baggage, task_id: False)
        # task id -> (its selection, the baggage profile refused for it, if any: not re-tried per call)
        self._chosen: OrderedDict[str, tuple[Selection, str | None]] = OrderedDict()

    def choose(self, task_id: str, route: str, headers: Mapping[str, str], baggage: Mapping[str, str],
               prompt_texts: list[str], query: str | None, user_text: str | None) -> Selection:
        """The task's profile: the one chosen for it before, unless baggage now names another one
        (which the store checks against the task's recorded profile)."""
        sel, refused = self._chosen.get(task_id) or (None, None)
        asked = baggage.get(BAGGAGE_PROFILE)
        if sel is None or (asked not in (None, sel.profile, refused) and sel.source != "task"):
            sel = self._select(task_id, route, headers, baggage, first_query(prompt_texts, query, user_text))
            self._remember(task_id, sel, asked if asked is not None and sel.profile != asked else None)
        else:
            self._chosen.move_to_end(task_id)
        return sel

    def _select(self, task_id: str, route: str, headers: Mapping[str, str], baggage: Mapping[str, str],
                query: str | None) -> Selection:
        """`select_profile`, with a baggage choice kept only when signed or no more generous than
        the profile the rules, classifier or default would give (the refusal is a note)."""
        sel = select_profile(self.cfg, route, headers, baggage, query, self._classify)
        if sel.source != "baggage":
            return sel
        if self._signed(baggage, task_id):
            return sel
        unasked = {k: v for k, v in baggage.items() if k != BAGGAGE_PROFILE}
        otherwise = select_profile(self.cfg, route, headers, unasked, query, self._classify)
        looser = more_generous(self.cfg.profiles[sel.profile], self.cfg.profiles[otherwise.profile],
                               self.cfg.mode)
        if not looser:
            return sel
        note = (f"baggage {BAGGAGE_PROFILE}={sel.profile!r} ignored: more generous than {otherwise.profile!r} "
                f"({', '.join(looser)}); only a signed profile may raise limits (ragtoll sign-budget --profile)")
        return Selection(otherwise.profile, otherwise.source, otherwise.cls, otherwise.reason,
                         (*sel.notes, *otherwise.notes, note))

    def remember(self, task_id: str, sel: Selection) -> None:
        self._remember(task_id, sel, None)

    def _remember(self, task_id: str, sel: Selection, refused: str | None) -> None:
        self._chosen[task_id] = (sel, refused)
        while len(self._chosen) > MAX_REMEMBERED:
            self._chosen.popitem(last=False)

    def forget(self, task_id: str) -> None:
        self._chosen.pop(task_id, None)


def more_generous(asked: Profile, base: Profile, default_mode: str) -> list[str]:
    """What `asked` allows beyond `base`: each limit it lacks or sets higher (a missing limit is
    unlimited), and `mode` when it only shadows where `base` enforces. Empty: no more generous."""
    mine = asked.limits()
    looser = [dim for dim, limit in base.limits().items() if mine.get(dim, float("inf")) > limit]
    if (asked.mode or default_mode) == "shadow" and (base.mode or default_mode) == "enforce":
        looser.append("mode")
    return looser
