"""A look at a chat's folder, reading nothing: the files Pagoda reads by their name, with their
path in the folder, modification time and size, in a stable order, within bounds (files, depth),
hidden ones and links out of the folder left out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pagoda.app.components.documents import folder_scan
from pagoda.app.components.documents.folder_scan import FolderError, scan_folder


def write(root: Path, relative: str, text: str = "some words") -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def found(root: Path) -> list[str]:
    return [stat.source_path for stat in scan_folder(root).files]


def test_the_files_pagoda_reads_are_found_by_name_folder_by_folder(tmp_path):
    for name in ("b.md", "a.txt", "notes/c.html", "notes/deep/d.py", "report.pdf",
                 "photo.jpg", "data.bin", "Makefile", "notes/e.docx"):
        write(tmp_path, name)
    assert found(tmp_path) == ["Makefile", "a.txt", "b.md", "notes/c.html", "notes/deep/d.py",
                               "notes/e.docx", "report.pdf"]


def test_a_file_is_seen_with_its_modification_time_and_size(tmp_path):
    path = write(tmp_path, "a.md", "twelve bytes")
    os.utime(path, ns=(1_700_000_000_000_000_001, 1_700_000_000_000_000_001))
    (stat,) = scan_folder(tmp_path).files
    assert (stat.source_path, stat.mtime_ns, stat.size) == ("a.md", 1_700_000_000_000_000_001,
                                                            12)


def test_hidden_files_and_folders_are_left_out(tmp_path):
    write(tmp_path, ".secret.md")
    write(tmp_path, ".git/notes.md")
    write(tmp_path, "seen.md")
    assert found(tmp_path) == ["seen.md"]


def test_links_are_followed_only_to_files_inside_the_folder(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    write(root, "real/a.md")
    write(outside, "b.md")
    (root / "inside-link.md").symlink_to(root / "real" / "a.md")
    (root / "outside-link.md").symlink_to(outside / "b.md")
    (root / "outside-folder").symlink_to(outside, target_is_directory=True)
    (root / "loop").symlink_to(root, target_is_directory=True)
    assert found(root) == ["inside-link.md", "real/a.md"]


def test_folders_too_deep_are_left_out_and_counted(tmp_path):
    deep = "/".join(f"level{i}" for i in range(1, folder_scan.MAX_DEPTH + 2))
    write(tmp_path, f"{deep}/far.md")
    write(tmp_path, "level1/near.md")
    scan = scan_folder(tmp_path)
    assert [s.source_path for s in scan.files] == ["level1/near.md"] and scan.too_deep == 1


def test_past_the_most_files_the_look_stops_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(folder_scan, "MAX_FILES", 3)
    for i in range(5):
        write(tmp_path, f"{i}.md")
    scan = scan_folder(tmp_path)
    assert [s.source_path for s in scan.files] == ["0.md", "1.md", "2.md"] and scan.more_files


def test_a_path_that_is_no_folder_is_refused_in_words(tmp_path):
    with pytest.raises(FolderError, match="is not a folder"):
        scan_folder(tmp_path / "gone")
    with pytest.raises(FolderError, match="is not a folder"):
        scan_folder(write(tmp_path, "a.md"))
