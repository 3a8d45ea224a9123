"""Restore: a snapshot's exact state in place of the session's engine.

A downloaded or saved snapshot (Export and restore), or a scenario's step
("Continue from here"), replaces the engine as a new engine does
(ui/engine_actions.py): under the current engine's lock, a real model's weights
loaded first, the old state kept under Recent sessions when it was saved. Restore's
own: the K/V recomputed from the tokens with a progress bar, the
sidebar's fields set to the snapshot's config, and a status line that says what
came back and what restore noticed (backend/io/restore_notes.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from backend.core.errors import PagedLabError
from backend.core.words import counted
from backend.io.restore_notes import restore_notes
from backend.io.snapshot import export_snapshot
from backend.sessions import saved
from backend.sessions.history import History
from backend.sessions.oplog import OpLog
from backend.sessions.playground import Settings, restore_for_session, snapshot_config
from backend.views.text import notes_text
from ui import progress
from ui.engine_actions import (
    Kept,
    departures,
    install,
    kept_row,
    kept_sentence,
    load_weights,
    set_fields,
)
from ui.operations import REPLACED_TOO_OFTEN, OpSession, holding_current
from ui.progress import Shown
from ui.session import collect, flash


def snapshot(data: dict[str, Any], source: str,
             refused: Callable[[str], str] | None = None, *, own: bool = False) -> str | None:
    """Replace the engine by the exact state a snapshot describes.

    Returns None on success (the status line says what was restored), else
    the reason it was refused, with the current engine kept; with `refused`, the
    status line also says `refused(reason)`, through the session the restore held
    (so the lines of operations it waited behind stay above it). For callbacks
    only: it also sets the sidebar's fields to the snapshot's config, which
    Streamlit allows only before the sidebar is drawn. The device and kernel
    stay the sidebar's. `source` names where the snapshot came from; `own` says it is
    an engine's own export (a scenario's step), whose beam scores are taken as they are
    (`restore_engine`'s `check_scores`).

    An engine with state that was saved is not overwritten: the restored state
    goes under a new session id, and the one it replaces stays in the list.
    """
    work = progress.get_work()
    shown: list[Shown] = []
    loaded = Shown()
    problem: str | None = None
    config = snapshot_config(data)
    # Weights included, under the current engine's lock, as in `_replace_engine`.
    with holding_current("replace", work, shown) as sess:
        if sess is None:
            problem = REPLACED_TOO_OFTEN
        else:
            s = sess.settings
            kept = kept_row(sess.tab, sess.engine)
            if config is not None:
                try:
                    loaded = load_weights(Settings(config, s.device, s.kernel), work)
                except PagedLabError as exc:
                    problem = str(exc)
            if problem is None:
                problem, restored = _restore_held(data, source, sess, kept, own)
                shown.append(restored)
        if problem is not None and refused is not None:
            if sess is None:
                flash("error", refused(problem))
            else:
                sess.flash("error", refused(problem))
    collect()
    loaded.finish()
    for waited in shown:
        waited.finish()
    return problem


def _restore_held(data: dict[str, Any], source: str, sess: OpSession,
                  kept: Kept | None, own: bool) -> tuple[str | None, Shown]:
    """`snapshot` with the old engine's lock held and the weights loaded: the
    reason it was refused (None: restored), and the Shown of its progress bar."""
    s, old = sess.settings, sess.engine
    problem: str | None = None
    with progress.restoring(f"Restoring {source}: K/V recomputed from the tokens") as (
            shown, moved):
        try:
            # Detached: the caller's snapshot (a scenario's frame) must not grow with
            # this engine's tokens.
            engine = restore_for_session(saved.detached(data), s, sess.owner, replacing=old,
                                         progress=moved, check_scores=not own)
        except PagedLabError as exc:
            problem = str(exc)
        else:
            snapshot = export_snapshot(engine)
            history = History()
            history.record(snapshot)
            live = saved.Live(engine, Settings(engine.config, s.device, s.kernel), history,
                              OpLog(snapshot))
            if kept is not None:
                sess.detach()
            else:
                # A copy not saved yet: the restored state is not that link's session.
                sess.tab.address = None
            install(live, sess)
            set_fields(live.settings, sess.queued)
            sess.save(live, snapshot, whole=True)
            c = engine.config
            before = kept_sentence(kept)
            # The model is named where the snapshot brought another one (or a real one),
            # as a new engine's line names it: a switch is otherwise seen only in the
            # sidebar.
            model = f" on {c.model}" if c.dims is not None or c.model != s.config.model else ""
            sess.flash("success", f"Restored {source}: step {engine.step}, "
                                  f"{counted(len(engine.requests), 'request')}, "
                                  f"{counted(c.num_blocks, 'block')} "
                                  f"of {counted(c.block_size, 'slot')}{model}"
                                  f"{departures(c)}; K/V "
                                  f"recomputed from the tokens. Keep working from here.{before}"
                                  + notes_text(restore_notes(engine)))
    return problem, shown


