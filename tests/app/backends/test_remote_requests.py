"""What OpenAIBackend asks of a server: the address, the key, the model, and our sampling in
the words each kind of server knows."""

import pytest
from conftest import remote, run
from fake_server import LLAMA_CPP_CONTEXT, MODEL

from pagoda.app.backends import ChatMessage, InvalidAddressError, SamplingOptions
from pagoda.app.backends.remote.endpoint import api_base
from pagoda.app.backends.remote.openai_remote import DEFAULT_MAX_MODEL_LEN

CHAT = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")]
TUNED = SamplingOptions(temperature=0.7, top_p=0.9, top_k=40, min_p=0.05,
                        repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.25,
                        max_tokens=5, seed=7, stop=("\n\n",))
STANDARD = {"model": MODEL, "stream": True, "stream_options": {"include_usage": True},
            "messages": [m.as_dict() for m in CHAT], "max_tokens": 5, "temperature": 0.7,
            "top_p": 0.9, "presence_penalty": 0.5, "frequency_penalty": 0.25, "seed": 7,
            "stop": ["\n\n"]}


def test_vllm_gets_its_sampling_extras(fake_vllm):
    fake, url = fake_vllm
    run(_reply(remote(url), TUNED))
    assert fake.requests[-1] == {**STANDARD, "top_k": 40, "min_p": 0.05,
                                 "repetition_penalty": 1.1}


def test_llama_cpp_gets_repeat_penalty_under_its_own_name(fake_llama_cpp):
    fake, url = fake_llama_cpp
    backend = remote(url)
    run(_reply(backend, TUNED))
    assert backend.flavor == "llama.cpp"
    assert fake.requests[-1] == {**STANDARD, "top_k": 40, "min_p": 0.05, "repeat_penalty": 1.1,
                                 "return_progress": True}


def test_standard_server_gets_only_openais_fields(fake_vllm):
    fake, url = fake_vllm
    run(_reply(remote(url, flavor="openai"), TUNED))
    assert fake.requests[-1] == STANDARD


def test_options_left_at_their_neutral_value_are_not_sent(fake_vllm):
    fake, url = fake_vllm
    run(_reply(remote(url), SamplingOptions(temperature=0.0, max_tokens=5)))
    assert set(fake.requests[-1]) == {"model", "messages", "stream", "stream_options",
                                      "max_tokens", "temperature", "top_p"}


def test_kind_of_server_is_told_by_its_model_list(fake_vllm, fake_llama_cpp, pagoda_server):
    kinds = {}
    for name, url in [("vllm", fake_vllm[1]), ("llama.cpp", fake_llama_cpp[1]),
                      ("pagoda", f"{pagoda_server.url}/v1")]:
        backend = remote(url)
        run(backend.connect())
        kinds[name] = backend.flavor
    assert kinds == {"vllm": "vllm", "llama.cpp": "llama.cpp", "pagoda": "pagoda"}


def test_first_listed_model_is_used_when_none_is_named(fake_vllm):
    fake, url = fake_vllm
    backend = remote(url)
    run(_reply(backend, TUNED))
    assert backend.model_name == MODEL == fake.requests[-1]["model"]


def test_context_length_given_by_the_user_wins_over_a_guess(fake_llama_cpp):
    fake, url = fake_llama_cpp
    fake.context_at = ()
    guessed, given = remote(url), remote(url, max_model_len=8192)
    run(guessed.connect())
    run(given.connect())
    assert (guessed.max_model_len, guessed.max_model_len_known) == (DEFAULT_MAX_MODEL_LEN, False)
    assert (given.max_model_len, given.max_model_len_known) == (8192, True)


@pytest.mark.parametrize("context_at", [
    LLAMA_CPP_CONTEXT, ("props_settings",), ("props",), ("meta",)])
def test_llama_cpps_context_length_is_read_wherever_its_build_reports_it(fake_llama_cpp,
                                                                           context_at):
    fake, url = fake_llama_cpp
    fake.context_at, fake.n_ctx = context_at, 8192
    backend = remote(url)
    run(backend.connect())
    assert (backend.max_model_len, backend.max_model_len_known) == (8192, True)


def test_llama_cpps_training_context_is_not_taken_for_its_running_one(fake_llama_cpp):
    fake, url = fake_llama_cpp
    fake.context_at = ()
    backend = remote(url)
    run(backend.connect())
    assert (backend.max_model_len, backend.max_model_len_known) == (DEFAULT_MAX_MODEL_LEN, False)


def test_llama_cpps_context_is_read_behind_its_api_key(fake_llama_cpp):
    fake, url = fake_llama_cpp
    fake.api_key, fake.context_at, fake.n_ctx = "s3cret", ("props_settings",), 8192
    backend = remote(url, api_key="s3cret")
    run(backend.connect())
    assert backend.max_model_len == 8192


def test_api_key_is_sent_as_a_bearer_token(fake_vllm):
    fake, url = fake_vllm
    fake.api_key = "s3cret"
    assert run(_collect(remote(url, api_key="s3cret")))[-1].finished


@pytest.mark.parametrize(("address", "base"), [
    ("http://gpu-box:8000/v1", "http://gpu-box:8000/v1"),
    ("http://gpu-box:8000/v1/", "http://gpu-box:8000/v1"),
    ("http://gpu-box:8000", "http://gpu-box:8000/v1"),
    ("gpu-box:8000", "http://gpu-box:8000/v1"),
    ("https://example.com/api/v1", "https://example.com/api/v1"),
])
def test_address_is_read_as_the_apis_base(address, base):
    assert api_base(address) == base


@pytest.mark.parametrize("address", ["ftp://gpu-box/v1", "http://", "http://gpu box:80/v1",
                                     "http://gpu-box:99999/v1", "http://gpu-box:port/v1"])
def test_address_that_is_no_server_is_refused_in_words(address):
    with pytest.raises(InvalidAddressError, match="like http://host:8000/v1"):
        remote(address)


async def _collect(backend, options: SamplingOptions = TUNED):
    return [chunk async for chunk in backend.stream(CHAT, options)]


async def _reply(backend, options: SamplingOptions) -> None:
    await _collect(backend, options)
