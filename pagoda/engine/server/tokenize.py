"""POST /tokenize and /detokenize (vLLM's shapes): how many tokens a prompt or a chat is, for
clients that fit chats to the context (the app's remote backend counts exactly with it), and
the text of token ids."""

from __future__ import annotations

from pagoda.engine.requests.tools import check_tools
from pagoda.engine.server.errors import APIError, as_api_errors
from pagoda.engine.server.image_parts import ChatImages
from pagoda.engine.server.protocol import DetokenizeRequest, TokenizeRequest, engine_chat
from pagoda.engine.server.served import ServedModel


async def tokenize(body: TokenizeRequest, served: ServedModel) -> dict:
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give either prompt or messages", param="prompt")
    tokenizer = served.backend.chat_tokenizer
    with as_api_errors("messages" if body.messages is not None else "prompt"):
        if body.messages is not None:
            if not body.add_generation_prompt:
                raise APIError(400, "add_generation_prompt=false is not supported by this server",
                               param="add_generation_prompt")
            tools = [t.model_dump(exclude_none=True) for t in body.tools or []]
            check_tools(tools)  # as a chat request's, so the count is of a prompt it could send
            # Images counted as a chat request would send them, on a model that takes them.
            images = ChatImages.reader(served.backend.image_prompt, served.remote_images)
            messages = engine_chat(body.messages, images)
            if images is not None:
                await images.read()
            tokens = await tokenizer.encode_chat(messages,
                                                 tools=tools or None,
                                                 template_kwargs=body.chat_template_kwargs,
                                                 expand=None if images is None else images.expand())
        else:
            tokens = await tokenizer.encode_text(body.prompt, "prompt")
    return {"count": len(tokens), "max_model_len": served.max_model_len, "tokens": tokens}


async def detokenize(body: DetokenizeRequest, served: ServedModel) -> dict:
    if len(body.tokens) > served.max_model_len:
        raise APIError(400, f"tokens holds {len(body.tokens)} ids, more than the model's "
                            f"context of {served.max_model_len}", param="tokens")
    try:
        text = await served.backend.chat_tokenizer.decode(body.tokens)
    except ValueError as exc:
        raise APIError(400, str(exc), param="tokens") from exc
    return {"prompt": text}
