"""Structured output: constraints (JSON schemas, regexes, grammars, choices) compiled against the
tokenizer with xgrammar, a matcher per request that advances with its tokens, and the bitmask
that keeps a step's constrained rows to the tokens their grammar allows."""
