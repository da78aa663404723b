"""Take docs/models-hub.png and docs/models-local.png: the Models window's two tabs.

The window is the app's own (ModelLibraryDialog over a ModelLibrary and a LocalModels). This
machine reaches no Hugging Face Hub, so the Hub's answers (a search for Qwen2.5 instruct, the
files of Qwen2.5-7B-Instruct-GGUF with their sizes, a download under way) are given to the
window as the library would give them; whether each file fits is computed by the real estimate
(pagoda.engine.hub.fit) against this machine's memory. The local tab lists a real models folder: sparse
files of the sizes real downloads have, one of them loaded a day ago.

Run under a real X server, e.g. `xvfb-run -a -s "-screen 0 1400x900x24" .venv/bin/python
docs/models_screenshot.py`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("QT_QPA_PLATFORM", "xcb")  # a real window

GB = 1_000_000_000
SEARCH = [("bartowski/Qwen2.5-7B-Instruct-GGUF", 182_311, "qwen2"),
          ("Qwen/Qwen2.5-1.5B-Instruct-GGUF", 151_022, "qwen2"),
          ("Qwen/Qwen2.5-7B-Instruct", 1_245_870, "qwen2"),
          ("bartowski/Qwen2.5-14B-Instruct-GGUF", 98_410, "qwen2"),
          ("Qwen/Qwen2.5-0.5B-Instruct", 902_133, "qwen2")]
REPO = "bartowski/Qwen2.5-7B-Instruct-GGUF"
FILES = [("Q2_K", 3.02), ("Q3_K_M", 3.81), ("Q4_K_M", 4.68), ("Q5_K_M", 5.44), ("Q6_K", 6.25),
         ("Q8_0", 8.10), ("f16", 15.24)]
NUM_PARAMETERS = 7_615_616_512
# The models folder: (path under it, size in bytes, loaded this many hours ago or None).
LOCAL = [("bartowski/Llama-3.2-3B-Instruct-GGUF/Llama-3.2-3B-Instruct-Q4_K_M.gguf",
          2_019_377_696, 26),
         ("Qwen/Qwen2.5-1.5B-Instruct-GGUF/qwen2.5-1.5b-instruct-q4_k_m.gguf", 1_117_320_736,
          None),
         ("Qwen/Qwen2.5-0.5B-Instruct/model.safetensors", 988_097_824, 3),
         ("Qwen/Qwen2.5-0.5B-Instruct/config.json", 0, None),
         ("Qwen/Qwen2.5-0.5B-Instruct/tokenizer.json", 7_031_645, None)]


def hub_tab(dialog) -> None:
    from pagoda.app.components.models.model_library import DOWNLOADING, Download, file_choices
    from pagoda.engine.hub.search import HubFile, HubModel, HubRepo

    dialog.query.setText("qwen2.5 instruct")
    dialog.show_results([HubModel(repo, downloads, 0, repo.endswith("GGUF"),
                                  not repo.endswith("GGUF"), False, arch)
                         for repo, downloads, arch in SEARCH])
    dialog.results.blockSignals(True)  # choosing a result would ask the Hub for its files
    dialog.results.setCurrentRow(0)
    dialog.results.blockSignals(False)
    dialog._repo_id = REPO
    files = [HubFile(f"Qwen2.5-7B-Instruct-{quant}.gguf", int(size * GB), None, None,
                     quant.upper()) for quant, size in FILES]
    dialog.show_files(REPO, file_choices(HubRepo(REPO, "0" * 40, files, NUM_PARAMETERS)))
    dialog.show_status("")
    running = Download(1, REPO, "Qwen2.5-7B-Instruct-Q4_K_M.gguf", DOWNLOADING,
                       done=int(1.93 * GB), total=int(4.68 * GB), speed=41.2e6,
                       seconds_left=67)
    dialog.show_download(running)


async def local_tab(dialog, folder: Path, clock: list[float]) -> None:
    """Each model loaded when LOCAL says, through the library's own note of it."""
    local = dialog.local_panel.library
    for name, _size, hours in LOCAL:
        if hours is not None:
            clock[0] = time.time() - hours * 3600
            path = folder / name
            await local.record_use(str(path.parent if path.suffix == ".safetensors" else path))
    await local.refresh()
    dialog.local_panel.table.setCurrentItem(dialog.local_panel.table.topLevelItem(0))


CONFIG = '{"model_type": "qwen2", "torch_dtype": "bfloat16"}'


def make_folder(folder: Path) -> None:
    for name, size, _hours in LOCAL:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.name == "config.json":
            path.write_text(CONFIG)
            continue
        with open(path, "wb") as file:
            file.truncate(size)  # sparse: the size without the disk


def main() -> int:
    from screenshot import start_app

    from pagoda.app.components.models.local_models import LocalModels
    from pagoda.app.components.models.model_library import ModelLibrary
    from pagoda.app.qt.models.model_library_dialog import ModelLibraryDialog

    _app, loop = start_app()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "models"
        make_folder(folder)
        clock = [time.time()]
        library, local = ModelLibrary(folder), LocalModels(folder, clock=lambda: clock[0])
        dialog = ModelLibraryDialog(library, lambda path: None, local_models=local)
        dialog.resize(980, 700)
        dialog.move(0, 0)
        dialog.show()
        with loop:
            hub_tab(dialog)
            loop.run_until_complete(asyncio.sleep(0.3))
            dialog.grab().save(str(ROOT / "docs" / "models-hub.png"))
            dialog.tabs.setCurrentIndex(1)
            loop.run_until_complete(local_tab(dialog, folder, clock))
            loop.run_until_complete(asyncio.sleep(0.3))
            dialog.grab().save(str(ROOT / "docs" / "models-local.png"))
            dialog.close()
            library.close()
            local.close()
    print("saved docs/models-hub.png and docs/models-local.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
