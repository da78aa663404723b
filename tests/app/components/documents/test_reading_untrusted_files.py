"""Files are read in a worker process within limits on memory and time: a small file built to
make its reader allocate gigabytes, spin for minutes, or abort is stopped and refused in words,
and the next file reads. The limits here are small, so that each case ends in seconds."""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pagoda.app.components.documents import (
    DocumentTooLargeError,
    EncryptedDocumentError,
    ReadingCancelled,
    ReadingLimits,
    ReadingProcess,
    ReadingStoppedError,
    UnreadableDocumentError,
    UnsupportedDocumentError,
)
from pagoda.app.components.documents.reading.convert import convert_document
from tests.app.components.documents.document_files import write_docx, write_pdf
from tests.app.components.documents.hostile_files import (
    write_far_cell_xlsx,
    write_flate_bomb_pdf,
    write_huge_xml_docx,
    write_shared_stream_pdf,
)

HARBOUR = [("The harbour", ["The harbour master counted forty boats."])]
# Room for Python's and markitdown's own imports (~300 MiB mapped), little for a file.
OFFICE_MEMORY = 640 * 2**20


@pytest.fixture
def reading() -> Iterator[Callable[[ReadingLimits], ReadingProcess]]:
    started: list[ReadingProcess] = []

    def start(limits: ReadingLimits) -> ReadingProcess:
        started.append(ReadingProcess(limits))
        return started[-1]

    yield start
    for process in started:
        process.close()


def assert_reads_a_normal_file_after(process: ReadingProcess, tmp_path: Path) -> None:
    document = process.read(write_pdf(tmp_path / "harbour.pdf", HARBOUR))
    assert "forty boats" in document.text


@pytest.mark.slow
def test_a_pdf_flate_bomb_is_stopped_at_the_memory_limit(reading, tmp_path: Path) -> None:
    process = reading(ReadingLimits(memory_bytes=96 * 2**20, seconds=30))
    bomb = write_flate_bomb_pdf(tmp_path / "falcon.pdf", inflated_mib=256)

    with pytest.raises(ReadingStoppedError,
                       match=r"^Pagoda stopped reading falcon\.pdf: .*more than 96 MiB of memory"):
        process.read(bomb)
    assert_reads_a_normal_file_after(process, tmp_path)


def test_pdf_pages_sharing_one_big_stream_are_stopped_at_the_time_limit(reading,
                                                                        tmp_path: Path) -> None:
    process = reading(ReadingLimits(seconds=2, seconds_per_mib=0))
    assert_reads_a_normal_file_after(process, tmp_path)  # the worker's start is not the file's
    shared = write_shared_stream_pdf(tmp_path / "pages.pdf", pages=200, stream_mib=8)
    assert shared.stat().st_size < 100_000

    began = time.monotonic()
    with pytest.raises(ReadingStoppedError,
                       match=r"^Pagoda stopped reading pages\.pdf: reading it took more than "
                             r"2\.0 s\."):
        process.read(shared)
    assert time.monotonic() - began < 10
    assert_reads_a_normal_file_after(process, tmp_path)


@pytest.mark.slow
def test_a_docx_of_huge_xml_is_stopped_at_the_time_limit(reading, tmp_path: Path) -> None:
    process = reading(ReadingLimits(memory_bytes=OFFICE_MEMORY, seconds=3, seconds_per_mib=0))
    base = write_docx(tmp_path / "base.docx", [("Cider", ["Nine crates."])])
    huge = write_huge_xml_docx(tmp_path / "report.docx", base, xml_mib=4)
    assert huge.stat().st_size < 100_000

    with pytest.raises(ReadingStoppedError, match=r"^Pagoda stopped reading report\.docx: "
                                                  r"reading it took more than 3\.0 s\."):
        process.read(huge)
    assert "Nine crates" in process.read(base).text


def test_an_xlsx_with_one_cell_far_out_is_refused_before_a_table_is_filled_in(
        reading, tmp_path: Path) -> None:
    process = reading(ReadingLimits(memory_bytes=OFFICE_MEMORY, seconds=60))
    far = write_far_cell_xlsx(tmp_path / "ledger.xlsx")
    assert far.stat().st_size < 10_000

    with pytest.raises(DocumentTooLargeError,
                       match=r"ledger\.xlsx is too large to attach: it has a sheet \(sheet1\) that "
                             r"spans 1,048,576 rows × 16,384 columns"):
        process.read(far)
    assert_reads_a_normal_file_after(process, tmp_path)


def test_the_readers_own_errors_come_back_as_they_are(reading, tmp_path: Path) -> None:
    process = reading(ReadingLimits())
    locked = write_pdf(tmp_path / "locked.pdf", HARBOUR, password="sesame")

    with pytest.raises(EncryptedDocumentError, match=r"locked\.pdf is password-protected"):
        process.read(locked)
    with pytest.raises(UnreadableDocumentError, match=r"could not read gone\.pdf: no such file"):
        process.read(tmp_path / "gone.pdf")
    assert_reads_a_normal_file_after(process, tmp_path)


def test_a_reading_stops_within_moments_of_its_caller_asking(reading, tmp_path: Path) -> None:
    process = reading(ReadingLimits(seconds=600))
    assert_reads_a_normal_file_after(process, tmp_path)
    shared = write_shared_stream_pdf(tmp_path / "pages.pdf", pages=200, stream_mib=8)
    asked = threading.Event()
    threading.Timer(0.5, asked.set).start()

    with pytest.raises(ReadingCancelled):
        process.read(shared, stopped=asked.is_set)
    stopped_at = time.monotonic()
    assert_reads_a_normal_file_after(process, tmp_path)
    assert time.monotonic() - stopped_at < 10


def test_a_reading_stops_when_its_progress_raises(reading, tmp_path: Path) -> None:
    class Enough(Exception):
        pass

    def enough(done: int, total: int) -> None:
        raise Enough

    process = reading(ReadingLimits())
    with pytest.raises(Enough):
        process.read(write_shared_stream_pdf(tmp_path / "pages.pdf", pages=200, stream_mib=1),
                     on_progress=enough)
    assert_reads_a_normal_file_after(process, tmp_path)


def test_a_file_swapped_for_a_named_pipe_is_refused_without_waiting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pipe is made after a look at the name found a file: reading must look at what it
    opened, and opening must not wait for a writer."""
    pipe = tmp_path / "notes.txt"
    os.mkfifo(pipe)
    regular = (tmp_path / "looked-at.txt")
    regular.write_text("a file when looked at")
    looked_at = regular.stat()
    real_stat = Path.stat
    monkeypatch.setattr(Path, "stat", lambda self, **kw: looked_at if self == pipe
                        else real_stat(self, **kw))
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            convert_document(pipe)
        except BaseException as error:  # noqa: BLE001 - handed to the test's thread
            outcome.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # blocked in open(): a writer lets it go
        with open(pipe, "wb"):
            pass
        reader.join(10)
        pytest.fail("reading a named pipe waited for a writer")
    assert stat.S_ISFIFO(os.stat(pipe).st_mode)
    (error,) = outcome
    assert isinstance(error, UnsupportedDocumentError)
    assert "notes.txt: it is a named pipe or a device, not a file" in str(error)
