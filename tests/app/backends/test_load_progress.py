"""The window's engine says how its load goes: each step as it begins, and the model's building
by the share of its weights the layers have taken, then the engine's preparation. The engine's
parts are stood in for: the loader reports its steps, the engine takes the weights one by one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import pagoda.engine as engine
import pagoda.engine.loading.loader
import pagoda.engine.loading.model_info
from pagoda.app.backends.services.local_engine import (
    LOAD_STEPS,
    EngineConfig,
    LoadProgress,
    make_local_engine,
)
from pagoda.engine.loading.lazy_weights import LazyWeights

LAYERS = 10


class _Layers:
    """An engine that builds its layers from the weights as the real one does: each taken,
    then deleted, then the mapping cleared; what it heard meanwhile is kept."""

    heard: list[LoadProgress]

    def __init__(self, config, loaded, release_weights) -> None:
        for name in [n for n in loaded.weights if n.startswith("model.")]:
            assert loaded.weights[name] == f"decoded {name}"
            del loaded.weights[name]
        loaded.weights.clear()
        self.heard_after_building = list(self.heard)


@pytest.fixture
def heard(monkeypatch) -> list[LoadProgress]:
    told: list[LoadProgress] = []

    def load_model(model, dtype, on_progress, quantization, mmproj=None, mtp=True):
        for done, words in enumerate(("reading the model file", "reading the tokenizer",
                                      "decoding the weights", "decoding the weights")):
            on_progress(words, done, 3)
        names = [f"model.layers.{i}.weight" for i in range(LAYERS)]
        return SimpleNamespace(weights=LazyWeights(names, lambda name: f"decoded {name}"))

    _Layers.heard = told
    monkeypatch.setattr(pagoda.engine.loading.loader, "load_model", load_model)
    monkeypatch.setattr(pagoda.engine.loading.model_info, "check_model_fits", lambda model, config: None)
    monkeypatch.setattr(engine, "LLMEngine", _Layers)
    monkeypatch.setattr(engine, "AsyncEngine", lambda build: build())
    built = make_local_engine("model.gguf", EngineConfig(device="cpu"), told.append)
    assert built.heard_after_building == told
    return told


def test_each_step_is_told_as_it_begins_in_order(heard):
    steps = [progress.step for progress in heard]
    assert steps == sorted(steps)
    assert [LOAD_STEPS[step] for step in dict.fromkeys(steps)] == list(LOAD_STEPS[1:])


def test_the_models_building_is_told_by_the_share_of_weights_taken(heard):
    building = [progress.fraction for progress in heard if progress.step == 4]
    assert building[0] in (None, 0.0)
    shares = [fraction for fraction in building if fraction is not None]
    assert shares == sorted(shares) and shares[-1] == (LAYERS - 1) / LAYERS
    assert len(shares) >= LAYERS  # one per weight here: each is a whole percent apart
    assert heard[-1] == LoadProgress(5)  # every weight taken: the engine is prepared next


def test_a_ggufs_vision_tower_beside_it_is_loaded_with_it(monkeypatch, tmp_path):
    """The one mmproj file in a GGUF model's folder, as LM Studio lays models out."""
    model = tmp_path / "gemma-3-4b-it-Q4_K_M.gguf"
    mmproj = tmp_path / "mmproj-gemma-3-4b-it-f16.gguf"
    for path in (model, mmproj):
        path.write_bytes(b"GGUF")
    asked = []

    def load_model(model, dtype, on_progress, quantization, mmproj=None, mtp=True):
        asked.append(mmproj)
        raise RuntimeError("stop here: only the files asked for are checked")

    monkeypatch.setattr(pagoda.engine.loading.loader, "load_model", load_model)
    monkeypatch.setattr(pagoda.engine.loading.model_info, "check_model_fits",
                        lambda model, config: None)
    monkeypatch.setattr(engine, "AsyncEngine", lambda build: build())
    with pytest.raises(RuntimeError, match="stop here"):
        make_local_engine(str(model), EngineConfig(device="cpu"), lambda progress: None)
    assert asked == [mmproj]
