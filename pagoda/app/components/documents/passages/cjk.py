"""Chinese and Japanese characters, which are written without spaces between words: a regex
character class (Han ideographs, hiragana, katakana, half-width katakana) to build patterns from."""

CJK_CLASS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
