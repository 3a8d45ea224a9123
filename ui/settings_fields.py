"""The sidebar's settings fields: the config they describe, and their callbacks.

The fields are widgets whose values live in session state (ui/session.py,
`CONFIG_KEYS`); `fields_config` reads them as an `EngineConfig` or says why they
describe none. Applying a config replaces the engine: ui/engine_actions.py.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from backend.core.config import REAL_MODELS, EngineConfig
from backend.core.errors import PagedLabError
from backend.sessions.forms import config_from_fields, field_problem
from backend.sessions.playground import MODEL_FIELDS, MODEL_PRESETS
from ui.labels import FIELD_LABELS
from ui.numbers import MAX_EXACT, out_of_range, whole
from ui.session import CONFIG_KEYS, DIM_KEYS, config_fields, get_settings

# The sidebar's number fields that may hold a fraction; the others hold whole numbers.
FRACTION_FIELDS = frozenset({"temperature", "top_p"})


def _field_value(name: str, value: Any, applied: Any) -> Any:
    """A sidebar field's value as the config takes it: a whole-number field's float
    (ui/numbers.py) as an int, a fraction refused by the field's name.

    A seed past 2^53 - 1 (a scenario or snapshot may give up to 2^63 - 1) comes back
    from the browser rounded: the number the browser shows for the `applied` seed is
    that seed. Another such number is refused: the seed applied would not be the one
    typed. A negative seed is refused with the field's range (0 to 2^53 - 1), not the
    config's larger one.
    """
    if not isinstance(value, float) or name in FRACTION_FIELDS:
        return value
    label = FIELD_LABELS[name]
    if name == "seed" and value < 0:
        # The field's own range, not the config's 2^63 - 1, which it refuses past 2^53 - 1.
        raise PagedLabError(out_of_range(label, 0, MAX_EXACT, value))
    if name == "seed" and abs(value) > MAX_EXACT:
        if isinstance(applied, int) and float(applied) == value:
            return applied
        raise PagedLabError(
            f"{out_of_range(label, 0, MAX_EXACT, value)}: a browser's field rounds a larger "
            "number, so it would not be the number typed (a scenario or snapshot file may give "
            f"up to {(1 << 63) - 1:,})")
    return whole(label, value)


def fields_config() -> tuple[EngineConfig | None, str | None]:
    """The config the sidebar's fields describe, or the reason they describe none.

    Every field holding a fraction is named, one per line (a person fixing two sees
    both), and with them every other field out of its range; the config's checks across
    fields, which need whole numbers, come after.
    """
    ss = st.session_state
    applied = get_settings().config
    # A real model's dimensions come from its weights: tiny-byte's size fields, not
    # drawn for it, are not read (nor refused) either.
    real = ss.get("cfg_model_name", applied.model) in REAL_MODELS
    fields: dict[str, Any] = {}
    fractions: dict[str, str] = {}
    for key, name in CONFIG_KEYS.items():
        if key in ss and not (real and key in DIM_KEYS):
            try:
                fields[name] = _field_value(name, ss[key], getattr(applied, name))
            except PagedLabError as exc:
                if key == "cfg_num_cpu_blocks" and ss.get("cfg_preemption") != "swap":
                    # Left with a fraction when Recompute was picked: the field is
                    # disabled now, so it cannot be fixed; the pool is unused anyway.
                    fields[name] = applied.num_cpu_blocks
                else:
                    fractions[name] = str(exc)
    if fractions:
        # With the fields read whole that are out of range (checked one by one, as
        # config_from_fields would), in the sidebar's order.
        swap = fields.get("preemption", applied.preemption) == "swap"
        problems = [fractions[name] if name in fractions
                    else field_problem(name, fields[name], swap=swap)
                    for name in CONFIG_KEYS.values() if name in fractions or name in fields]
        return None, "\n".join(p for p in problems if p is not None)
    try:
        return config_from_fields(fields, applied), None
    except PagedLabError as exc:
        return None, str(exc)


def keep_current() -> None:
    """Callback of "Keep current": put the fields back to the applied config (with a
    real model applied, tiny-byte's size fields back to its defaults, as `init` seeds
    them)."""
    for key, value in {**config_fields(EngineConfig()),
                       **config_fields(get_settings().config)}.items():
        st.session_state[key] = value


def model_preset_changed() -> None:
    """Callback of the model-size field: fill in that preset's dimensions."""
    ss = st.session_state
    preset = MODEL_PRESETS.get(ss["cfg_model"])
    if preset is not None:
        for name in MODEL_FIELDS:
            ss[f"cfg_{name}"] = preset[name]


def model_dims_changed() -> None:
    """Callback of the four dimension fields: name the preset they match, if any."""
    ss = st.session_state
    dims = {name: ss[f"cfg_{name}"] for name in MODEL_FIELDS}
    ss["cfg_model"] = next((n for n, p in MODEL_PRESETS.items() if p == dims), "custom")
