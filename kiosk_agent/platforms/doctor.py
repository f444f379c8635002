"""The doctor's check of the triggers: each one whose platform can tell starts on this machine
as it is (a GPIO chip there, gpiod installed). ``doctor.py`` runs it; ``check-config`` warns
with the same problems (``trigger_problems``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kiosk_agent.config.load import Config
    from kiosk_agent.verdicts import Report


def trigger_problems(config: Config) -> list[tuple[int, str, str]]:
    """(index, name, problem) for each thing that keeps a valid trigger from starting here,
    as its platform says (``config.registry.environment_problems``)."""
    from kiosk_agent.config.registry import environment_problems

    return [
        (index, f"{t['platform']}:{t.get('name') or t['platform']}", problem)
        for index, t in enumerate(config.triggers)
        for problem in environment_problems(t)
    ]


def check_triggers(report: Report, config: Config) -> None:
    """Each trigger whose platform can tell: it can start on this machine as it is."""
    from kiosk_agent.verdicts import Verdict  # the doctor's: check-config's warnings need none

    problems = trigger_problems(config)
    names = {name for _, name, _ in problems}
    for name in sorted(names):
        notes = [problem for _, n, problem in problems if n == name]
        report.add(
            f"trigger {name}", Verdict.FAIL, "cannot start on this machine",
            "correct each line below; the agent starts it once restarted", notes,
        )  # fmt: skip
