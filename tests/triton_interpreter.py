"""Triton's interpreter (TRITON_INTERPRET=1, where the tests run the Triton kernels without a
GPU), made to patch triton.language once a launch rather than at every helper call.

Triton 3's interpreter patches triton.language for itself when a kernel launches and undoes it
when the launch ends; it also patches it again at every call of a @triton.jit helper inside the
kernel (each program, each loop iteration), walking the modules' members with inspect.getmembers
each time, which finds them patched already and replaces nothing of note. Those walks were ~25%
of an interpreted engine step (test_triton_quantized_linears_give_the_torch_paths_greedy_tokens:
~108 of ~430 s under cProfile). Here a helper called inside a launch keeps the launch's patches
when its triton.language modules are among the launch's; everything else is Triton's own, and
an interpreter without these internals is left as it is.
"""

from __future__ import annotations

import inspect


class _LaunchState:
    """The launch in progress: whether one is, and the language modules it patched."""

    in_launch = False
    patched: frozenset[int] | None = None


def patch_triton_language_once_a_launch() -> None:
    import triton.language as tl
    from triton.runtime import interpreter

    patch_lang = getattr(interpreter, "_patch_lang", None)
    scope_type = getattr(interpreter, "_LangPatchScope", None)
    executor = getattr(interpreter, "GridExecutor", None)
    if patch_lang is None or scope_type is None or executor is None:
        return
    if getattr(patch_lang, "once_a_launch", False):
        return
    launch = executor.__call__
    state = _LaunchState()

    def languages(fn) -> frozenset[int]:
        return frozenset(id(value) for value in fn.__globals__.values()
                         if inspect.ismodule(value) and value in (tl, tl.core))

    def patch_once(fn):
        modules = languages(fn)
        if state.patched is not None and modules <= state.patched:
            return scope_type()  # the launch's patches are in place: nothing to add or undo
        scope = patch_lang(fn)
        if state.in_launch and state.patched is None:
            state.patched = modules
        return scope

    def launch_once_patched(self, *args, **kwargs):
        state.in_launch, state.patched = True, None
        try:
            return launch(self, *args, **kwargs)
        finally:
            state.in_launch, state.patched = False, None

    patch_once.once_a_launch = True
    interpreter._patch_lang = patch_once
    executor.__call__ = launch_once_patched
