"""A model's raw reply text into OpenAI's structured parts, whole and streamed: the reasoning
before the answer (`reasoning`), the tool calls of each model family (`tool_calls`, `hermes`,
`llama3_json`, `mistral`, chosen by `registry`), the two composed (`reply`), and gpt-oss's
harmony format, whose frame holds reasoning, calls and answer alike (`harmony`, and
`harmony_frame` for the constraints inside that frame).

Pure Python: no torch, no tokenizer; the text in is what the detokenizer shows."""
