"""A GGUF file of N layers made M layers deep by repeating its own layers (layer i is layer
i mod N), every tensor's blocks copied as the file holds them: the full-depth file of a shape
whose float16 original would not fit on the disk (a 48-layer Qwen3-30B-A3B is a 60 GB float16
file on the way to its 18 GB Q4_K_M).

Not a test: issue 53's full-size line ("a 30B-A3B-shaped Q4_K_M at all 48 layers opens on this
24 GB machine and decodes") runs on what this writes from bench/qwen3_moe_file.py's 4-layer
Q4_K_M. The layers repeat, so the text is noise as it is at 4; what is measured is bytes and
speed.

    python bench/deepen_gguf.py IN.gguf OUT.gguf --layers 48
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import gguf
import numpy as np

_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")


def deepen(source: Path, target: Path, layers: int) -> None:
    reader = gguf.GGUFReader(source)
    arch = str(reader.fields["general.architecture"].contents())
    count_key = f"{arch}.block_count"
    have = int(reader.fields[count_key].contents())
    writer = gguf.GGUFWriter(target, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = layers if name == count_key else field.contents()
        kind = field.types[0]
        sub = field.types[1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, kind, sub_type=sub)
    by_name = {t.name: t for t in reader.tensors}
    order = [t.name for t in reader.tensors if not _LAYER.match(t.name)]
    per_layer = [m.group(2) for t in reader.tensors
                 if (m := _LAYER.match(t.name)) and m.group(1) == "0"]
    order += [f"blk.{i}.{rest}" for i in range(layers) for rest in per_layer]
    for name in order:
        match = _LAYER.match(name)
        tensor = by_name[name if not match else f"blk.{int(match.group(1)) % have}.{match.group(2)}"]
        data = np.asarray(tensor.data)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--layers", type=int, required=True)
    args = parser.parse_args()
    deepen(args.source, args.target, args.layers)
    print(args.target, args.target.stat().st_size)


if __name__ == "__main__":
    main()
