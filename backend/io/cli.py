"""`python -m backend`: run scenarios headless, and replay traces (CONTRACT.md).

    python -m backend run SCENARIO.json [--out SNAPSHOT.json] [--snapshots DIR]
                                        [--device auto|cpu|cuda] [--kernel auto|triton|torch]
                                        [--from SNAPSHOT.json] [--check]
    python -m backend simulate ...

Exit 0 on success. Bad input (a malformed scenario or snapshot, an operation
the engine refuses) exits 2 with one line on stderr naming the step, the
operation and the reason; `--out` still receives the last good snapshot.
`--check` also compares each step's narrated `expect` values and exits 1 on
a mismatch. Never a traceback for bad input.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from backend.core.checks import file_kind, json_kind
from backend.core.errors import PagedLabError
from backend.core.words import counted
from backend.engine.engine import Engine
from backend.io.expect import check_expectations
from backend.io.json_input import path_arg, same_file
from backend.io.report import out, say
from backend.io.restore import restore_engine
from backend.io.restore_notes import restore_notes
from backend.io.scenario import (
    ScenarioError,
    check_config_matches,
    check_start,
    load_scenario,
    read_json,
    run_steps,
)
from backend.io.snapshot import export_snapshot, write_snapshot

# An operation stopped half-way (BSD's EX_SOFTWARE): not bad input, which exits 2.
EXIT_INTERNAL = 70
# The names --snapshots writes in its directory: step-0001.json, one per step.
SNAPSHOT_NAME = re.compile(r"step-\d{4,}\.json")


class _Once(argparse.Action):
    """Store an option's value, refusing the option given twice: argparse would keep the
    last without a word (`--out a.json --out b.json` writing only b.json)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        given: set[str] = namespace.__dict__.setdefault("_given_once", set())
        if self.dest in given:
            parser.error(f"argument {'/'.join(self.option_strings)}: given twice; give it once")
        given.add(self.dest)
        setattr(namespace, self.dest, values)


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors exit 2 with one `error:` line, like every other error.

    `commands` holds the top-level parser's subcommands, so that an argument none of
    them knows is reported with the usage of the command it was given to.
    """

    commands: dict[str, argparse.ArgumentParser]
    given: list[str]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Options are taken as written in full: CONTRACT.md fixes their names, and an
        # abbreviation (`--kern`) would change meaning the day an option shares it.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        if args and args[0].startswith("-") and "action" not in kwargs:
            kwargs["action"] = _Once
        return super().add_argument(*args, **kwargs)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        # Kept for `error`: argparse reports a missing required option before the
        # arguments it did not know, which may be that option abbreviated.
        self.given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith("the following arguments are required"):
            # `--polic paged` for `--policy paged`: say so, as for any abbreviation.
            known = {name for action in self._actions for name in action.option_strings}
            unknown = [arg for arg in getattr(self, "given", ())
                       if arg.startswith("--") and arg.split("=", 1)[0] not in known]
            message += _written_in_full(self, unknown)
        # With the usage line: "arguments are required: command" alone names no command.
        # argparse wraps a long usage over several lines; it is joined back into one.
        say("error", f"{message}; {' '.join(self.format_usage().split())}")
        raise SystemExit(2)


def build_parser() -> _Parser:
    parser = _Parser(prog="python -m backend", description="PagedLab from the command line.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="apply a scenario's operations on a fresh engine")
    parser.commands = {"run": run}
    run.add_argument("scenario", type=path_arg, help="scenario file (JSON)")
    run.add_argument("--out", type=path_arg, help="write the final snapshot here")
    run.add_argument("--snapshots", type=path_arg, metavar="DIR",
                     help="also write DIR/step-NNNN.json after every operation")
    run.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    run.add_argument("--kernel", choices=("auto", "triton", "torch"), default="auto")
    run.add_argument("--from", dest="from_snapshot", type=path_arg, metavar="SNAPSHOT.json",
                     help="start from this snapshot's state instead of a fresh engine")
    run.add_argument("--check", action="store_true",
                     help="compare each step's narrated `expect` values; exit 1 on a mismatch")
    try:
        from backend.io.simulate_cli import add_simulate_arguments
    except ImportError:  # the simulator is optional for `run`
        pass
    else:
        simulate = sub.add_parser(
            "simulate", help="replay a trace (synthetic, a recorded Azure trace or a CSV) "
                             "through one allocation policy")
        add_simulate_arguments(simulate)
        parser.commands["simulate"] = simulate
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # argparse would report these with the top-level usage, which shows no option
        # of the command they were given to.
        command = parser.commands[args.command]
        command.error(f"unrecognized arguments: {' '.join(unknown)}"
                      + _written_in_full(command, unknown))
    if args.command == "simulate":
        from backend.io.simulate_cli import run_simulate

        return run_simulate(args)
    return _run(args)


def _written_in_full(command: argparse.ArgumentParser, unknown: list[str]) -> str:
    """For an unknown option that starts an option's name (`--kern`), the names it could
    be short for."""
    known = [name for action in command._actions for name in action.option_strings
             if name.startswith("--")]
    hints = []
    for arg in unknown:
        given = arg.split("=", 1)[0]
        if given.startswith("--") and len(given) > 2:
            names = [name for name in known if name.startswith(given)]
            if names:
                hints.append(f"{given} is short for {' or '.join(names)}")
    return f" (options are written in full: {'; '.join(hints)})" if hints else ""


def _fail(message: str) -> int:
    say("error", message)
    return 2


def _run(args: argparse.Namespace) -> int:
    engine: Engine | None = None
    failure: ScenarioError | None = None
    problem: str | None = None
    mismatches = checked = ran = 0
    notes: list[str] = []
    building = False   # the engine is being built (restored, or made from the config)
    restoring: str | None = None   # " from 'SNAPSHOT'" while it is restored
    try:
        _refuse_over_scenario(args.out, args.scenario, "--out")
        if args.snapshots is not None:
            _refuse_among_snapshots(args.out, args.snapshots)
            _make_dir(args.snapshots)
        if args.from_snapshot is not None:
            data = read_json(args.from_snapshot, "snapshot")
            if not isinstance(data, dict):
                raise PagedLabError(f"snapshot must be a JSON object, got {json_kind(data)}")
            if file_kind(data) == "scenario":
                raise PagedLabError(
                    f"{str(args.from_snapshot)!r} is a scenario (it has 'steps'), not a "
                    "snapshot: --from takes a snapshot, such as one --out wrote")
            building, restoring = True, f" from {str(args.from_snapshot)!r}"
            engine = restore_engine(data, device=args.device, kernel=args.kernel)
            building, restoring = False, None
            notes = restore_notes(engine)
        try:
            scenario = load_scenario(
                args.scenario, vocab_size=None if engine is None else engine.config.vocab_size,
                base=None if engine is None else engine.config)
        except ScenarioError as exc:
            if exc.partial is None:
                raise
            # A malformed step: apply the steps before it, so the state reported
            # is the one just before the failing step, as for a refused step.
            scenario, failure = exc.partial, exc
        # Before a fresh engine is built for it: a scenario continuing a snapshot's state
        # would act on requests a fresh engine does not hold.
        check_start(scenario, args.scenario, None if engine is None else engine.step)
        notes += scenario.notes()
        if args.from_snapshot is not None and scenario.contiguous is not None:
            # Said, not dropped without a word: the arena would start empty beside a
            # state that already holds requests, so none is followed.
            notes.append("the scenario's contiguous arena is not followed in a run from a "
                         "snapshot (a snapshot holds no arena to start it from)")
        if engine is None:
            building = True
            engine = Engine(scenario.config, device=args.device, kernel=args.kernel)
            building = False
        else:
            check_config_matches(scenario, engine.config)
        mirror = scenario.mirror() if args.check and args.from_snapshot is None else None
        for i, step, result in run_steps(engine, scenario.steps, mirror=mirror):
            ran += 1
            if args.snapshots is not None:
                path = args.snapshots / f"step-{engine.step:04d}.json"
                _refuse_over_scenario(path, args.scenario, "--snapshots")
                try:
                    write_snapshot(engine, path)
                except OSError as exc:
                    raise PagedLabError(f"--snapshots: cannot write {path} after step {i} "
                                        f"({step.op.op}): {exc.strerror}") from None
            if args.check and step.expect:
                for line in check_expectations(step.expect, export_snapshot(engine), engine,
                                               result, mirror):
                    say("mismatch", f"step {i} ({step.op.op}): {line}")
                    mismatches += 1
                checked += len(step.expect)
        if failure is not None:
            raise failure
    except PagedLabError as exc:
        problem = str(exc)
    except OSError as exc:  # a file could not be read or written
        problem = f"cannot use {exc.filename or 'a file'}: {exc.strerror}"
    except Exception as exc:
        # PAGEDLAB_DEBUG=1 shows the traceback of either failure below.
        if os.environ.get("PAGEDLAB_DEBUG") == "1":
            raise
        if building:
            # The engine's K/V tensors could not be made (the machine out of memory for a
            # pool the limits allow, or a bug): one line, not a traceback, and no --out,
            # since there is no engine to write.
            # From a snapshot, the file may be to blame too: one its checks let through.
            whose = ("of PagedLab or of the machine, not of the file" if restoring is None
                     else "of PagedLab or of the machine, or a snapshot that PagedLab's "
                          "checks let through")
            say("error", f"PagedLab could not build the engine{restoring or ''} "
                          f"({exc.__class__.__name__}: {exc}); a failure {whose}; --out was "
                          "not written")
            return EXIT_INTERNAL
        if engine is None or engine.broken is None:
            raise
        # An operation stopped half-way (a bug in PagedLab, or the machine ran out of
        # memory): one line, not a traceback, and no --out, since the state is one no
        # sequence of operations produces.
        say("error", f"step {ran + 1} ({scenario.steps[ran].op.op}): PagedLab stopped "
                      f"half-way through it ({exc.__class__.__name__}: {exc}); a failure of "
                      "PagedLab or of the machine, not of the file; --out was not written")
        return EXIT_INTERNAL
    # --out receives the last good state whatever went wrong; when it cannot,
    # that joins the first problem in one line rather than adding a second.
    out_problem = _write_out(engine, args.out)
    if problem is None and out_problem is None:
        # A field of the snapshot or the scenario that was not read is named, not
        # dropped without a word (a failure's one line leaves them out: it is what to
        # mend).
        for note in notes:
            say("note", note)
        if args.check and not mismatches:
            # Quiet success would not tell "all met" from "nothing checked", so both are
            # said, and a file with no `expect` at all is not said to pass.
            out(f"checked {counted(checked, 'expectation')} in "
                f"{counted(ran, 'step')}: {'all met' if checked else 'nothing to check'}\n")
        return 1 if mismatches else 0
    if problem is None:
        return _fail(f"cannot write {out_problem}")
    if out_problem is not None:
        problem += f"; --out was not written: cannot write {out_problem}"
    return _fail(problem)


def _refuse_over_scenario(path: Path | None, scenario: Path, option: str) -> None:
    """A snapshot written over the scenario file itself would replace it: refused, for
    --out before anything runs, for a --snapshots file before it is written. (--out over
    --from's snapshot is allowed: it moves that state on, in place.)"""
    if path is not None and same_file(path, scenario):
        raise PagedLabError(f"{option} {str(path)!r} is the scenario file itself: the "
                            "snapshot would replace it; name another file")


def _refuse_among_snapshots(out: Path | None, snapshots: Path) -> None:
    """--out named like a file --snapshots writes, in its directory: one would replace
    the other (and which step's state the file held would depend on the run). Refused
    before anything runs."""
    # The directory may not exist yet: its resolved path tells it too.
    if (out is not None and SNAPSHOT_NAME.fullmatch(out.name)
            and (same_file(out.parent, snapshots)
                 or out.parent.resolve() == snapshots.resolve())):
        raise PagedLabError(f"--out {str(out)!r} is a name --snapshots {str(snapshots)!r} "
                            "writes a step's snapshot under: one would replace the other; "
                            "name another file")


def _make_dir(path: Path) -> None:
    """--snapshots' directory, created if missing; refused by the option's name."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PagedLabError(f"--snapshots {str(path)!r}: cannot make it a directory "
                            f"({exc.strerror})") from None


def _write_out(engine: Engine | None, out: Path | None) -> str | None:
    """Write the snapshot to `out` if both exist; what went wrong ("PATH: reason"), if it fails."""
    if engine is None or out is None:
        return None
    try:
        write_snapshot(engine, out)
    except OSError as exc:
        return f"{out}: {exc.strerror}"
    return None
