"""The rules a request's fields follow, written once for every way in: Pagoda's server (chat
completions, and the Responses and Messages requests that become one) and the app's backends.

Plain Python over OpenAI's shapes, no pydantic and no tensors; a field that breaks a rule is a
RequestFieldError (pagoda/engine/errors.py) naming it, which each caller answers in its own
error (the server's 400 with `param`, the app's InvalidRequestError)."""
