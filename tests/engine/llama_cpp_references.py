"""llama.cpp's greedy tokens, recorded by tests/engine/data/llama_cpp/record.py, as the families'
GGUF tests read them.

    for record in llama_cpp_records("tiny_families.json", family="gemma3", type="f16"):
        assert sha256(our_gguf) == record.sha256  # the tokens belong to this very file
        for c in record.continuations: ...        # c.prompt_ids -> c.llama_cpp_tokens

A token whose top2_logprob_gaps entry is a few hundredths or less is a near-tie in llama.cpp:
another correct kernel may choose the other token there (and differ after it).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

RECORDS_DIR = Path(__file__).parent / "data" / "llama_cpp"


@dataclass(slots=True)
class Continuation:
    prompt_ids: list[int]
    llama_cpp_tokens: list[int]
    top2_logprob_gaps: list[float]


@dataclass(slots=True)
class FileRecord:
    """llama.cpp's greedy continuations on one GGUF file at one context size (-c)."""

    family: str
    file: str
    type: str
    sha256: str
    n_ctx: int
    continuations: list[Continuation]

    @classmethod
    def from_json(cls, fields: dict) -> FileRecord:
        return cls(**fields | {"continuations": [Continuation(**c) for c in fields["continuations"]]})


def llama_cpp_records(name: str, **match: object) -> list[FileRecord]:
    """The records of RECORDS_DIR/name whose fields equal match, e.g. family="phi3", n_ctx=512."""
    document = json.loads((RECORDS_DIR / name).read_text(encoding="utf-8"))
    records = [FileRecord.from_json(r) for r in document["records"]]
    return [r for r in records if all(getattr(r, key) == value for key, value in match.items())]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()
