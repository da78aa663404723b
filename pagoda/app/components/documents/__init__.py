"""Files attached to a chat, read into text the model can answer from. Plain Python, no Qt.

    convert          convert_document: a file (PDF, DOCX, PPTX, XLSX, HTML, text, Markdown,
                     code) into a Document, with no bound on what its parsers take
    reading_process  read_document: convert_document in a worker process, within limits on
                     memory and time, killed past them (or when the caller stops it)
    pdf, pdf_lines   a PDF's pages by PDFium, their wrapped lines joined into paragraphs
    office           Word, PowerPoint, Excel and HTML by markitdown, their ZIPs bounded first
    sniff            a file's type from its name and first bytes; named_readable: whether a
                     folder's file is one to read, by its name
    document         Document and the bounds a file is read within
    chunking         chunk_document: a Document cut into Chunks for retrieval
    retrieval_query  fts_query: a question as an FTS5 MATCH expression for a trigram index
    context          the prompt's documents: whole, or as retrieved passages with their Sources
    errors           DocumentError and its kinds
    reading_thread   the one worker thread every chat's files are read on

Importing this package imports neither markitdown nor PDFium; the reading process imports them
for the first such file.
"""

from pagoda.app.components.documents.passages.chunking import Chunk, chunk_document
from pagoda.app.components.documents.passages.context import (
    Hit,
    Source,
    passage_sources,
    retrieved_passages_message,
    whole_documents_message,
)
from pagoda.app.components.documents.document import Document, Kind
from pagoda.app.components.documents.errors import (
    DocumentError,
    DocumentTooLargeError,
    EmptyDocumentError,
    EncryptedDocumentError,
    NoTextLayerError,
    ReadingStoppedError,
    UnreadableDocumentError,
    UnsupportedDocumentError,
)
from pagoda.app.components.documents.reading.pdf import ProgressCallback
from pagoda.app.components.documents.reading.reading_process import (
    DocumentReader,
    ReadingCancelled,
    ReadingLimits,
    ReadingProcess,
    read_document,
)
from pagoda.app.components.documents.reading.reading_thread import reading_thread
from pagoda.app.components.documents.passages.retrieval_query import fts_query
from pagoda.app.components.documents.reading.sniff import named_readable

__all__ = [
    "Chunk",
    "Document",
    "DocumentError",
    "DocumentReader",
    "DocumentTooLargeError",
    "EmptyDocumentError",
    "EncryptedDocumentError",
    "Hit",
    "Kind",
    "NoTextLayerError",
    "ProgressCallback",
    "ReadingCancelled",
    "ReadingLimits",
    "ReadingProcess",
    "ReadingStoppedError",
    "Source",
    "UnreadableDocumentError",
    "UnsupportedDocumentError",
    "chunk_document",
    "fts_query",
    "named_readable",
    "passage_sources",
    "read_document",
    "reading_thread",
    "retrieved_passages_message",
    "whole_documents_message",
]
