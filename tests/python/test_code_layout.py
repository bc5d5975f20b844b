"""The code's rooms stay readable: no file in src/ over 900 lines, no function in src/ over 120 lines and none in
kernels/ over 150. Functions are found by matching braces in the source with comments and literals blanked: a
brace whose head ends in a parameter list (and is no if/for/while/switch/catch) opens a function, and the
outermost such function is measured from the line of that brace to the line of its closing one."""
import os
import re

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
FILE_LINES = 900
FUNCTION_LINES = {"src": 120, "kernels": 150}
SOURCE = re.compile(r"\.(cpp|h|hpp|cu|cuh)$")
CONTROL = {"if", "for", "while", "switch", "catch", "return"}
HEAD_NAME = re.compile(r"([\w:~<>]+)\s*\([^()]*(?:\([^()]*\)[^()]*)*\)\s*(?:const|noexcept|override|final|mutable|\s)*"
                       r"(?:->[^{]*)?$")


def _sources(folder):
    for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
        for f in sorted(files):
            if SOURCE.search(f):
                yield os.path.join(dirpath, f)


def _blank(text):
    """Comments, string and character literals blanked, line breaks kept."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'R"(\w*)\((?:.|\n)*?\)\1"', lambda m: '""' + "\n" * m.group(0).count("\n"), text)
    text = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)
    return re.sub(r"'(?:\\.|[^'\\\n])+'", "''", text)


def functions(text):
    """(name, first line, lines) of every outermost function body in C++/CUDA source text."""
    text = _blank(text)
    stack, found, line = [], [], 1
    for i, ch in enumerate(text):
        if ch == "\n":
            line += 1
        elif ch == "{":
            head = re.split(r"[;{}]", text[max(0, i - 400):i])[-1].strip()
            m = HEAD_NAME.search(head)
            name = m.group(1) if m else None
            stack.append((line, name if name and name not in CONTROL else None))
        elif ch == "}" and stack:
            first, name = stack.pop()
            if name and not any(n for _, n in stack):
                found.append((name, first, line - first + 1))
    return found


def test_the_scanner_finds_functions_and_their_lengths():
    text = "namespace a {\nint f(int x) {\n  if (x) {\n    return 1;\n  }\n  auto g = [](int y) { return y; };\n" \
           "  return 0;  // }\n}\nstruct S {\n  void m() const {\n  }\n};\n}\n"
    assert functions(text) == [("f", 2, 7), ("m", 10, 2)]


def test_no_source_file_over_900_lines():
    lines = {p: len(open(p, encoding="utf-8").readlines()) for p in _sources("src")}
    long = [f"{os.path.relpath(p, ROOT)}: {n}" for p, n in lines.items() if n > FILE_LINES]
    assert not long, f"files over {FILE_LINES} lines: split them by what they do:\n" + "\n".join(long)


def test_no_function_over_its_length():
    long, seen = [], 0
    for folder, limit in FUNCTION_LINES.items():
        for p in _sources(folder):
            for name, first, n in functions(open(p, encoding="utf-8").read()):
                seen += 1
                if n > limit:
                    long.append(f"{os.path.relpath(p, ROOT)}:{first} {name}: {n} lines (at most {limit})")
    assert seen > 500, f"the scanner found only {seen} functions"
    assert not long, "functions too long to read at once: name their phases:\n" + "\n".join(long)
