"""A chat with an image through the real `openai` client, on a Gemma 3 that takes images: the
server reads the image_url part, the prompt is transformers' processor's, and the reply is
transformers' greedy one; the same image in the next turn comes from the prefix cache; a bad
image is a 400 naming the part, never a crash."""

import base64
import concurrent.futures
import copy
import dataclasses
import io
import time

import httpx
import openai
import pytest
import torch
import transformers
from PIL import Image
from transformers.convert_slow_tokenizer import bytes_to_unicode

from pagoda.engine import LLM
from pagoda.engine.async_engine import AsyncEngine
from pagoda.engine.server.api import build_app
from pagoda.engine.server.remote_images import RemoteImages
from pagoda.engine.server.runner import ServerThread
from pagoda.engine.server.served import ServedModel
from tests.engine.server.image_host import image_host
from tests.engine.tiny_vision import (
    GEMMA3_IMAGE_TOKENS,
    GEMMA3_TOKENS_PER_IMAGE,
    gemma3_tokenizer,
    save_gemma3_as_released,
    tiny_gemma3_vision,
)

MODEL = "tiny-gemma3-vision"
TOKENS = 6


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_gemma3_as_released(tiny_gemma3_vision(), tmp_path_factory.mktemp("gemma3"))


@pytest.fixture(scope="module")
def serving(folder):
    """The server, and the model it serves (a list of one, so a test can serve it with other
    options: it is looked up per request)."""
    engine = AsyncEngine(engine=LLM(str(folder), num_threads=1, num_kv_blocks=64).engine)
    served = [ServedModel(MODEL, engine, engine.max_model_len)]
    running = ServerThread(build_app(lambda: served[0])).start()
    yield running, served
    running.stop()
    engine.shutdown()


@pytest.fixture(scope="module")
def server(serving):
    return serving[0]


@pytest.fixture
def fetching(serving):
    """Serve with a remote-image policy (RemoteImages) until the test ends."""
    served = serving[1]
    plain = served[0]

    def serve_with(policy: RemoteImages) -> None:
        served[0] = dataclasses.replace(plain, remote_images=policy)

    yield serve_with
    served[0] = plain


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                         timeout=60)


def photo(seed: int) -> Image.Image:
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (40, 50, 3), generator=gen, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy())


def png_bytes(image: Image.Image) -> bytes:
    png = io.BytesIO()
    image.save(png, format="PNG")
    return png.getvalue()


def data_url(image: Image.Image) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode()


def ask(client, image: Image.Image | str, text: str = "the cat sat on the mat", history=()):
    """A chat about an image (or the image at a URL)."""
    url = image if isinstance(image, str) else data_url(image)
    content = [{"type": "image_url", "image_url": {"url": url}},
               {"type": "text", "text": text}]
    return client.chat.completions.create(
        model=MODEL, messages=[*history, {"role": "user", "content": content}],
        max_tokens=TOKENS, temperature=0, logprobs=True)


# GPT-2's byte-level tokens spell each byte as a printable character.
_BYTE_OF = {char: byte for byte, char in bytes_to_unicode().items()}


def token_bytes(token: str) -> bytes:
    return bytes(_BYTE_OF[char] for char in token)


@torch.inference_mode()
def transformers_reply(folder, image: Image.Image, text: str) -> tuple[int, list[bytes]]:
    """transformers' own processor and greedy generation on the same chat: the prompt's length
    and each reply token's bytes."""
    tokenizer = copy.deepcopy(gemma3_tokenizer())
    # Gemma's own tokenizer names its image tokens; the tiny one lists them only.
    for name, token in zip(("boi_token", "image_token", "eoi_token"), GEMMA3_IMAGE_TOKENS,
                           strict=True):
        object.__setattr__(tokenizer, name, token)
        object.__setattr__(tokenizer, f"{name}_id", tokenizer.convert_tokens_to_ids(token))
    start = GEMMA3_IMAGE_TOKENS[0]
    processor = transformers.Gemma3Processor(
        transformers.Gemma3ImageProcessorPil(size={"height": 32, "width": 32}), tokenizer,
        image_seq_length=GEMMA3_TOKENS_PER_IMAGE)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": start + text}], tokenize=False, add_generation_prompt=True)
    inputs = processor(text=prompt, images=[image], return_tensors="pt",
                       add_special_tokens=False)
    model = transformers.Gemma3ForConditionalGeneration.from_pretrained(
        folder, attn_implementation="eager").eval()
    out = model.generate(**inputs, max_new_tokens=TOKENS, do_sample=False)
    prompt_tokens = inputs["input_ids"].shape[1]
    return prompt_tokens, [token_bytes(t) for t in
                           tokenizer.convert_ids_to_tokens(out[0, prompt_tokens:].tolist())]


def test_a_chat_with_an_image_gets_transformers_prompt_and_reply(client, folder):
    """The random tiny model's reply is bytes that spell no text: its tokens are compared."""
    reply = ask(client, photo(0))
    prompt_tokens, tokens = transformers_reply(folder, photo(0), "the cat sat on the mat")
    assert reply.usage.prompt_tokens == prompt_tokens
    assert [bytes(t.bytes) for t in reply.choices[0].logprobs.content] == tokens


def test_the_next_turn_about_the_same_image_comes_from_the_prefix_cache(client):
    first = ask(client, photo(1), "what is in it")
    history = [{"role": "user", "content": [
                   {"type": "image_url", "image_url": {"url": data_url(photo(1))}},
                   {"type": "text", "text": "what is in it"}]},
               {"role": "assistant", "content": first.choices[0].message.content}]
    follow_up = client.chat.completions.create(
        model=MODEL, messages=[*history, {"role": "user", "content": "and its colour"}],
        max_tokens=TOKENS, temperature=0)
    assert follow_up.usage.prompt_tokens_details.cached_tokens > GEMMA3_TOKENS_PER_IMAGE


@pytest.mark.parametrize(("url", "words"), [
    ("data:image/png;base64," + base64.b64encode(png_bytes(photo(0))[:300]).decode(),
     "not a whole PNG image"),
    ("data:image/png;base64," + base64.b64encode(b"GIF89a....").decode(),
     "declares image/png but its bytes are not a PNG"),
    ("https://example.com/cat.png", "does not fetch remote images"),
    ("data:text/plain;base64,aGVsbG8=", "declares 'text/plain'"),
])
def test_a_bad_image_is_a_400_naming_the_part(client, url, words):
    with pytest.raises(openai.BadRequestError, match=words) as caught:
        client.chat.completions.create(
            model=MODEL, max_tokens=2,
            messages=[{"role": "user", "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": url}}]}])
    assert caught.value.body["param"] == "messages[0].content[1].image_url.url"


def test_text_holding_the_image_marker_is_refused(client):
    with pytest.raises(openai.BadRequestError, match="reads as an image"):
        client.chat.completions.create(
            model=MODEL, max_tokens=2,
            messages=[{"role": "user", "content": f"see {GEMMA3_IMAGE_TOKENS[0]} here"}])


def test_a_detail_this_server_does_not_make_is_refused(client):
    with pytest.raises(openai.BadRequestError, match="detail is 'low'"):
        client.chat.completions.create(
            model=MODEL, max_tokens=2,
            messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": data_url(photo(0)),
                                                    "detail": "low"}}]}])


def test_the_responses_api_takes_an_input_image_as_the_chat_takes_an_image_url(client):
    chat = ask(client, photo(3), "what is this")
    response = client.responses.create(
        model=MODEL, max_output_tokens=TOKENS, temperature=0,
        input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": data_url(photo(3))},
            {"type": "input_text", "text": "what is this"}]}])
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.output_text == chat.choices[0].message.content


def test_a_bad_input_image_is_named_by_its_place_in_the_input(client):
    with pytest.raises(openai.BadRequestError, match="not a whole PNG image") as caught:
        client.responses.create(model=MODEL, max_output_tokens=2, input=[
            {"role": "user", "content": [
                {"type": "input_text", "text": "look"},
                {"type": "input_image", "image_url": "data:image/png;base64,"
                 + base64.b64encode(png_bytes(photo(0))[:300]).decode()}]}])
    assert caught.value.body["param"] == "input[0].content[1].image_url"


def test_the_messages_api_takes_a_base64_image_block(server, client):
    anthropic = pytest.importorskip("anthropic")
    chat = ask(client, photo(4), "what is this")
    claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0,
                                 timeout=60)
    message = claude.messages.create(
        model=MODEL, max_tokens=TOKENS,
        messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(png_bytes(photo(4))).decode()}},
            {"type": "text", "text": "what is this"}]}])
    # Anthropic's input_tokens leave out what the cache read: the chat's same image.
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert usage.cache_read_input_tokens > GEMMA3_TOKENS_PER_IMAGE
    with pytest.raises(anthropic.BadRequestError, match="does not fetch remote images"):
        claude.messages.create(model=MODEL, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}])


def test_tokenize_counts_a_chats_image_as_the_chat_sends_it(server, client):
    chat = ask(client, photo(5), "what is this")
    content = [{"type": "image_url", "image_url": {"url": data_url(photo(5))}},
               {"type": "text", "text": "what is this"}]
    counted = httpx.post(f"{server.url}/tokenize", timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": content}]}).json()
    assert counted["count"] == chat.usage.prompt_tokens


# The tests' image host serves from 127.0.0.1: a server fetches from it only when told to fetch
# from private addresses as well.
FROM_HERE = RemoteImages(allowed=True, private_hosts=True, timeout=5.0)


@pytest.fixture(scope="module")
def host():
    with image_host(png_bytes(photo(6)), b"") as server:
        yield server


def test_an_image_url_is_fetched_and_read_as_the_same_image_inline(client, host, fetching):
    inline = ask(client, photo(6))
    fetching(FROM_HERE)
    fetched = ask(client, f"{host.url}/cat.png")
    assert fetched.usage.prompt_tokens == inline.usage.prompt_tokens
    assert fetched.choices[0].message.content == inline.choices[0].message.content


def test_the_messages_api_fetches_a_url_image_source(server, client, host, fetching):
    anthropic = pytest.importorskip("anthropic")
    inline = ask(client, photo(6), "what is this")
    fetching(FROM_HERE)
    claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0,
                                 timeout=60)
    message = claude.messages.create(model=MODEL, max_tokens=TOKENS, messages=[
        {"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": f"{host.url}/cat.png"}},
            {"type": "text", "text": "what is this"}]}])
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == inline.usage.prompt_tokens


@pytest.mark.parametrize(("path", "words"), [
    ("/missing.png", "answered 404 Not Found"),
    ("/page.html", "is 'text/html' \\(its Content-Type\\)"),
    ("/huge.png", "over the 20,971,520 an image may be"),
    ("/slow.png", "sent no whole image within 1 s"),
])
def test_a_remote_image_that_cannot_be_had_is_a_400_naming_the_part(client, host, fetching,
                                                                     path, words):
    fetching(dataclasses.replace(FROM_HERE, timeout=1.0))
    with pytest.raises(openai.BadRequestError, match=words) as caught:
        ask(client, f"{host.url}{path}")
    assert caught.value.body["param"] == "messages[0].content[0].image_url.url"


def test_remote_images_are_fetched_from_public_addresses_unless_told(client, host, fetching):
    fetching(RemoteImages(allowed=True))
    before = len(host.requests)
    with pytest.raises(openai.BadRequestError, match="is at 127.0.0.1, an address on this "
                                                     "machine or a private network"):
        ask(client, f"{host.url}/cat.png")
    assert len(host.requests) == before


def test_a_slow_image_host_holds_up_no_other_request(server, client, host, fetching):
    fetching(dataclasses.replace(FROM_HERE, timeout=3.0))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        slow = pool.submit(ask, client, f"{host.url}/slow.png")
        time.sleep(0.3)  # the fetch is waiting on the host
        started = time.monotonic()
        assert httpx.get(f"{server.url}/v1/models", timeout=10).status_code == 200
        assert time.monotonic() - started < 1.0
        with pytest.raises(openai.BadRequestError, match="within 3 s"):
            slow.result()
