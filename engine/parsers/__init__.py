"""A model's raw reply text into OpenAI's structured parts, whole and streamed: the reasoning
before the answer (`reasoning`), the tool calls of each model family (`tool_calls`, `hermes`,
`llama3_json`, `mistral`, chosen by `registry`), and the two composed (`reply`).

Pure Python: no torch, no tokenizer; the text in is what the detokenizer shows."""
