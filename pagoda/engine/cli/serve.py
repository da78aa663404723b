"""`python -m pagoda.engine serve`: load a model, then serve it until interrupted."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagoda.engine.server.served import ServedModel

API_KEY_ENV = "PAGODA_API_KEY"


def add_serve_options(parser: argparse.ArgumentParser) -> None:
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: 127.0.0.1, this machine only; any "
                             "other address needs an API key)")
    server.add_argument("--port", type=int, default=8000, help="(default: 8000)")
    server.add_argument("--api-key", default=None, metavar="KEY",
                        help=f"require 'Authorization: Bearer KEY' on every route but /health "
                             f"and /metrics (default: ${API_KEY_ENV}, else none)")
    server.add_argument("--served-model-name", metavar="NAME",
                        help="the model's id in the API (default: the model's own name)")
    server.add_argument("--allowed-origins", nargs="+", default=[], metavar="ORIGIN",
                        help="browser origins allowed by CORS (default: none, CORS off)")
    server.add_argument("--allowed-hosts", nargs="+", default=[], metavar="NAME",
                        help="host names a server on 127.0.0.1 answers to besides localhost, "
                             "127.0.0.1 and [::1]; '*' allows any (default: none; other names are "
                             "refused with 403, against DNS rebinding)")
    server.add_argument("--force-tool-call", action="store_true",
                        help="a request that offers tools and leaves the choice to the model "
                             "(tool_choice auto or unset) must call one when the chat asks "
                             "something new; once a call's result is back the model chooses "
                             "again. For small models that answer an agent's task without "
                             "looking (default: off)")
    images = parser.add_argument_group("images in a chat")
    images.add_argument("--allow-remote-images", action="store_true",
                        help="fetch an image part's http(s) URL (default: off, such a part is a "
                             "400 and images come inline as data: URLs). Only from public "
                             "addresses, within --remote-image-timeout, at most 20 MiB")
    images.add_argument("--allow-private-image-hosts", action="store_true",
                        help="with --allow-remote-images, fetch from loopback, private and "
                             "link-local addresses as well (this machine, its network, a "
                             "cloud's metadata address): only where every client may reach "
                             "them (default: off)")
    images.add_argument("--remote-image-timeout", type=_positive(float), default=10.0,
                        metavar="SECONDS",
                        help="the most one remote image's fetch may take, redirects included "
                             "(default: 10)")
    # The defaults are pagoda.engine.server.connections' (not imported here: it loads uvicorn).
    server.add_argument("--header-timeout", type=_positive(float), default=10.0,
                        metavar="SECONDS",
                        help="close a connection that has not sent a request's headers within "
                             "this time (default: 10)")
    server.add_argument("--max-connections", type=_positive(int), default=1000, metavar="N",
                        help="the most connections open at once; more are answered 503 "
                             "(default: 1000, or fewer if the open-files limit is lower)")


def _positive(kind: type) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"{text} must be a positive number")
        return value
    return parse


def run_serve(args: argparse.Namespace,
              make_engine: Callable[[argparse.Namespace], object] | None = None) -> int:
    # Imported here: `python -m pagoda.engine chat` need not load the web stack.
    from pagoda.engine.server.api import ServerSettings, build_app
    from pagoda.engine.server.connections import ConnectionLimits
    from pagoda.engine.server.runner import bind, check_bind_address, serve_forever, settle_the_heap

    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    check_bind_address(args.host, api_key)
    remote_images(args)  # options that disagree are refused before the model loads
    sock = bind(args.host, args.port)  # before loading: a taken port fails in a second
    engine = (make_engine or _load_engine)(args)
    settle_the_heap()
    try:
        served = served_model(args, engine)
        app = build_app(lambda: served, ServerSettings(
            api_key=api_key, allowed_origins=tuple(args.allowed_origins), listen_host=args.host,
            allowed_hosts=tuple(args.allowed_hosts)))
        host, port = sock.getsockname()[:2]
        print(f"Serving {served.name} on http://{host}:{port}/v1 (Ctrl-C stops)", file=sys.stderr,
              flush=True)
        serve_forever(app, sock, ConnectionLimits(args.header_timeout, args.max_connections))
    finally:
        engine.shutdown()
        sock.close()
    return 0


def served_model(args: argparse.Namespace, engine) -> ServedModel:
    """The model as the API shows it, with the server's options."""
    from pagoda.engine.server.served import ServedModel

    return ServedModel(args.served_model_name or engine.model_name, engine,
                       engine.max_model_len, created=engine.model_created,
                       force_tool_call=args.force_tool_call, remote_images=remote_images(args))


def remote_images(args: argparse.Namespace):
    """The image-fetching options as the server takes them (RemoteImages); ValueError where
    they disagree."""
    from pagoda.engine.server.remote_images import RemoteImages

    if args.allow_private_image_hosts and not args.allow_remote_images:
        raise ValueError("--allow-private-image-hosts widens --allow-remote-images: give both")
    return RemoteImages(args.allow_remote_images, args.allow_private_image_hosts,
                        args.remote_image_timeout)


def _load_engine(args: argparse.Namespace):
    from pagoda.engine.async_engine import AsyncEngine
    from pagoda.engine.cli.common import engine_options
    from pagoda.engine.config import EngineConfig

    return AsyncEngine(args.model, EngineConfig(**engine_options(args)))
