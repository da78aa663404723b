"""Files attached to a chat, read into text the model can answer from. Plain Python, no Qt.

    reading/         a file into a Document: convert (PDF, DOCX, PPTX, XLSX, HTML, text,
                     Markdown, code), reading_process (convert in a worker process, within
                     limits on memory and time, killed past them), pdf and pdf_lines (PDFium),
                     office (markitdown, its ZIPs bounded first), sniff (a file's type; whether
                     a folder's file is one to read), text_files, languages, reading_thread
                     (the one worker thread every chat's files are read on)
    passages/        chunking (a Document cut into Chunks), headings, cjk, retrieval_query (a
                     question as an FTS5 MATCH expression), context (the prompt's documents:
                     whole, or retrieved passages with their Sources)
    document         Document and the bounds a file is read within
    errors           DocumentError and its kinds
    chat_documents   a chat's documents: the composer's files, kept with messages, in prompts
    folder_scan, folder_index   a chat's folders: a look at their files, their index kept
    document_embeddings         passages' vectors from an embeddings server

Importing this package imports neither markitdown nor PDFium; the reading process imports them
for the first such file.
"""

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
from pagoda.app.components.documents.passages.chunking import Chunk, chunk_document
from pagoda.app.components.documents.passages.context import (
    Hit,
    Source,
    passage_sources,
    retrieved_passages_message,
    whole_documents_message,
)
from pagoda.app.components.documents.passages.retrieval_query import fts_query
from pagoda.app.components.documents.reading.pdf import ProgressCallback
from pagoda.app.components.documents.reading.reading_process import (
    DocumentReader,
    ReadingCancelled,
    ReadingLimits,
    ReadingProcess,
    read_document,
)
from pagoda.app.components.documents.reading.reading_thread import reading_thread
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
