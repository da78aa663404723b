"""LlamaIndex's OpenAILike.structured_predict with its default program (is_function_calling_model
False) against a server: `python llamaindex_client.py BASE_URL MODEL [--defaults]` prints the
pydantic object it returned as JSON. --defaults leaves OpenAILike's every setting as it is
(is_chat_model False: the completions route, no response_format). Run by test_agent_clients.py with a Python that has LlamaIndex, which needs
openai<3 and so cannot share the test extra's environment (openai-agents needs openai>=3)."""

import json
import sys

from llama_index.core.prompts import PromptTemplate
from llama_index.llms.openai_like import OpenAILike
from pydantic import BaseModel


class City(BaseModel):
    name: str
    country: str


def main() -> None:
    base_url, model = sys.argv[1:3]
    if "--defaults" in sys.argv[3:]:
        llm = OpenAILike(model=model, api_base=base_url, api_key="unused", max_retries=0,
                         timeout=120)
        city = llm.structured_predict(City, PromptTemplate("Name a city in {country}."),
                                      country="France")
        print(json.dumps(city.model_dump()))
        return
    # is_chat_model: with LlamaIndex's default (False) structured_predict fails in the client
    # (it passes tool_choice to the openai SDK's completions.create): no request is sent.
    # response_format: the 135M model writes back the schema LlamaIndex puts in the prompt
    # (its braces doubled) rather than an object that follows it; the server's constraint
    # holds the reply to the schema, so what is tested is the protocol, not the model.
    schema = {"name": "City", "schema": City.model_json_schema(), "strict": True}
    llm = OpenAILike(model=model, api_base=base_url, api_key="unused", is_chat_model=True,
                     temperature=0, max_tokens=60, timeout=120, max_retries=0,
                     additional_kwargs={"response_format": {"type": "json_schema",
                                                            "json_schema": schema}})
    city = llm.structured_predict(City, PromptTemplate("Name a city in {country}."),
                                  country="France")
    print(json.dumps(city.model_dump()))


if __name__ == "__main__":
    main()
