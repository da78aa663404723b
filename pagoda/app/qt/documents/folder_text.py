"""The words shown for a chat's folders: how many files, where the indexing stands, what could
not be read and what the bounds left out. Strings only; the folder chips draw them."""

from __future__ import annotations

from pagoda.app.components.shared.view_models import FolderView

SCANNING = "looking for files…"
MOST_FAILURES_LISTED = 20


def files_text(count: int) -> str:
    return "1 file" if count == 1 else f"{count:,} files"


def folder_status(view: FolderView) -> str:
    """A folder chip's second line: "120 files · indexing 40 / 120", "120 files · up to date",
    with "· 2 not read" where files failed; the error when the folder cannot be looked in."""
    if view.state == "scanning":
        return SCANNING
    if view.state == "failed":
        return view.error
    where = (f"indexing {view.done:,} / {view.to_read:,}" if view.state == "indexing"
             else "up to date")
    failed = f" · {len(view.failed):,} not read" if view.failed else ""
    return f"{files_text(view.files)} · {where}{failed}"


def folder_details(view: FolderView) -> str:
    """The chip's tooltip: the folder's path, what is indexed, the bounds' notes, and each file
    that could not be read with why (the first MOST_FAILURES_LISTED)."""
    lines = [view.path, f"{files_text(view.indexed)} indexed of {view.files:,} found."]
    if view.error:
        lines.append(view.error)
        if view.indexed:
            lines.append("The chat answers from what was indexed before.")
    lines += view.notes
    if view.failed:
        lines.append("Not read (each is tried again once it changes):")
        lines += [f"• {path}: {why}" for path, why in view.failed[:MOST_FAILURES_LISTED]]
        more = len(view.failed) - MOST_FAILURES_LISTED
        if more > 0:
            lines.append(f"… and {more:,} more")
    return "\n".join(lines)
