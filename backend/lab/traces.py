"""Recorded request traces: the Azure LLM inference trace 2023, and CSV traces of one's own.

A trace file is CSV with a header naming the columns TIMESTAMP, ContextTokens and
GeneratedTokens (in any order) and one row per request:

    TIMESTAMP        the arrival: a date and time, 2023-11-16 18:17:03.9799600
                     (a space or T between them, up to 9 decimals of a second,
                     an optional time zone, Z or +05:00, which is applied), or
                     a number of seconds in plain digits (1.5, no sign or
                     exponent); every row the same kind, in arrival order
                     (equal times are fine)
    ContextTokens    the prompt's length in tokens, an integer >= 1
    GeneratedTokens  the output's length in tokens, an integer >= 1

The whole file is checked before anything is replayed: the first bad row is
refused with its number (data rows count from 1; the header is line 1, so row
r is line r + 1) and nothing is half-loaded. Arrivals are replayed relative to
the first row's time, lengths as recorded.

`azure-code` and `azure-conv` are the two files of the Azure LLM inference
trace 2023 in assets/traces/ (CC BY 4.0; credit and license beside them).
`replay_trace` takes a prefix of a trace and rescales its time, as
`python -m backend simulate` does with --requests, --rate and --time-scale.
"""

from __future__ import annotations

import codecs
import csv
import datetime
import functools
import io
import json
import math
import re
from pathlib import Path

import numpy as np

from backend.core.checks import check_int, file_kind, shown
from backend.core.errors import PagedLabError
from backend.lab.sim.simulator import DEFAULT_RATE
from backend.lab.workloads import WORKLOADS, Trace, make_trace

TRACE_DIR = Path(__file__).resolve().parents[2] / "assets" / "traces"
RECORDED: dict[str, str] = {
    "azure-code": "AzureLLMInferenceTrace_code.csv",
    "azure-conv": "AzureLLMInferenceTrace_conv.csv",
}
COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
# A trace file is read whole: 64 MiB is some 1.7 million rows of the Azure format.
MAX_TRACE_BYTES = 64 << 20
MAX_TOKENS = 1 << 24       # per request, prompt or output (the simulator's largest capacity)
MAX_SECONDS = 1e12         # a numeric TIMESTAMP (about 31,700 years)
MAX_TIME_SCALE = 1e6
DEFAULT_REQUESTS = 1000    # synthetic traces
WORKLOAD_NAMES: tuple[str, ...] = (*WORKLOADS, *RECORDED)
# ASCII digits: \d also takes other scripts' digits, which int() reads as numbers.
_DATETIME = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[ T]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?"
    r"(Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])?")
_INT = re.compile(r"[0-9]{1,9}")


def _row_error(name: str, row: int, line: int, message: str) -> PagedLabError:
    return PagedLabError(f"{name}: row {row} (line {line}): {message}")


def _nanoseconds(text: str) -> int | None:
    """A date and time as integer nanoseconds since 0001-01-01, or None if it is not one."""
    found = _DATETIME.fullmatch(text)
    if found is None:
        return None
    y, mo, d, h, mi, s, frac, zone = found.groups()
    try:
        day = datetime.date(int(y), int(mo), int(d)).toordinal()
        datetime.time(int(h), int(mi), int(s))
    except ValueError:
        return None
    seconds = ((day * 24 + int(h)) * 60 + int(mi)) * 60 + int(s)
    if zone and zone != "Z":
        # 18:00+02:00 is 16:00 UTC.
        sign = 1 if zone[0] == "+" else -1
        seconds -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return seconds * 1_000_000_000 + int((frac or "").ljust(9, "0"))


def _seconds(text: str) -> float | None:
    """A plain number of seconds (finite, >= 0), or None. Raises PagedLabError (without
    the row, which the caller adds) for a number written otherwise or too large."""
    if not re.fullmatch(r"[0-9]+(\.[0-9]*)?|\.[0-9]+", text):
        try:
            float(text)
        except ValueError:
            return None
        raise PagedLabError(f"TIMESTAMP {shown(text)}: a number of seconds is written in plain "
                            "digits, such as 1.5 (no sign, exponent or separators)")
    value = float(text)
    if value > MAX_SECONDS:
        raise PagedLabError(f"TIMESTAMP {shown(text)} is past the largest number of seconds, "
                            f"{MAX_SECONDS:,.0f} (about 31,700 years)")
    return value


def _tokens(text: str) -> int | None:
    """A token count in 1..MAX_TOKENS, or None."""
    if _INT.fullmatch(text) is None or not 1 <= int(text) <= MAX_TOKENS:
        return None
    return int(text)


def _csv_words(error: csv.Error) -> str:
    """What the csv module's error means for a trace: its own words, except where they
    name the reader's limit rather than the file ("field larger than field limit
    (131072)")."""
    said = str(error)
    if said.startswith("field larger than field limit"):
        return (f"a field is longer than {csv.field_size_limit():,} characters, where a "
                "trace's fields are a few dozen; it may not be a trace")
    return said


def _refuse_json(text: str, name: str) -> None:
    """Raises, saying what the file is, where `text` is one of PagedLab's JSON files (or
    other JSON) rather than a trace: the header check would call its '{' a column."""
    if not text.lstrip().startswith(("{", "[")):
        return
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        return   # not JSON after all (or nested past the parser): the header check speaks
    kind = {"snapshot": "a PagedLab snapshot", "scenario": "a PagedLab scenario"}.get(
        file_kind(raw) or "", "a JSON file")
    raise PagedLabError(f"{name}: this is {kind}, not a CSV trace; a trace's first line is "
                        f"the header {','.join(COLUMNS)}")


def parse_trace_csv(data: bytes, name: str) -> Trace:
    """Reads only: the trace in `data` (a CSV file's bytes); `name` names it in messages and
    becomes the trace's workload. Raises PagedLabError naming the first bad row."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        # The byte and where, as for a JSON file: "byte 40" read as the byte's value.
        # Offsets count from after a byte-order mark, which the codec strips first.
        offset = e.start + (len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0)
        raise PagedLabError(
            f"{name}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {offset:,}); it "
            "may be a binary file, or text in another encoding (a spreadsheet's \"Unicode "
            "text\" is UTF-16): save it as CSV in UTF-8") from None
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, None)
        if header is None:
            raise PagedLabError(f"{name}: the file is empty; the first line must be the "
                                f"header {','.join(COLUMNS)}")
        names = [h.strip() for h in header]
        if sorted(names) != sorted(COLUMNS):
            _refuse_json(text, name)
            # Said by what differs: a header cut at 40 characters hid an extra column
            # ("got 'TIMESTAMP,ContextTokens,GeneratedTokens,…'").
            extra = list(dict.fromkeys(n for n in names if n not in COLUMNS))
            missing = [c for c in COLUMNS if c not in names]
            twice = sorted({n for n in names if n in COLUMNS and names.count(n) > 1})
            what = "; ".join(part for part in (
                f"missing {', '.join(missing)}" if missing else "",
                f"not a column of the trace: {', '.join(shown(n) for n in extra[:3])}"
                + (f" and {len(extra) - 3:,} more" if len(extra) > 3 else "") if extra else "",
                f"named twice: {', '.join(twice)}" if twice else "") if part)
            raise PagedLabError(f"{name}: the header must name the columns "
                                f"{', '.join(COLUMNS)} ({what})")
        at = [names.index(c) for c in COLUMNS]
        times: list[int | float] = []   # nanoseconds (dates) or seconds
        prompts: list[int] = []
        outputs: list[int] = []
        dated: bool | None = None
        row = 0
        for fields in reader:
            line = reader.line_num
            if not fields or fields == [""]:
                continue   # a blank line holds no request
            row += 1

            def fail(message: str, row: int = row, line: int = line) -> PagedLabError:
                return _row_error(name, row, line, message)

            if len(fields) != 3:
                raise fail(f"expected 3 fields ({','.join(names)}), got {len(fields)}")
            stamp, ctx, gen = (fields[i].strip() for i in at)
            ns = _nanoseconds(stamp)
            try:
                sec = None if ns is not None else _seconds(stamp)
            except PagedLabError as exc:
                raise fail(str(exc)) from None
            if ns is None and sec is None:
                raise fail(f"TIMESTAMP must be a date and time (2023-11-16 18:17:03.97) or "
                           f"a number of seconds, got {shown(stamp)}")
            if dated is None:
                dated = ns is not None
            elif dated != (ns is not None):
                kind = "a date and time" if dated else "a number of seconds"
                raise fail(f"TIMESTAMP {shown(stamp)} is not {kind} like row 1's")
            value = ns if ns is not None else sec
            assert value is not None
            if times and value < times[-1]:
                raise fail(f"TIMESTAMP {shown(stamp)} is earlier than the row before it; "
                           "the rows must be in arrival order")
            for what, raw, into in (("ContextTokens", ctx, prompts),
                                     ("GeneratedTokens", gen, outputs)):
                count = _tokens(raw)
                if count is None:
                    raise fail(f"{what} must be an integer in 1..{MAX_TOKENS:,}, got {shown(raw)}")
                into.append(count)
            times.append(value)
    except csv.Error as e:
        raise PagedLabError(f"{name}: line {reader.line_num}: not valid CSV ({_csv_words(e)})"
                            ) from None
    if not times:
        raise PagedLabError(f"{name}: the trace holds no request (only a header)")
    if dated:
        first = times[0]
        arrival = np.array([(t - first) / 1e9 for t in times], dtype=np.float64)
    else:
        arrival = np.asarray(times, dtype=np.float64) - float(times[0])
    return _frozen(Trace(name, mean_rate(arrival), 0, arrival,
                         np.asarray(prompts, dtype=np.int64),
                         np.asarray(outputs, dtype=np.int64)))


def _frozen(trace: Trace) -> Trace:
    """The trace with read-only arrays: shipped traces are cached and shared."""
    for a in (trace.arrival_s, trace.prompt_len, trace.output_len):
        a.flags.writeable = False
    return trace


def mean_rate(arrival_s: np.ndarray) -> float:
    """Requests per second between the first and the last arrival (0 if they coincide)."""
    span = float(arrival_s[-1] - arrival_s[0]) if len(arrival_s) else 0.0
    return (len(arrival_s) - 1) / span if span > 0 else 0.0


@functools.cache
def recorded_trace(workload: str) -> Trace:
    """Reads only (cached): the shipped trace `azure-code` or `azure-conv`."""
    file = RECORDED.get(workload)
    if file is None:
        raise PagedLabError(f"unknown recorded trace {workload!r}; choose one of "
                            f"{', '.join(RECORDED)}")
    return parse_trace_csv((TRACE_DIR / file).read_bytes(), workload)


def checked_time_scale(value: object) -> float:
    """`value` as a time scale, or PagedLabError."""
    if not (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and 0 < value <= MAX_TIME_SCALE):
        raise PagedLabError(f"time scale must be a number in (0, {MAX_TIME_SCALE:g}], "
                            f"got {shown(value)}")
    return float(value)


def replay_trace(trace: Trace, *, requests: int | None = None, rate: float | None = None,
                 time_scale: float | None = None) -> Trace:
    """Reads only: the first `requests` requests (all if None), with the gaps between
    arrivals divided by `time_scale`, or rescaled so that the mean rate is `rate`
    (at most one of the two). Raises PagedLabError for a value out of range."""
    n = len(trace)
    if requests is not None:
        check_int(requests, f"requests for {trace.workload}", 1, n)
        n = requests
    if rate is not None and time_scale is not None:
        raise PagedLabError("give a rate or a time scale, not both: each sets the other")
    arrival = np.array(trace.arrival_s[:n], dtype=np.float64)
    recorded = mean_rate(arrival)
    scale = 1.0
    if time_scale is not None:
        scale = checked_time_scale(time_scale)
    elif rate is not None:
        if not (isinstance(rate, (int, float)) and not isinstance(rate, bool)
                and math.isfinite(rate) and rate > 0):
            raise PagedLabError(f"rate must be a positive number of requests per second, "
                                f"got {rate!r}")
        if recorded == 0:
            held = (f"the trace's first {n:,} requests arrive at once" if n > 1 else
                    "it takes one")
            raise PagedLabError(f"a rate needs at least two requests at different times; "
                                f"{held} ({trace.workload})")
        scale = float(rate) / recorded
    if scale != 1.0:
        # The first arrival is at 0 (times are relative to the first row).
        arrival = arrival / scale
    return Trace(trace.workload, recorded * scale, trace.seed, arrival,
                 trace.prompt_len[:n].copy(), trace.output_len[:n].copy(),
                 trace.time_scale * scale)


def workload_trace(workload: str, *, requests: int | None = None, rate: float | None = None,
                   seed: int = 0, time_scale: float | None = None) -> Trace:
    """Reads only: a named workload's trace, as `simulate --workload NAME` replays it.

    Synthetic (sharegpt, alpaca): `requests` Poisson arrivals at `rate` (defaults
    1000 and DEFAULT_RATE), gaps then divided by `time_scale`. Recorded
    (azure-code, azure-conv): `replay_trace` of the shipped file, whole by default.
    """
    if workload in RECORDED:
        return replay_trace(recorded_trace(workload), requests=requests, rate=rate,
                            time_scale=time_scale)
    if rate is not None and time_scale is not None:
        raise PagedLabError("give a rate or a time scale, not both: each sets the other")
    trace = make_trace(workload, DEFAULT_REQUESTS if requests is None else requests,
                       DEFAULT_RATE if rate is None else rate, seed)
    if time_scale is None:
        return trace
    # Poisson arrivals at rate R with gaps divided by F are Poisson arrivals at R x F.
    f = checked_time_scale(time_scale)
    return Trace(trace.workload, trace.rate * f, seed, trace.arrival_s / f, trace.prompt_len,
                 trace.output_len, f)
