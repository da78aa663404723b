"""A chat template's sandbox with limits on what it may build and how long it may run.

A chat template is code from the model's files. Jinja's sandbox keeps it from Python's internals
(`__class__`, `cycler.__init__.__globals__`), but not from `'x' * 10**9` (which takes all
memory at once) or nested loops that never end (which would hold the shared tokenizer thread for
ever). Here every operation that can build a large value in one step (`*`, `+`, `%`, `**`, `~`,
the string methods and filters that pad, join or replace) is checked before it runs, every
output piece and block is counted, and a render that has used its CPU time is stopped at its
next step (each for loop's item, attribute read, call, filter or operator is one). The
environment is set up as transformers sets up its own (`trim_blocks`, `lstrip_blocks`,
`loopcontrols`, `{% generation %}`, `tojson`, `raise_exception`, `strftime_now`), so that real
templates render the same text.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.compiler import CodeGenerator, optimizeconst
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

# Far beyond any model's context (a million tokens is ~4M characters), far below what would
# exhaust memory: no string a template builds, nor its whole output, may be longer.
MAX_CHARS = 1 << 24
MAX_ITEMS = 1 << 20  # nor any list or tuple longer
MAX_OUTPUT_CHARS = 4 * MAX_CHARS  # all output written, into the page and captured blocks
MAX_INT_BITS = 1 << 16  # nor any integer larger (10**19728)
MAX_RANGE = 100_000  # jinja's own sandbox limit on range()
# CPU seconds a render may take on its thread; a real template renders a long chat in
# milliseconds.
TIME_BUDGET_S = 2.0
_FORMAT_WIDTH = re.compile(r"%[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[a-zA-Z%]")
# Filters whose numeric arguments size what they build (a width, a length, a batch).
_FILTERS_SIZED_BY_NUMBERS = frozenset({"center", "indent", "truncate", "wordwrap", "batch",
                                       "slice"})
_FIELD_WIDTH = re.compile(r"\{[^{}]*:[^{}]*?(\d+)[^{}]*\}")


class TemplateLimitError(Exception):
    """A render went past one of the limits above; the message names it."""


class _Budget:
    """One render's clock: the rendering thread's CPU time (another thread holding the GIL
    does not count), read only when the wall clock says the budget may be spent."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.cpu_start = time.thread_time()
        self.check_at = time.perf_counter() + seconds
        self.output_chars = 0

    def tick(self) -> None:
        if time.perf_counter() > self.check_at:
            self._check_cpu_time()

    def _check_cpu_time(self) -> None:
        left = self.seconds - (time.thread_time() - self.cpu_start)
        if left <= 0:
            raise TemplateLimitError(f"it ran for more than {self.seconds:g} s of CPU time")
        self.check_at = time.perf_counter() + left

    def count_output(self, length: int) -> None:
        """Output goes into buffers (the page, a captured block, a macro's text) before they are
        joined: a loop that writes a long string each time is stopped here, not at the join."""
        self.output_chars += length
        if self.output_chars > MAX_OUTPUT_CHARS:
            raise TemplateLimitError(f"it wrote more than {MAX_OUTPUT_CHARS:,} characters of "
                                     "output in all")


_current_budget: ContextVar[_Budget | None] = ContextVar("template_budget", default=None)


def render(template: str, context: Mapping[str, Any], time_budget_s: float = TIME_BUDGET_S) -> str:
    """template rendered with context under the limits; TemplateLimitError past one of them,
    jinja2.TemplateError (syntax, undefined names, the template's raise_exception) or a Python
    error the template caused otherwise."""
    compiled = _compile(template)
    token = _current_budget.set(_Budget(time_budget_s))
    try:
        return _bounded_join(compiled.generate(**context), "the template's output")
    finally:
        _current_budget.reset(token)


def _tick() -> None:
    budget = _current_budget.get()
    if budget is not None:
        budget.tick()


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    return _environment().from_string(template)


@lru_cache(maxsize=1)
def _environment() -> BoundedSandbox:
    return BoundedSandbox()


# Size checks


def _check_chars(length: int, what: str) -> None:
    if length > MAX_CHARS:
        raise TemplateLimitError(f"{what} would be {length:,} characters long, more than the "
                                 f"{MAX_CHARS:,} a template may build")


def _check_items(length: int, what: str) -> None:
    if length > MAX_ITEMS:
        raise TemplateLimitError(f"{what} would hold {length:,} items, more than the "
                                 f"{MAX_ITEMS:,} a template may build")


def _check_size(value: Any, what: str) -> None:
    """A value about to be joined, repeated or padded: strings by characters, lists by items."""
    if isinstance(value, str):
        _check_chars(len(value), what)
    elif isinstance(value, list | tuple):
        _check_items(len(value), what)
    elif isinstance(value, int):
        _check_bits(value.bit_length(), what)


def _text_size(value: Any, what: str) -> int:
    """The characters str(value) will take, found without building it: a list of a million
    references to one long string is short, its text is not. Walks at most MAX_ITEMS values."""
    total, seen, pending = 0, 0, [value]
    while pending:
        item = pending.pop()
        seen += 1
        if seen > MAX_ITEMS:
            raise TemplateLimitError(f"{what} holds more than {MAX_ITEMS:,} values")
        if isinstance(item, str):
            total += len(item) + 4  # quotes and a separator once inside a container
        elif isinstance(item, Mapping):
            pending.extend(item.keys())
            pending.extend(item.values())
            total += 2
        elif isinstance(item, list | tuple | set | frozenset):
            pending.extend(item)
            total += 2
        elif isinstance(item, Namespace):  # its text shows every value it holds
            pending.extend(object.__getattribute__(item, "_Namespace__attrs").values())
            total += 12
        else:
            total += 24  # numbers, None, booleans, Undefined: short
        _check_chars(total, what)
    return total


def _bounded_join(pieces: Iterable[Any], what: str) -> str:
    parts, total = [], 0
    for piece in pieces:
        if not isinstance(piece, str):
            _text_size(piece, what)  # before str() builds it
            piece = str(piece)
        total += len(piece)
        _check_chars(total, what)
        parts.append(piece)
    return "".join(parts)


def _check_length(like: Any, length: int, what: str) -> None:
    """length: of a string (characters) or a list or tuple (items) like `like`, not built yet."""
    (_check_chars if isinstance(like, str) else _check_items)(length, what)


def _check_bits(bits: int, what: str) -> None:
    if bits > MAX_INT_BITS:
        raise TemplateLimitError(f"{what} would be a number of more than {MAX_INT_BITS:,} bits")


def _check_repetition(left: Any, right: Any) -> None:
    for sequence, count in ((left, right), (right, left)):
        if isinstance(count, int) and isinstance(sequence, str | list | tuple):
            _check_length(sequence, len(sequence) * max(count, 0), "a repetition (*)")
    if isinstance(left, int) and isinstance(right, int):
        _check_bits(left.bit_length() + right.bit_length(), "a product (*)")


def _format_widths(template: str, args: Any, pattern: re.Pattern, what: str) -> None:
    """printf and str.format widths ('%999999999d', '{:>999999999}') pad in one step."""
    for match in pattern.finditer(template):
        for width in match.groups():
            if width and width.isdigit():
                _check_chars(int(width), what)
            elif width == "*":
                values = args if isinstance(args, tuple) else (args,)
                for value in values:
                    if isinstance(value, int):
                        _check_chars(abs(value), what)


def _check_replace(text: str, old: str, new: str, what: str) -> None:
    count = text.count(old) if old else len(text) + 1
    _check_chars(len(text) + count * max(len(new) - len(old), 0), what)


def _check_formatted(template: str, marker: str, values: list, what: str) -> None:
    """Each field of a format ('{0}{0}{0}', '%(a)s%(a)s') may repeat the longest value."""
    longest = 0
    for value in values:
        items = value.values() if isinstance(value, Mapping) else (
            value if isinstance(value, tuple) else (value,))
        longest = max([longest, *(_text_size(item, what) for item in items)])
    _check_chars(len(template) + template.count(marker) * longest, what)


# The string methods and filters that can build much more than they are given


def _check_str_method(text: str, name: str, args: tuple, kwargs: dict) -> None:
    what = f"str.{name}()"
    values = [*args, *kwargs.values()]
    if name in ("center", "ljust", "rjust", "zfill") and values and isinstance(values[0], int):
        _check_chars(values[0], what)
    elif name == "expandtabs":
        size = values[0] if values and isinstance(values[0], int) else 8
        _check_chars(len(text) + text.count("\t") * size, what)
    elif name == "join" and values:
        items = list(values[0])
        _check_items(len(items), what)
        _check_chars(sum(_text_size(i, what) for i in items) + len(text) * len(items), what)
    elif name == "replace" and len(values) >= 2:
        _check_replace(text, str(values[0]), str(values[1]), what)
    elif name in ("format", "format_map"):
        _format_widths(text, (), _FIELD_WIDTH, what)
        _check_formatted(text, "{", values, what)
    elif name == "translate":
        _check_chars(len(text) * (1 + _text_size(values[0] if values else "", what)), what)


def _checked_filter(name: str, filter_function: Callable) -> Callable:
    """filter_function with its arguments checked first (numbers that size what it builds,
    containers it turns into text) and its result after."""
    what = f"the {name} filter"

    def checked(*args: Any, **kwargs: Any) -> Any:
        _tick()
        values = [a for a in (*args, *kwargs.values()) if not _is_context(a)]
        for value in values[1:] if name in _FILTERS_SIZED_BY_NUMBERS else ():
            if isinstance(value, int) and not isinstance(value, bool):
                _check_chars(abs(value), what)
        _check_filter_growth(name, values, kwargs, what)
        result = filter_function(*args, **kwargs)
        _check_size(result, what)
        return result

    if hasattr(filter_function, "jinja_pass_arg"):  # pass_context, pass_environment, ...
        checked.jinja_pass_arg = filter_function.jinja_pass_arg
    checked.__name__ = getattr(filter_function, "__name__", name)
    return checked


def _check_filter_growth(name: str, values: list, kwargs: dict, what: str) -> None:
    """values: the filter's subject, then its arguments (kwargs' values among them)."""
    check = _GROWTH_CHECKS.get(name, _text_growth if name in _TEXT_FILTERS else None)
    if check is not None and values:
        check(values, kwargs, what)


def _text_growth(values: list, kwargs: dict, what: str) -> None:
    """Filters that make text of a container (tojson, string, pprint): as long as its items'."""
    total = _text_size(values[0], what)
    if kwargs.get("indent"):
        total *= 2 + int(kwargs["indent"])
    _check_chars(total, what)


def _join_growth(values: list, kwargs: dict, what: str) -> None:
    separator = str(kwargs.get("d", values[1] if len(values) > 1 else ""))
    count = len(values[0]) if hasattr(values[0], "__len__") else 1
    _check_chars(_text_size(values[0], what) + len(separator) * count, what)


def _format_growth(values: list, kwargs: dict, what: str) -> None:
    _format_widths(str(values[0]), tuple(values[1:]), _FORMAT_WIDTH, what)
    _check_formatted(str(values[0]), "%", values[1:], what)


def _replace_growth(values: list, kwargs: dict, what: str) -> None:
    if len(values) >= 3:
        _check_replace(str(values[0]), str(values[1]), str(values[2]), what)


def _indent_growth(values: list, kwargs: dict, what: str) -> None:
    width = kwargs.get("width", values[1] if len(values) > 1 else 4)
    text = str(values[0])
    per_line = width if isinstance(width, int) else len(str(width))
    _check_chars(len(text) + (text.count("\n") + 1) * per_line, what)


def _wordwrap_growth(values: list, kwargs: dict, what: str) -> None:
    wrap = kwargs.get("wrapstring", values[3] if len(values) > 3 else None)
    _check_chars(len(str(values[0])) * (1 + len(str(wrap or "\n"))), what)


def _sum_growth(values: list, kwargs: dict, what: str) -> None:
    """sum(lists, start=[]) concatenates in C, out of the clock's sight."""
    start = kwargs.get("start", values[2] if len(values) > 2 else 0)
    if isinstance(start, str | list | tuple):
        _check_items(sum(len(v) for v in values[0] if hasattr(v, "__len__")), what)


def _batch_growth(values: list, kwargs: dict, what: str) -> None:
    if len(values) > 1 and isinstance(values[1], int):
        _check_items(values[1], what)


_TEXT_FILTERS = frozenset({"string", "tojson", "pprint", "list", "safe", "e", "escape",
                           "forceescape", "urlencode", "xmlattr"})
_GROWTH_CHECKS = {"join": _join_growth, "format": _format_growth, "replace": _replace_growth,
                  "indent": _indent_growth, "wordwrap": _wordwrap_growth, "sum": _sum_growth,
                  "batch": _batch_growth}


def _is_context(value: Any) -> bool:
    return isinstance(value, jinja2.runtime.Context | jinja2.nodes.EvalContext | jinja2.Environment)


# The environment


class _BoundedCodeGenerator(CodeGenerator):
    """`a ~ b` joins through the environment, where its length is checked, and every for loop
    steps through the environment's counted iteration, so that loops with nothing in them that
    reaches the environment are stopped by the clock too."""

    def visit_For(self, node: jinja2.nodes.For, frame) -> None:
        counted = jinja2.nodes.Call(jinja2.nodes.EnvironmentAttribute("counted_iter"),
                                    [node.iter], [], None, None)
        node.iter = counted.set_lineno(node.lineno)
        super().visit_For(node, frame)

    @optimizeconst
    def visit_Concat(self, node: jinja2.nodes.Concat, frame) -> None:
        self.write("environment.concat_checked((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _GenerationTag(jinja2.ext.Extension):
    """transformers' `{% generation %}...{% endgeneration %}` (it marks the assistant's tokens
    for training masks): its body renders as it is."""

    tags = frozenset({"generation"})

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


class _TemplateNamespace(Namespace):
    """namespace() that stores no underscore names (transformers refuses them too)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, attributes = args[0], dict(*args[1:], **kwargs)
        for name in attributes:
            _TemplateNamespace._check_name(name)
        Namespace.__init__(self, attributes)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"a chat template may not store {name!r} on a namespace (underscore names)")


class _TemplateDict:
    """dict() for templates, with no class to climb out of."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """As transformers' templates expect: no HTML escaping, and its options."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, set up as transformers sets up its chat templates', with the
    limits of this module."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True,
                         extensions=[_GenerationTag, jinja2.ext.loopcontrols],
                         finalize=self._finalize)
        self.filters["tojson"] = _tojson
        self.filters = {name: _checked_filter(name, f) for name, f in self.filters.items()}
        self.globals.update(range=_bounded_range, raise_exception=_raise_exception,
                            strftime_now=_strftime_now, dict=_TemplateDict(),
                            namespace=_TemplateNamespace)
        # Nothing in a chat template needs placeholder text; its paragraphs are made in Python
        # loops the clock does not see.
        del self.globals["lipsum"]

    def counted_iter(self, items: Iterable[Any]) -> _CountedItems:
        return _CountedItems(items)

    def concat(self, pieces: Iterable[Any]) -> str:  # blocks, macros and captured output
        return _bounded_join(pieces, "a block of the template's output")

    def concat_checked(self, pieces: tuple) -> str:
        _tick()
        return _bounded_join(pieces, "a join (~)")

    def _finalize(self, value: Any) -> Any:
        length = len(value) if isinstance(value, str) else _text_size(value, "an output value")
        budget = _current_budget.get()
        if budget is not None:
            budget.tick()
            budget.count_output(length)
        return value

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any,
                   right: Any) -> Any:
        _tick()
        if operator == "*":
            _check_repetition(left, right)
        elif operator == "+" and isinstance(left, str | list | tuple) and hasattr(right, "__len__"):
            _check_length(left, len(left) + len(right), "a concatenation (+)")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
            _check_bits(max(left.bit_length() - 1, 0) * right, "a power (**)")
        elif operator == "%" and isinstance(left, str):
            _format_widths(left, right, _FORMAT_WIDTH, "a %-format")
            _check_formatted(left, "%", [right], "a %-format")
        result = super().call_binop(context, operator, left, right)
        _check_size(result, f"the result of {operator}")
        return result

    def call(self, context: jinja2.runtime.Context, function: Any, /, *args: Any,
             **kwargs: Any) -> Any:
        _tick()
        owner = getattr(function, "__self__", None)
        if isinstance(owner, str):
            _check_str_method(owner, getattr(function, "__name__", ""), args, kwargs)
        for value in (*args, *kwargs.values()):
            _check_size(value, "an argument")
        result = super().call(context, function, *args, **kwargs)
        _check_size(result, "a call's result")
        return result

    def getattr(self, obj: Any, attribute: str) -> Any:
        _tick()  # every loop body that reads anything is counted, recursive loops' too
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _tick()
        return super().getitem(obj, argument)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        text = value.__self__

        def checked(*args: Any, **kwargs: Any) -> str:
            _check_str_method(text, value.__name__, args, kwargs)
            return wrapped(*args, **kwargs)

        return checked


class _CountedItems:
    """A for loop's items, each a step on the render's clock; their length as it is, for
    loop.length and loop.last."""

    __slots__ = ("_items",)

    def __init__(self, items: Iterable[Any]) -> None:
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Any]:
        for item in self._items:
            _tick()
            yield item


def _bounded_range(*args: int) -> range:
    _tick()
    numbers = range(*args)
    if len(numbers) > MAX_RANGE:
        raise TemplateLimitError(f"range() of {len(numbers):,} numbers is more than the "
                                 f"{MAX_RANGE:,} a template may loop over")
    return numbers
