"""The settings a new chat starts with: the system prompt and sampling the user chose with
"Use as default for new chats", kept as one app setting in the store. No Qt."""

from __future__ import annotations

import logging
from dataclasses import asdict, fields
from typing import Any

from pagoda.app.components.view_models import SamplingView
from pagoda.app.store import ImportValidationError, sampling_setting

logger = logging.getLogger(__name__)

NEW_CHAT_DEFAULTS_SETTING = "new_chat_defaults"


def _read(name: str, value: Any) -> tuple[bool, Any]:
    """(whether `value` fits the field `name`, the value as the field holds it): the sampling
    settings as a chat's imported ones are checked."""
    if name == "system_prompt":
        return isinstance(value, str), value
    try:
        return True, sampling_setting(name, value)
    except ImportValidationError:
        return False, value


async def load_chat_defaults(db) -> SamplingView:
    """The user's defaults, or the built-in ones where none were set; a stored value of the
    wrong kind (another version's) is skipped with a log line."""
    stored = await db.get_setting(NEW_CHAT_DEFAULTS_SETTING, None)
    return chat_defaults_from(stored)


async def save_chat_defaults(db, settings: SamplingView) -> None:
    await db.set_setting(NEW_CHAT_DEFAULTS_SETTING, asdict(settings))


def chat_defaults_from(stored: Any) -> SamplingView:
    if stored is None:
        return SamplingView()
    if not isinstance(stored, dict):
        logger.warning("ignored the %s setting: not an object", NEW_CHAT_DEFAULTS_SETTING)
        return SamplingView()
    values = {}
    for field in fields(SamplingView):
        if field.name not in stored:
            continue
        fits, value = _read(field.name, stored[field.name])
        if not fits:
            logger.warning("ignored %s.%s = %r", NEW_CHAT_DEFAULTS_SETTING, field.name, value)
            continue
        values[field.name] = value
    return SamplingView(**values)
