"""A bounded check of a GGUF file's header before gguf-py's reader sees it.

gguf-py's `GGUFReader` believes every count and length the file states: it loops over an array's
claimed elements and keeps a Python object for each, so a 120-byte file that claims 2^40
elements takes all memory before anything fails. This scan walks the same layout (counts, keys,
values, tensor infos) with plain offsets, checks each count and length against the bytes the file
has left, and caps what becomes Python objects, so that a damaged or crafted file is refused in
milliseconds, naming the field at fault.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from pagoda.engine.errors import MalformedGGUFError

SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
# llama.cpp's own limits: 4 dimensions per tensor (GGML_MAX_DIMS).
MAX_DIMS = 4
# What gguf-py keeps a Python object for, beyond what the file's size already bounds. Real files
# hold ~50 keys, a few thousand tensors and at most ~10^6 strings (a 256k vocabulary and its
# merges); each object costs gguf-py a few hundred bytes.
MAX_KEYS = 1 << 16
MAX_TENSORS = 1 << 16
MAX_ITEMS = 1 << 22
MAX_NESTING = 4
_HEADER_BYTES = 24  # magic, version, tensor count, key count

# GGUF value types: their sizes in bytes; strings (8) and arrays (9) are sized by their contents.
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
# Smallest encodings, to bound a claimed count by the bytes left: a key is its length (8), its
# type (4) and one byte of value; a tensor info a name length, n_dims, type and offset.
_MIN_KEY_BYTES = 8 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8
_MIN_ARRAY_BYTES = 4 + 8


@dataclass(slots=True)
class GGUFHeader:
    """What the scan read on its way: the file's general.architecture (None when it names none)
    and each tensor's type, enough to tell whether Pagoda runs the file."""

    architecture: str | None = None
    tensor_types: dict[str, GGMLQuantizationType] = field(default_factory=dict)


def check_gguf_header(path: Path) -> GGUFHeader:
    """Raise MalformedGGUFError, naming path and the field, unless every count, length, tensor
    shape and tensor extent in path's header fits in the file."""
    with open(path, "rb") as file:
        size = file.seek(0, 2)
        if size < _HEADER_BYTES:
            raise _refusal(path, f"it is {size} bytes long, shorter than a GGUF header")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _HeaderScan(path, data, size).run()


class _HeaderScan:
    def __init__(self, path: Path, data: mmap.mmap, size: int) -> None:
        self.path, self.data, self.size = path, data, size
        self.offset = 0
        self.order = "<"
        self.items = 0
        self.alignment = DEFAULT_ALIGNMENT
        self.header = GGUFHeader()

    def run(self) -> GGUFHeader:
        self._read_magic_and_version()
        tensor_count = self._count("the tensor count", _MIN_TENSOR_INFO_BYTES, MAX_TENSORS)
        key_count = self._count("the metadata key count", _MIN_KEY_BYTES, MAX_KEYS)
        for index in range(key_count):
            self._read_key_value(index)
        tensors = [self._read_tensor_info(index) for index in range(tensor_count)]
        data_start = _aligned(self.offset, self.alignment)
        for name, nbytes, tensor_offset in tensors:
            self._check_tensor_extent(name, nbytes, data_start + tensor_offset)
        return self.header

    def _read_magic_and_version(self) -> None:
        if self.data[:4] != b"GGUF":
            raise _refusal(self.path, "it does not start with the GGUF magic bytes")
        version = struct.unpack_from("<I", self.data, 4)[0]
        if version & 0xFFFF == 0:  # written on a big-endian machine
            self.order = ">"
            version = struct.unpack_from(">I", self.data, 4)[0]
        if version not in SUPPORTED_VERSIONS:
            raise _refusal(self.path, f"its GGUF version is {version}; Pagoda reads versions "
                                      f"{' and '.join(map(str, SUPPORTED_VERSIONS))}")
        self.offset = 8

    def _read_key_value(self, index: int) -> None:
        key = self._string(f"the name of metadata key {index}")
        label = f"metadata key {key!r}"
        value_type = self._unsigned(4, f"the type of {label}")
        if key == "general.alignment" and value_type == _UINT32:
            self._read_alignment(label)
        elif key == "general.architecture" and value_type == _STRING:
            self.header.architecture = self._string(label)
        else:
            self._skip_value(value_type, label, depth=0)

    def _read_alignment(self, label: str) -> None:
        alignment = self._unsigned(4, label)
        if alignment == 0 or alignment & (alignment - 1):
            raise _refusal(self.path, f"{label} is {alignment}, not a power of two")
        self.alignment = alignment

    def _skip_value(self, value_type: int, label: str, depth: int) -> None:
        if value_type in _SCALAR_BYTES:
            self._take(_SCALAR_BYTES[value_type], label)
        elif value_type == _STRING:
            self._string(label)
        elif value_type == _ARRAY:
            self._skip_array(label, depth)
        else:
            raise _refusal(self.path, f"{label} has the unknown value type {value_type}")

    def _skip_array(self, label: str, depth: int) -> None:
        if depth >= MAX_NESTING:
            raise _refusal(self.path, f"{label} nests arrays more than {MAX_NESTING} deep")
        item_type = self._unsigned(4, f"the item type of {label}")
        if item_type in _SCALAR_BYTES:
            count = self._unsigned(8, f"the length of {label}")
            self._take(count * _SCALAR_BYTES[item_type], f"{label} ({count} items)")
            return
        if item_type not in (_STRING, _ARRAY):
            raise _refusal(self.path, f"{label} holds items of the unknown type {item_type}")
        least = 8 if item_type == _STRING else _MIN_ARRAY_BYTES
        count = self._count(f"the length of {label}", least, MAX_ITEMS - self.items)
        self.items += count
        if item_type == _STRING:
            self._skip_strings(count, label)
            return
        for index in range(count):
            self._skip_array(f"item {index} of {label}", depth + 1)

    def _skip_strings(self, count: int, label: str) -> None:
        """A vocabulary's strings, without building a label for each (49k of them)."""
        length_format, offset, size = self.order + "Q", self.offset, self.size
        for index in range(count):
            if offset + 8 <= size:
                offset += 8 + struct.unpack_from(length_format, self.data, offset)[0]
                if offset <= size:
                    continue
            raise _refusal(self.path, f"item {index} of {label} runs past the file's end")
        self.offset = offset

    def _read_tensor_info(self, index: int) -> tuple[str, int, int]:
        raw_name = self._string(f"the name of tensor {index}")
        name = f"tensor {raw_name!r}"
        n_dims = self._unsigned(4, f"the number of dimensions of {name}")
        if n_dims > MAX_DIMS:
            raise _refusal(self.path, f"{name} claims {n_dims} dimensions; GGUF allows at most "
                                      f"{MAX_DIMS}")
        dims = [self._unsigned(8, f"dimension {d} of {name}") for d in range(n_dims)]
        kind = self._tensor_type(name)
        self.header.tensor_types[raw_name] = kind
        tensor_offset = self._unsigned(8, f"the data offset of {name}")
        block_size, type_size = GGML_QUANT_SIZES[kind]
        if dims and dims[0] % block_size:
            raise _refusal(self.path, f"{name} has rows of {dims[0]} values, not a whole number "
                                      f"of {kind.name} blocks ({block_size} values)")
        return name, math.prod(dims) * type_size // block_size, tensor_offset

    def _tensor_type(self, name: str) -> GGMLQuantizationType:
        raw = self._unsigned(4, f"the type of {name}")
        try:
            kind = GGMLQuantizationType(raw)
        except ValueError:
            kind = None
        if kind not in GGML_QUANT_SIZES:
            raise _refusal(self.path, f"{name} has the unknown tensor type {raw}")
        return kind

    def _check_tensor_extent(self, name: str, nbytes: int, start: int) -> None:
        if start + nbytes > self.size:
            raise _refusal(self.path, f"{name}'s data ({nbytes} bytes at offset {start}) runs "
                                      f"past the file's end at {self.size} bytes")

    def _count(self, label: str, least_bytes: int, limit: int) -> int:
        """A count of things each at least least_bytes long, at most limit of them."""
        count = self._unsigned(8, label)
        if count > limit:
            raise _refusal(self.path, f"{label} is {count}, more than the {limit} Pagoda accepts")
        if count * least_bytes > self.size - self.offset:
            raise _refusal(self.path, f"{label} is {count}, more than the "
                                      f"{self.size - self.offset} bytes left in the file can hold")
        return count

    def _string(self, label: str) -> str:
        length = self._unsigned(8, f"the length of {label}")
        start = self._take(length, label)
        return self.data[start:start + min(length, 200)].decode("utf-8", errors="replace")

    def _unsigned(self, width: int, label: str) -> int:
        start = self._take(width, label)
        return struct.unpack_from(self.order + ("I" if width == 4 else "Q"), self.data, start)[0]

    def _take(self, nbytes: int, label: str) -> int:
        """The offset of the next nbytes, which must lie inside the file (Python ints: a claimed
        size never overflows)."""
        left = self.size - self.offset
        if nbytes > left:
            raise _refusal(self.path, f"{label} needs {nbytes} bytes, more than the {left} left "
                                      "in the file")
        start = self.offset
        self.offset += nbytes
        return start


def _aligned(offset: int, alignment: int) -> int:
    return -(-offset // alignment) * alignment


def _refusal(path: Path, detail: str) -> MalformedGGUFError:
    return MalformedGGUFError(
        f"{path} is not a complete GGUF file: {detail}. It may have been cut short, damaged or "
        "crafted: re-download it, or choose another file.")
