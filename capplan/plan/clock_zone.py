"""The time zone a day plan's clock times are in (plan file `day.timezone`, `recommend
--timezone`): an IANA name, as Kubernetes' CronJob `spec.timeZone` takes it.

A day plan computes in seconds after 00:00 and never converts between zones: the zone says
which 00:00 that is (a rate curve's `at: "15:00"` is 15:00 there, the schedule's windows and
scale-up times are that zone's clock times, and the Kubernetes export's CronJobs run in it).
"""

from __future__ import annotations

import re

from capplan.errors import InputError, nearest

DEFAULT_ZONE = "UTC"
MACHINE_ZONES = frozenset({"local", "localtime"})
"""Names that stand for the machine's own zone (zoneinfo may list `localtime`, a link to
/etc/localtime): a plan's answer must not move with the machine, and Kubernetes refuses
`Local`."""
_NAME = re.compile(r"[A-Za-z0-9_+\-/]{1,64}")


def check_zone(name: object, what: str = "") -> str:
    """`name` when it is an IANA time zone this machine's zone database knows (UTC always),
    else an InputError naming the nearest ones."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

    if not isinstance(name, str):
        raise InputError(f"{what or 'timezone'}: give an IANA time zone name such as "
                         "Europe/Berlin")
    if name == DEFAULT_ZONE:
        return name
    shown = repr(name) if _NAME.fullmatch(name) else "(not a zone name)"
    shown = f"{what} {shown}" if what else shown
    known = available_timezones()
    if not known:
        raise InputError(f"{shown}: no time zone database on this machine "
                         "(pip install tzdata)")
    if name.lower() in MACHINE_ZONES:
        raise InputError(f"{shown}: the machine's own zone; name it (UTC, "
                         "Europe/Berlin, America/New_York...) so that the plan does not move "
                         "with the machine")
    if name in known:
        try:
            ZoneInfo(name)
            return name
        except (ZoneInfoNotFoundError, ValueError, OSError):
            pass
    near = nearest(name, sorted(known - MACHINE_ZONES), 2, cutoff=0.6) if _NAME.fullmatch(
        name) else []
    hint = f" (did you mean {' or '.join(near)}?)" if near else ""
    raise InputError(f"{shown}: unknown time zone{hint}; give an IANA name such as "
                     "UTC, Europe/Berlin or America/New_York")
