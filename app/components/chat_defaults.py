"""The settings a new chat starts with: the system prompt and sampling the user chose with
"Use as default for new chats", kept as one app setting in the store. No Qt."""

from __future__ import annotations

import logging
from dataclasses import asdict, fields
from typing import Any

from app.components.view_models import SamplingView

logger = logging.getLogger(__name__)

NEW_CHAT_DEFAULTS_SETTING = "new_chat_defaults"
_TYPES = {"system_prompt": (str,), "temperature": (int, float), "top_p": (int, float),
          "top_k": (int,), "min_p": (int, float), "repetition_penalty": (int, float),
          "max_tokens": (int,), "seed": (int, type(None))}


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
        value = stored.get(field.name)
        if field.name not in stored:
            continue
        if isinstance(value, bool) or not isinstance(value, _TYPES[field.name]):
            logger.warning("ignored %s.%s = %r", NEW_CHAT_DEFAULTS_SETTING, field.name, value)
            continue
        values[field.name] = value
    return SamplingView(**values)
