"""Take docs/images.png from the real window: a chat with an image on its message, answered by
the engine in this process, the context meter counting the image's tokens.

No trained model that sees images can be had here (the package registry holds none), so the
model is Gemma 3 in shape and random in its weights: a Gemma 3 image tower and projector with
Gemma 3's image geometry (896-pixel images in 14-pixel patches, pooled to 256 image tokens, as
every released Gemma 3 from 4B up), over a two-layer text model with the bundled model's
tokenizer. The image really goes through the tower, and the meter counts it at Gemma 3's cost;
the reply is noise, and the model's folder is named so in the window's model picker.
The chart is drawn here with Pillow.

Run under a real X server: `xvfb-run -a -s "-screen 0 1400x900x24" .venv/bin/python
docs/images_screenshot.py`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs"))
os.environ.setdefault("QT_QPA_PLATFORM", "xcb")

from feature_screenshots import until
from screenshot import start_app

MODEL_FOLDER = "gemma3-shaped-random-weights"
QUESTION = "Which month burned the most oil?"
MONTHS = ("Sep", "Oct", "Nov", "Dec", "Jan", "Feb")
LITRES = (1234, 1710, 2165, 2480, 2390, 1905)
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
BOLD = "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf"


def gemma3_shaped_model(folder: Path) -> Path:
    """A Gemma 3 folder as Google lays one out, with Gemma 3's image geometry and random
    weights (the tests' tiny widths: it loads in a second)."""
    import torch
    import transformers

    from tests.engine.tiny_vision import (
        GEMMA3_IMAGE_TOKENS,
        GEMMA3_TEXT,
        GEMMA3_VISION,
        gemma3_tokenizer,
        save_gemma3_as_released,
    )

    tokenizer = gemma3_tokenizer()
    start, image, end = tokenizer.convert_tokens_to_ids(list(GEMMA3_IMAGE_TOKENS))
    torch.manual_seed(57)
    config = transformers.Gemma3Config(
        text_config=GEMMA3_TEXT | {"vocab_size": len(tokenizer),
                                   "max_position_embeddings": 8192},
        vision_config=GEMMA3_VISION | {"image_size": 896, "patch_size": 14},
        mm_tokens_per_image=256, image_token_index=image, boi_token_index=start,
        eoi_token_index=end)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # the projection and the norms start at zeros: draw them
        for name, parameter in model.named_parameters():
            if "multi_modal_projector" in name or "norm" in name:
                parameter.normal_(0, 0.2)
    return save_gemma3_as_released(model, folder)


def oil_chart(path: Path) -> Path:
    """A bar chart of the lighthouse lamp's oil by month, drawn with Pillow."""
    from PIL import Image, ImageDraw, ImageFont

    width, height, left, bottom, top = 720, 480, 80, 410, 90
    chart = Image.new("RGB", (width, height), "#fbfaf6")
    draw = ImageDraw.Draw(chart)
    title, label = ImageFont.truetype(BOLD, 24), ImageFont.truetype(FONT, 16)
    draw.text((left, 28), "Lamp oil burned, litres per month", font=title, fill="#23313f")
    scale = (bottom - top) / 2500
    for litres in range(0, 2501, 500):
        y = bottom - litres * scale
        draw.line((left, y, width - 40, y), fill="#dcd8cc", width=1)
        draw.text((left - 12, y), f"{litres:,}", font=label, fill="#5b6670", anchor="rm")
    slot = (width - 40 - left) / len(MONTHS)
    for i, (month, litres) in enumerate(zip(MONTHS, LITRES, strict=True)):
        x0 = left + i * slot + slot * 0.18
        x1 = x0 + slot * 0.64
        colour = "#c8553d" if litres == max(LITRES) else "#2f6f8f"
        draw.rounded_rectangle((x0, bottom - litres * scale, x1, bottom), radius=6, fill=colour,
                               corners=(True, True, False, False))
        draw.text(((x0 + x1) / 2, bottom - litres * scale - 8), f"{litres:,}", font=label,
                  fill="#23313f", anchor="mb")
        draw.text(((x0 + x1) / 2, bottom + 12), month, font=label, fill="#23313f", anchor="mt")
    draw.line((left, bottom, width - 40, bottom), fill="#23313f", width=2)
    chart.save(path)
    return path


async def image_chat(window, chart: Path) -> None:
    from pagoda.app.store import SamplingSettings

    await window.restore()
    await until(lambda: window.host.is_ready)
    window.chat_tabs.close_tab(0)  # the empty chat restore() opened
    chat = await window.db.create_conversation(
        title="Oil by month", sampling=SamplingSettings(temperature=0.0, max_tokens=16))
    tab = await window.chat_tabs.open_conversation(chat.id)
    window.settings_dock.setVisible(False)  # the chat is the picture
    session = window.controllers[chat.id].session
    await session.files.attach([str(chart)])
    tab.composer.send_requested.emit(QUESTION)
    await asyncio.sleep(0.5)
    await until(lambda: not session.is_streaming)
    await asyncio.sleep(1.0)  # the meter's count of the finished chat


def main() -> int:
    from pagoda.app.components.shared.async_store import AsyncStore
    from pagoda.app.components.shared.connections import ConnectionKeys
    from pagoda.app.qt.main_window import MainWindow
    from pagoda.app.qt.models.engine_host import EngineHost
    from pagoda.app.store import ConversationStore

    _app, loop = start_app()
    out = ROOT / "docs" / "images.png"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        os.environ["PAGODA_KV_CACHE_DIR"] = str(folder / "kv-blocks")
        model = gemma3_shaped_model(folder / MODEL_FOLDER)
        chart = oil_chart(folder / "oil-by-month.png")
        host = EngineHost()
        window = MainWindow(AsyncStore(ConversationStore.open(folder / "shot.db")), host,
                            connection_keys=ConnectionKeys.in_memory())
        window.resize(1120, 640)
        window.move(0, 0)
        window.show()
        host.load(str(model))
        with loop:
            loop.run_until_complete(image_chat(window, chart))
            window.grab().save(str(out))
            window.close()
            window.db.close()
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
