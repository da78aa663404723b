"""Images through the backends: read and bounded once (the engine's decoder), sent to a server
as OpenAI's image_url parts with data: URLs, refused in words by a server or a model that takes
text only, and counted for the meter."""

import base64
import io

import pytest
from conftest import remote, run
from PIL import Image

from pagoda.app.backends import (
    ChatMessage,
    ImageCost,
    ImageInput,
    ImagesRefusedError,
    SamplingOptions,
    TokenCount,
)
from pagoda.app.backends.images import (
    LIMITS,
    UnusableImageError,
    count_chat,
    read_image,
    refusal,
)
from pagoda.app.backends.remote.responses_request import responses_request


def png_bytes(width: int = 40, height: int = 30) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (10, 200, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def asking_with(image) -> list[ChatMessage]:
    return [ChatMessage("user", "What colour is this?", images=(image,))]


def test_an_image_is_read_with_its_type_and_size():
    image = read_image(png_bytes(40, 30), "leaf.png")
    assert (image.mime_type, image.width, image.height, image.name) == ("image/png", 40, 30,
                                                                        "leaf.png")


def test_a_damaged_image_is_refused_in_words():
    with pytest.raises(UnusableImageError, match=r"leaf\.png is not a whole PNG image"):
        read_image(png_bytes()[:60], "leaf.png")


def test_an_image_over_the_bound_is_refused_before_it_is_decoded():
    with pytest.raises(UnusableImageError, match="over the"):
        read_image(png_bytes() + bytes(LIMITS.max_bytes), "huge.png")


def test_a_file_that_is_no_image_is_refused_in_words():
    with pytest.raises(UnusableImageError, match=r"notes\.txt is not an image"):
        read_image(b"hello", "notes.txt")
    with pytest.raises(UnusableImageError, match="not a JPEG"):
        read_image(png_bytes(), "named-wrong.jpg")


def test_a_server_is_sent_the_image_as_a_data_url(fake_vllm):
    fake, url = fake_vllm
    image = read_image(png_bytes(), "leaf.png")
    chunks = run(_collect(remote(url), asking_with(image)))
    assert chunks[-1].finished
    (sent,) = fake.requests[-1]["messages"]
    text, part = sent["content"]
    assert text == {"type": "text", "text": "What colour is this?"}
    assert part["type"] == "image_url"
    header, data = part["image_url"]["url"].split(",", 1)
    assert header == "data:image/png;base64"
    assert base64.b64decode(data) == png_bytes()


def test_the_responses_api_gets_the_image_as_an_input_image():
    image = read_image(png_bytes(), "leaf.png")
    body = responses_request("m", asking_with(image), SamplingOptions())
    (item,) = body["input"]
    assert [part["type"] for part in item["content"]] == ["input_text", "input_image"]
    assert item["content"][1]["image_url"] == image.data_url()


def test_a_server_that_takes_text_only_refuses_in_words(pagoda_server):
    """Pagoda's own server takes text only today: its 400 reaches the chat as a sentence
    about the images, not as a sampling setting."""
    backend = remote(f"{pagoda_server.url}/v1")
    assert refusal(backend) is None  # a server is asked: only it can tell
    with pytest.raises(ImagesRefusedError, match="refused this chat's images") as refused:
        run(_collect(backend, asking_with(read_image(png_bytes(), "leaf.png"))))
    assert "takes text only" in str(refused.value)
    assert "sampling" not in str(refused.value)


def test_the_engine_here_says_it_takes_text_only_and_refuses_an_image(local_backend):
    assert local_backend.image_input.accepts is False
    assert "takes text only" in refusal(local_backend)
    with pytest.raises(ImagesRefusedError, match="takes text only"):
        run(_collect(local_backend, asking_with(read_image(png_bytes(), "leaf.png"))))


def test_an_images_cost_follows_its_size_within_the_bounds():
    cost = ImageCost(patch_side=28, max_pixels=1280 * 28 * 28, extra_tokens=2)
    assert cost.tokens(280, 140) == 10 * 5 + 2
    assert cost.tokens(8000, 6000) <= 1280 + 2 < cost.tokens(8000, 6000) + 40
    assert cost.tokens(1, 1) == cost.tokens(2, 2) > 2


class _Counting:
    """What count_chat uses of a backend: its text count and its image cost."""

    model_name = "m"

    def __init__(self, cost: ImageCost | None) -> None:
        self.image_input = ImageInput(True, cost)
        self.counted: list[list[ChatMessage]] = []

    async def count_tokens(self, messages, tools=()):
        self.counted.append(list(messages))
        return TokenCount(10, exact=True)


def test_a_chat_is_counted_with_its_images_at_the_backends_cost():
    image = read_image(png_bytes(280, 140), "leaf.png")
    exact = _Counting(ImageCost(exact=True))
    assert run(count_chat(exact, asking_with(image))) == TokenCount(10 + 52, exact=True)
    assert exact.counted[0][0].images == ()  # the backend counts the text alone
    guessed = run(count_chat(_Counting(None), asking_with(image)))
    assert guessed == TokenCount(10 + 52, exact=False)


async def _collect(backend, messages):
    return [chunk async for chunk in backend.stream(messages, SamplingOptions(max_tokens=4))]
