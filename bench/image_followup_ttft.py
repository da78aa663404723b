"""A follow-up question about an image already in the chat: its time to first token against the
first question's (which encodes the image), in the same engine and after a restart (the disk
tier), on a Gemma 3 4B-shaped model with random weights: the SigLIP-400M tower (27 layers of
1,152, 896 x 896 pixels, 4,096 patches pooled to 256 tokens) and the 4B's language model widths
(2,560, MLP 10,240, 8 query heads and 4 KV heads of 256, windows of 1,024) with fewer layers
(--layers; the 4B has 34). The vocabulary is the tests' Gemma 3 tokenizer's (49,155 tokens; the
4B's 262,208 only widen the last position's logits).

Each round is a new chat about a new 1280 x 720 photo (PNG), which each turn decodes as the
server does from the request (a chat's turns each carry the image): the first question, its
32-token reply, then a follow-up in the same engine; then the engine is closed and a new one
over the same disk cache answers another follow-up. Each new engine first answers a prompt of
its own (and the first one encodes an image of its own): the times are the turns', not an
engine's first calls. The bench asserts that a follow-up encodes no image (the tower's calls
counted) and that its prompt is read from the cache past the image.

    PYTHONPATH=. python bench/image_followup_ttft.py [--rounds 3] [--layers 8]
        [--vision-dtype auto] [--threads 2]
"""

from __future__ import annotations

import argparse
import gc
import io
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers
from cpu_info import cpu_name
from PIL import Image
from safetensors.torch import save_file

from pagoda.engine import LLM, SamplingParams
from pagoda.engine.multimodal.image_processing import image_processor
from pagoda.engine.multimodal.images import decode_image_bytes
from tests.engine.tiny_vision import GEMMA3_IMAGE_TOKENS, gemma3_tokenizer

SO400M = {"hidden_size": 1152, "intermediate_size": 4304, "num_attention_heads": 16,
          "num_hidden_layers": 27, "image_size": 896, "patch_size": 14, "layer_norm_eps": 1e-6,
          "vision_use_head": False}
GEMMA3_4B_TEXT = {"hidden_size": 2560, "intermediate_size": 10240, "num_attention_heads": 8,
                  "num_key_value_heads": 4, "head_dim": 256, "query_pre_attn_scalar": 256,
                  "sliding_window": 1024, "max_position_embeddings": 8192}
FIRST_TOKEN = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
REPLY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


def save_model(folder: Path, layers: int) -> Path:
    """A Gemma 3 folder of the 4B's shape (`layers` text layers), random weights in bf16:
    matrices N(0, 0.02), SigLIP's LayerNorms at 1 and Gemma's (1 + w) norms at w = 0."""
    tokenizer = gemma3_tokenizer()
    start, image, end = tokenizer.convert_tokens_to_ids(list(GEMMA3_IMAGE_TOKENS))
    config = transformers.Gemma3Config(
        text_config=GEMMA3_4B_TEXT | {"num_hidden_layers": layers,
                                      "vocab_size": len(tokenizer)},
        vision_config=SO400M, mm_tokens_per_image=256, image_token_index=image,
        boi_token_index=start, eoi_token_index=end)
    with torch.device("meta"):
        shapes = transformers.Gemma3ForConditionalGeneration(config).state_dict()
    gen = torch.Generator().manual_seed(0)
    tensors = {name: _random(name, meta.shape, gen) for name, meta in shapes.items()
               if name != "lm_head.weight"}  # tied to the embedding
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _random(name: str, shape: torch.Size, gen: torch.Generator) -> torch.Tensor:
    if "layer_norm" in name or ("layernorm" in name and "vision" in name):
        fill = 1.0 if name.endswith("weight") else 0.0
        return torch.full(shape, fill, dtype=torch.bfloat16)
    if "norm" in name or name.endswith("bias"):
        return torch.zeros(shape, dtype=torch.bfloat16)
    return (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)


def photo_png(seed: int) -> bytes:
    gen = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (720, 1280, 3), generator=gen, dtype=torch.uint8)
    out = io.BytesIO()
    Image.fromarray(data.numpy(), "RGB").save(out, format="PNG")
    return out.getvalue()


class CountingEncoder:
    """The tower's encoder, counting the images it encodes."""

    def __init__(self, encoder) -> None:
        self.encoder, self.shape, self.images = encoder, encoder.shape, 0

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        self.images += pixels.shape[0]
        return self.encoder(pixels)


class Chat:
    """An engine and the token ids of a chat's turns about one image."""

    def __init__(self, folder: Path, disk: Path, args: argparse.Namespace) -> None:
        self.folder, self.disk, self.args = folder, disk, args
        self.turns = 0
        self.open(warm_up=0)

    def open(self, warm_up: int) -> None:
        """A new engine over the folder and the disk cache, which first answers a prompt of
        its own (warm_up: its first token)."""
        self.llm = LLM(str(self.folder), num_threads=self.args.threads, max_model_len=4096,
                       disk_cache_dir=self.disk, vision_dtype=self.args.vision_dtype)
        tower = self.llm.engine.runner.image_tower
        self.counter = tower.encoder = CountingEncoder(tower.encoder)
        self.tokenizer = self.llm.engine.tokenizer
        start, image, end = (tower.start_token_id, tower.image_token_id, tower.end_token_id)
        self.image_tokens = [start, *[image] * tower.tokens_per_image, end]
        self.processor = image_processor(tower)
        self.llm.generate([[warm_up] + list(range(1000, 1256))], FIRST_TOKEN)

    def words(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def question(self) -> list[int]:
        return ([self.tokenizer.bos_token_id, *self.words("User: Here is a photo I took."),
                 *self.image_tokens, *self.words(" What is in it, and where was it taken?"
                                                 " Assistant:")])

    def ttft(self, ids: list[int], png: bytes) -> tuple[float, int, int]:
        """Time to the first token of a turn whose image arrives as PNG bytes (decoded here,
        as the server decodes a request's image), the images encoded, the tokens cached."""
        encoded = self.counter.images
        self.turns += 1
        began = time.perf_counter()
        image = decode_image_bytes(png, "image/png", "the photo")
        engine = self.llm.engine
        engine.add_request(f"turn-{self.turns}", ids, FIRST_TOKEN, images=[image])
        while engine.has_unfinished_requests():
            done = [out for out in engine.step() if out.finished]
        took = time.perf_counter() - began
        return took, self.counter.images - encoded, done[0].num_cached_tokens

    def reply(self, ids: list[int], png: bytes) -> list[int]:
        engine = self.llm.engine
        self.turns += 1
        image = decode_image_bytes(png, "image/png", "the photo")
        engine.add_request(f"turn-{self.turns}", ids, REPLY, images=[image])
        while engine.has_unfinished_requests():
            done = [out for out in engine.step() if out.finished]
        return list(done[0].outputs[0].token_ids)

    def restart(self, warm_up: int) -> None:
        self.close()
        gc.collect()
        self.open(warm_up)

    def close(self) -> None:
        self.llm.engine.close()
        del self.llm


def image_handling_ms(chat: Chat, png: bytes) -> tuple[float, float]:
    """What a turn spends on its image before the engine's step: decoding the PNG (and hashing
    its pixels), and resizing it to the tower's pixels (best of 3 each)."""
    decode = resize = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        image = decode_image_bytes(png, "image/png", "the photo")
        decoded = time.perf_counter()
        chat.processor(image.image)
        decode = min(decode, decoded - began)
        resize = min(resize, time.perf_counter() - decoded)
    return decode * 1e3, resize * 1e3


def rounds(folder: Path, disk: Path, args: argparse.Namespace,
           times: dict[str, list[float]]) -> None:
    """Each round's three turns into times."""
    chat = Chat(folder, disk, args)
    try:
        play(chat, args.rounds, times)
    finally:
        chat.close()


def play(chat: Chat, rounds: int, times: dict[str, list[float]]) -> None:
    chat.ttft(chat.question(), photo_png(0))  # the tower's own first call
    print(f"tower dtype {chat.counter.encoder.positions.dtype}", flush=True)
    for r in range(rounds):
        png = photo_png(100 + r)
        question = chat.question()
        first, encoded, _ = chat.ttft(question, png)
        assert encoded == 1, f"the first question encoded {encoded} images"
        turn = question + chat.reply(question, png)
        image_end = question.index(chat.image_tokens[-1])
        follow, encoded, cached = chat.ttft(
            turn + chat.words(" User: And what colour is the sky in it? Assistant:"), png)
        assert encoded == 0, f"the follow-up encoded {encoded} images"
        assert cached > image_end, f"the follow-up read {cached} tokens from the cache"
        decode_ms, resize_ms = image_handling_ms(chat, png)
        chat.restart(warm_up=r + 1)
        restarted, encoded, restart_cached = chat.ttft(
            turn + chat.words(" User: Would it look better in black and white? Assistant:"),
            png)
        assert encoded == 0, f"the follow-up after a restart encoded {encoded} images"
        assert restart_cached > image_end, (
            f"the follow-up after a restart read {restart_cached} tokens from the cache")
        for name, took in zip(times, (first, follow, restarted), strict=True):
            times[name].append(took)
        print(f"round {r + 1}: first question {first * 1e3:.0f} ms ({len(question)} tokens), "
              f"follow-up {follow * 1e3:.0f} ms ({cached} cached), after a restart "
              f"{restarted * 1e3:.0f} ms ({restart_cached} cached); per turn the image's "
              f"decode {decode_ms:.1f} ms, resize {resize_ms:.1f} ms (load average "
              f"{os.getloadavg()[0]:.2f})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vision-dtype", default="auto")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/pagoda-gemma3-4b-shape"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folder = args.dir / f"gemma3-4b-shape-{args.layers}l"
    if not (folder / "model.safetensors").exists():
        save_model(folder, args.layers)
    times: dict[str, list[float]] = {"first question": [], "follow-up": [],
                                     "follow-up after a restart": []}
    with tempfile.TemporaryDirectory() as disk:
        rounds(folder, Path(disk), args, times)
    print(f"\nCPU: {cpu_name()}; {args.threads} threads; Gemma 3 4B widths, {args.layers} text "
          f"layers, SigLIP-400M tower ({args.vision_dtype}); {args.rounds} rounds")
    first = statistics.mean(times["first question"])
    print("| turn | mean ms | median ms | / first question | rounds |")
    print("| --- | --- | --- | --- | --- |")
    for name, took in times.items():
        print(f"| {name} | {statistics.mean(took) * 1e3:.0f} | "
              f"{statistics.median(took) * 1e3:.0f} | {statistics.mean(took) / first:.3f}x | "
              f"{', '.join(f'{t * 1e3:.0f}' for t in took)} |")


if __name__ == "__main__":
    main()
