"""Which files are source code, and the language their Markdown fence names."""

from __future__ import annotations

from pathlib import PurePath

_BY_SUFFIX = {
    ".py": "python", ".pyi": "python", ".ipynb": "json",
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".jsx": "jsx",
    ".ts": "typescript", ".tsx": "tsx", ".vue": "vue", ".svelte": "svelte",
    ".java": "java", ".kt": "kotlin", ".kts": "kotlin", ".scala": "scala", ".groovy": "groovy",
    ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".hpp": "cpp",
    ".hh": "cpp", ".cu": "cuda", ".cs": "csharp", ".fs": "fsharp", ".go": "go", ".rs": "rust",
    ".swift": "swift", ".m": "objectivec", ".mm": "objectivec", ".dart": "dart", ".zig": "zig",
    ".rb": "ruby", ".php": "php", ".pl": "perl", ".lua": "lua", ".r": "r", ".jl": "julia",
    ".hs": "haskell", ".ml": "ocaml", ".ex": "elixir", ".exs": "elixir", ".erl": "erlang",
    ".clj": "clojure", ".lisp": "lisp", ".el": "elisp", ".nim": "nim", ".v": "verilog",
    ".sh": "bash", ".bash": "bash", ".zsh": "zsh", ".fish": "fish", ".ps1": "powershell",
    ".bat": "batch", ".cmd": "batch", ".sql": "sql", ".graphql": "graphql", ".proto": "protobuf",
    ".json": "json", ".jsonl": "json", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml",
    ".ini": "ini", ".cfg": "ini", ".xml": "xml", ".svg": "xml", ".css": "css", ".scss": "scss",
    ".less": "less", ".tf": "hcl", ".cmake": "cmake", ".gradle": "groovy", ".diff": "diff",
    ".patch": "diff", ".tex": "latex",
}
_BY_NAME = {
    "dockerfile": "dockerfile", "containerfile": "dockerfile", "makefile": "makefile",
    "gnumakefile": "makefile", "cmakelists.txt": "cmake", "justfile": "just",
}


def code_language(name: str) -> str | None:
    """The fence language of a source file called `name`; None when it is not source code."""
    path = PurePath(name)
    return _BY_NAME.get(path.name.lower()) or _BY_SUFFIX.get(path.suffix.lower())
