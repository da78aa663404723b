"""TeX math in a line of text as plain text a title can show: "$\\frac{a}{b}$" reads "a/b",
"$x^2 \\leq \\sqrt{y}$" reads "x² ≤ √y". Only math between delimiters ($…$, $$…$$, \\(…\\),
\\[…\\]) is rewritten; a dollar amount ("$5 and $10") is not math. Whatever cannot be rendered
in plain text keeps a readable form ("x^(n+1)")."""

from __future__ import annotations

import re

_MATH = re.compile(
    r"\$\$(?P<display>.+?)\$\$"
    r"|\\\[(?P<bracket>.+?)\\\]"
    r"|\\\((?P<paren>.+?)\\\)"
    # Inline $…$ as pandoc reads it: no space inside either dollar, no digit right after the
    # closing one, so prices stay text.
    r"|(?<![\\$])\$(?P<inline>[^\s$](?:[^$\n]*?[^\s$\\])?)\$(?!\d)",
    re.DOTALL)
_INSIDE_BRACKETS = re.compile(r"(?<=[(\[⟨]) | (?=[)\]⟩])")
MAX_DEPTH = 32  # groups and arguments nested deeper are shown as written

SYMBOLS = {
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ε", "varepsilon": "ε",
    "zeta": "ζ", "eta": "η", "theta": "θ", "vartheta": "ϑ", "iota": "ι", "kappa": "κ",
    "lambda": "λ", "mu": "μ", "nu": "ν", "xi": "ξ", "pi": "π", "rho": "ρ", "sigma": "σ",
    "tau": "τ", "upsilon": "υ", "phi": "φ", "varphi": "φ", "chi": "χ", "psi": "ψ",
    "omega": "ω", "Gamma": "Γ", "Delta": "Δ", "Theta": "Θ", "Lambda": "Λ", "Xi": "Ξ",
    "Pi": "Π", "Sigma": "Σ", "Phi": "Φ", "Psi": "Ψ", "Omega": "Ω",
    "times": "×", "cdot": "·", "div": "÷", "pm": "±", "mp": "∓", "leq": "≤", "le": "≤",
    "geq": "≥", "ge": "≥", "neq": "≠", "ne": "≠", "approx": "≈", "equiv": "≡", "sim": "∼",
    "propto": "∝", "infty": "∞", "partial": "∂", "nabla": "∇", "sum": "∑", "prod": "∏",
    "int": "∫", "oint": "∮", "in": "∈", "notin": "∉", "subset": "⊂", "subseteq": "⊆",
    "cup": "∪", "cap": "∩", "emptyset": "∅", "forall": "∀", "exists": "∃", "neg": "¬",
    "land": "∧", "lor": "∨", "to": "→", "rightarrow": "→", "leftarrow": "←",
    "Rightarrow": "⇒", "Leftarrow": "⇐", "leftrightarrow": "↔", "Leftrightarrow": "⇔",
    "implies": "⇒", "iff": "⇔", "mapsto": "↦", "ldots": "…", "cdots": "⋯", "dots": "…",
    "circ": "∘", "degree": "°", "angle": "∠", "perp": "⊥", "parallel": "∥", "hbar": "ħ",
    "ell": "ℓ", "langle": "⟨", "rangle": "⟩", "lfloor": "⌊", "rfloor": "⌋", "lceil": "⌈",
    "rceil": "⌉", "{": "{", "}": "}", "$": "$", "%": "%", "&": "&", "#": "#", "_": "_",
    "|": "‖", "\\": " ", ",": " ", ";": " ", ":": " ", " ": " ", "quad": " ", "qquad": " ",
    "!": "",
}
TEXT_COMMANDS = {"text", "textrm", "textbf", "textit", "mathrm", "mathbf", "mathit", "mathsf",
                 "mathtt", "operatorname", "boldsymbol", "bm", "mbox", "mathcal", "vec", "hat",
                 "bar", "overline", "tilde", "dot", "ddot"}
SIZES = {"left", "right", "big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr",
         "displaystyle", "textstyle", "limits", "nolimits"}
FRACTIONS = {"frac", "dfrac", "tfrac", "cfrac"}
DOUBLE_STRUCK = dict(zip("RNZQC", "ℝℕℤℚℂ", strict=True))
SUPERSCRIPTS = dict(zip("0123456789+-=()ni", "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿⁱ", strict=True))
SUBSCRIPTS = dict(zip("0123456789+-=()aeioxnmkt", "₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎ₐₑᵢₒₓₙₘₖₜ", strict=True))


def plain_math(text: str) -> str:
    """`text` with each delimited math span as plain text."""
    return _MATH.sub(lambda m: _Reader(next(g for g in m.groups() if g is not None)).text(),
                     text)


class _Reader:
    """Reads one span of TeX math, left to right, into plain text."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.at = 0

    def text(self) -> str:
        spaced = " ".join(self._until(None, 0).split())
        return _INSIDE_BRACKETS.sub("", spaced)

    def _until(self, closing: str | None, depth: int) -> str:
        out: list[str] = []
        while self.at < len(self.source) and self.source[self.at] != closing:
            out.append(self._piece(depth))
        self.at += 1  # past the closing brace (or the end)
        return "".join(out)

    def _piece(self, depth: int) -> str:
        char = self.source[self.at]
        self.at += 1
        if depth >= MAX_DEPTH:  # nested too deep to read: as written
            return char
        if char == "\\":
            return self._command(depth)
        if char in "^_":
            return _script(self._argument(depth), char)
        if char == "{":
            return self._group(depth)
        if char in "}&~":
            return " " if char != "}" else ""
        return char

    def _group(self, depth: int) -> str:
        """After an opening brace: its content, read."""
        return self._until("}", depth + 1)

    def _argument(self, depth: int) -> str:
        """A command's argument: a braced group, a command, or one character."""
        while self.at < len(self.source) and self.source[self.at] == " ":
            self.at += 1
        if self.at >= len(self.source):
            return ""
        return self._piece(depth + 1)

    def _command(self, depth: int) -> str:
        name = self._name()
        if name in SYMBOLS:
            return SYMBOLS[name]
        if name in FRACTIONS:
            numerator = self._argument(depth)
            return f"{_wrapped(numerator)}/{_wrapped(self._argument(depth))}"
        if name == "sqrt":
            return self._root(depth)
        if name in TEXT_COMMANDS:
            return self._argument(depth)
        if name == "mathbb":
            return "".join(DOUBLE_STRUCK.get(c, c) for c in self._argument(depth))
        if name in SIZES:
            if self.source[self.at:self.at + 1] == ".":  # \left. : no delimiter
                self.at += 1
            return ""
        # \sin, \log, \max: their own names, set apart from a name or command that follows
        follows = self.source[self.at:self.at + 1]
        return f"{name} " if follows.isalnum() or follows == "\\" else name

    def _name(self) -> str:
        start = self.at
        while self.at < len(self.source) and self.source[self.at].isalpha():
            self.at += 1
        if self.at == start and self.at < len(self.source):
            self.at += 1  # a one-character command: \, \{ \\
        return self.source[start:self.at]

    def _root(self, depth: int) -> str:
        index = ""
        if self.source[self.at:self.at + 1] == "[":
            end = self.source.find("]", self.at)
            if end > 0:
                index = _Reader(self.source[self.at + 1:end]).text()
                self.at = end + 1
        return f"{_script(index, '^') if index else ''}√{_wrapped(self._argument(depth))}"


def _wrapped(part: str) -> str:
    """`part` as one operand: in parentheses unless it is a single number, name or symbol."""
    part = part.strip()
    return part if len(part) <= 1 or part.isalnum() else f"({part})"


def _script(part: str, mark: str) -> str:
    """A superscript (^) or subscript (_) in Unicode's small figures where it has them all."""
    part = part.strip()
    table = SUPERSCRIPTS if mark == "^" else SUBSCRIPTS
    if part and all(c in table for c in part):
        return "".join(table[c] for c in part)
    if len(part) > 1:
        return f"{mark}({part})"
    return f"{mark}{part}"
