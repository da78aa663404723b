"""A GGUF model's vision tower found beside it: the one mmproj file in its folder."""

from pagoda.engine.loading.model_files import is_mmproj_file, mmproj_beside


def test_mmproj_files_are_known_by_name():
    assert is_mmproj_file("mmproj-gemma-3-4b-it-f16.gguf")
    assert is_mmproj_file("MMPROJ-F16.GGUF")
    assert not is_mmproj_file("gemma-3-4b-it-Q4_K_M.gguf")
    assert not is_mmproj_file("mmproj-notes.txt")


def test_the_one_mmproj_beside_a_model_is_its_vision_tower(tmp_path):
    model = tmp_path / "gemma-3-4b-it-Q4_K_M.gguf"
    model.write_bytes(b"GGUF")
    assert mmproj_beside(model) is None
    (tmp_path / "mmproj-f16.gguf").write_bytes(b"GGUF")
    assert mmproj_beside(model) == tmp_path / "mmproj-f16.gguf"


def test_two_mmproj_files_beside_a_model_are_not_chosen_between(tmp_path):
    model = tmp_path / "model-Q4_K_M.gguf"
    for name in ("model-Q4_K_M.gguf", "mmproj-f16.gguf", "mmproj-bf16.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    assert mmproj_beside(model) is None
    assert mmproj_beside(tmp_path) is None  # a folder brings its own tower
