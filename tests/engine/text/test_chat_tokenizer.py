"""The ChatTokenizer: prompts far over the context refused untokenized, and a short prompt never
waiting behind a long one.

pytest-asyncio is not a dependency, so each test drives its coroutine with asyncio.run.
"""

import asyncio

import pytest

from pagoda.engine.errors import InvalidTextError, PromptTooLongError
from pagoda.engine.text.chat_template import encode_chat
from pagoda.engine.text.chat_tokenizer import LONG_TEXT_CHARS, ChatTokenizer, longest_token_chars
from tests.engine.tokenizer_threads import hold_long_texts, note_encoding_threads

TIMEOUT_S = 30
CONTEXT = 1000


@pytest.fixture(scope="module")
def tokenizer(default_model):
    return default_model.tokenizer


@pytest.fixture
def chat_tokenizer(tokenizer):
    chat_tokenizer = ChatTokenizer(tokenizer, max_tokens=CONTEXT)
    yield chat_tokenizer
    chat_tokenizer.close()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, TIMEOUT_S))


def test_no_token_spells_more_characters_than_the_bound(tokenizer):
    bound = longest_token_chars(tokenizer)
    assert max(len(tokenizer.decode([i])) for i in range(len(tokenizer))) <= bound


def test_a_text_no_context_could_hold_is_refused_without_tokenizing(chat_tokenizer,
                                                                     monkeypatch):
    threads = note_encoding_threads(chat_tokenizer, monkeypatch)
    huge = "word " * (chat_tokenizer.max_chars // 5 + 1)
    with pytest.raises(PromptTooLongError, match=f"context of {CONTEXT} tokens") as caught:
        run(chat_tokenizer.encode_text(huge))
    assert str(len(huge)) in str(caught.value)
    with pytest.raises(PromptTooLongError, match="the chat's messages"):
        run(chat_tokenizer.encode_chat([{"role": "system", "content": huge[:len(huge) // 2]},
                                        {"role": "user", "content": huge[len(huge) // 2:]}]))
    assert threads == []


def test_a_text_at_the_bound_is_tokenized(chat_tokenizer, tokenizer):
    text = "x" * chat_tokenizer.max_chars
    assert run(chat_tokenizer.encode_text(text)) == tokenizer.encode(text)


def test_a_lone_surrogate_in_a_text_is_refused_naming_it(chat_tokenizer):
    with pytest.raises(InvalidTextError, match="^prompt holds a lone surrogate U\\+D83D"):
        run(chat_tokenizer.encode_text("bad \ud83d", "prompt"))


def test_a_short_prompt_is_encoded_while_a_long_one_still_is(chat_tokenizer, tokenizer,
                                                             monkeypatch):
    entered, release = hold_long_texts(chat_tokenizer, monkeypatch, TIMEOUT_S)
    long_text = "All work and no play. " * (LONG_TEXT_CHARS // 20)
    chat = [{"role": "user", "content": "Hi"}]

    async def scenario():
        long_one = asyncio.ensure_future(chat_tokenizer.encode_text(long_text))
        await asyncio.to_thread(entered.wait, TIMEOUT_S)
        short = await asyncio.wait_for(chat_tokenizer.encode_chat(chat), 10)
        held = not long_one.done()
        release.set()
        return short, held, await long_one

    short, held, long_ids = run(scenario())
    assert held
    assert short == encode_chat(tokenizer, chat)
    assert long_ids == tokenizer.encode(long_text)


def test_short_and_long_texts_encoded_at_once_get_the_tokenizers_ids(chat_tokenizer, tokenizer,
                                                                      monkeypatch):
    threads = note_encoding_threads(chat_tokenizer, monkeypatch)
    texts = [f"{i} little pigs. " * (1 if i % 2 else LONG_TEXT_CHARS // 10) for i in range(12)]

    async def all_at_once():
        return await asyncio.gather(*(chat_tokenizer.encode_text(t) for t in texts))

    assert run(all_at_once()) == [tokenizer.encode(t) for t in texts]
    assert {name.rsplit("_", 1)[0] for name in threads} \
        == {"pagoda-tokenize", "pagoda-tokenize-long"}
