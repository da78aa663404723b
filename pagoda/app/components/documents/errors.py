"""What can go wrong reading an attached file, in words a user can act on. Every message names the
file (as the user sees it: its name, not its folder) and, where there is one, the fix."""

from __future__ import annotations

READABLE_FORMATS = ("PDF, Word (.docx), PowerPoint (.pptx), Excel (.xlsx), HTML, plain text, "
                    "Markdown and source code")


class DocumentError(Exception):
    """Any file Pagoda cannot read into a chat; `name` is the file's name."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name

    def __reduce__(self) -> tuple:
        # Files are read in a worker process, and its errors come back pickled: rebuilt from
        # their message, as each kind's own arguments differ.
        return _rebuilt, (type(self), self.name, str(self), self.__dict__)


def _rebuilt(kind: type[DocumentError], name: str, message: str, state: dict) -> DocumentError:
    error = kind.__new__(kind)
    DocumentError.__init__(error, name, message)
    error.__dict__.update(state)
    return error


class UnsupportedDocumentError(DocumentError):
    """A file of a type Pagoda does not read (an image, an archive, an old Office format), or a
    text file whose bytes are not text."""

    def __init__(self, name: str, what: str, fix: str = "") -> None:
        fix = fix or f"Pagoda reads {READABLE_FORMATS}."
        super().__init__(name, f"Pagoda cannot read {name}: {what}. {fix}")


class DocumentTooLargeError(DocumentError):
    """A file past one of the bounds in `pagoda.app.components.documents.document`."""

    def __init__(self, name: str, amount: str, limit: str) -> None:
        super().__init__(name, f"{name} is too large to attach: it has {amount}, and Pagoda reads "
                               f"at most {limit} of a file. Split it, or attach the part you need.")


class EncryptedDocumentError(DocumentError):
    """A PDF or Office file locked with a password."""

    def __init__(self, name: str) -> None:
        super().__init__(name, f"{name} is password-protected, so Pagoda cannot read it. Save a "
                               "copy without the password and attach that.")


class NoTextLayerError(DocumentError):
    """A PDF whose pages hold images of text (a scan), not text."""

    def __init__(self, name: str, pages: int) -> None:
        super().__init__(name, f"{name} has no text to read on its {pages} "
                               f"page{'' if pages == 1 else 's'}; it may be a scanned image — "
                               "run OCR on it first, then attach the result.")


class UnreadableDocumentError(DocumentError):
    """A file that cannot be opened or parsed: damaged, truncated, renamed, or not readable on
    disk. `reason` says what failed."""

    def __init__(self, name: str, reason: str, fix: str = "") -> None:
        fix = fix or ("The file may be damaged or not what its name says; open it in its own app "
                      "to check.")
        super().__init__(name, f"Pagoda could not read {name}: {reason}. {fix}")
        self.reason = reason


class EmptyDocumentError(DocumentError):
    """A file with nothing in it, or nothing but blank space."""

    def __init__(self, name: str) -> None:
        super().__init__(name, f"{name} is empty: there is no text in it to read.")


class ReadingStoppedError(DocumentError):
    """A file whose reading went past a limit on memory or time, or crashed its reader: it was
    stopped, and nothing else with it. `reason` says which."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(name, f"Pagoda stopped reading {name}: {reason}. The file may be damaged "
                               "or built to overwhelm a reader; open it in its own app to check, "
                               "or save a copy of the part you need.")
        self.reason = reason
