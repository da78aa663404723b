"""Text at the engine's boundary must be valid Unicode: a lone surrogate cannot be tokenized."""

from pagoda.engine.errors import InvalidTextError


def lone_surrogate_at(text: str) -> int | None:
    """Index of the first lone surrogate (half of a UTF-16 pair on its own), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return error.start
    return None


def check_encodable(text: str, what: str) -> None:
    """Refuse text holding a lone surrogate (say, half of an emoji cut by a bad paste)."""
    index = lone_surrogate_at(text)
    if index is not None:
        raise InvalidTextError(
            f"{what} holds a lone surrogate U+{ord(text[index]):04X} at character {index}: it is "
            "not valid Unicode and cannot be tokenized; remove it or replace it (for example with "
            "text.encode('utf-8', 'replace').decode())"
        )
