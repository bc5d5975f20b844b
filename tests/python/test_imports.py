"""The package's import graph (python/comfuse, read with ast, nothing imported): no cycles, and no imports of the
package's own modules inside functions, but in __init__ (which keeps `import comfuse` free of torch) and of the
compiled extensions (_core, _torch_ops) and the package's version."""
import ast
import os

PKG = os.path.join(os.path.dirname(__file__), "..", "..", "python", "comfuse")
EXTENSIONS = {"_core", "_torch_ops", "__version__"}


def _modules():
    return sorted(f[:-3] for f in os.listdir(PKG) if f.endswith(".py"))


def _imports(module):
    """(imported module, inside a function) for every import of a package module in `module`."""
    tree = ast.parse(open(os.path.join(PKG, module + ".py")).read())
    out = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.ImportFrom) and (child.level >= 1 or (child.module or "").startswith("comfuse")):
                parts = (child.module or "").split(".")
                if child.level == 0:
                    parts = parts[1:]
                names = [parts[0]] if parts and parts[0] else [a.name for a in child.names]
                out.extend((n, in_function) for n in names)
            elif isinstance(child, ast.Import):
                out.extend((a.name.split(".")[1], in_function) for a in child.names if a.name.startswith("comfuse."))
            visit(child, inner)

    visit(tree, False)
    return out


def test_the_package_has_no_import_cycle():
    mods = set(_modules())
    graph = {m: sorted({n for n, _ in _imports(m) if n in mods and n not in EXTENSIONS and n != "__init__"})
             for m in mods}
    state = {}

    def cycle_from(m, path):
        state[m] = 1
        for n in graph[m]:
            if state.get(n) == 1:
                return path + [m, n]
            if n not in state and (c := cycle_from(n, path + [m])):
                return c
        state[m] = 2
        return None

    for m in sorted(mods):
        if m not in state:
            c = cycle_from(m, [])
            assert c is None, "import cycle: " + " -> ".join(c[c.index(c[-1]):])


def test_no_module_imports_the_package_inside_a_function():
    lazy = {m: sorted({n for n, inside in _imports(m) if inside and n not in EXTENSIONS}) for m in _modules()
            if m != "__init__"}
    assert not {m: v for m, v in lazy.items() if v}, lazy


def test_the_check_sees_a_cycle(tmp_path, monkeypatch):
    # (the test above can fail: two modules importing each other are reported)
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from . import a\n")
    monkeypatch.setattr(__import__(__name__), "PKG", str(tmp_path))
    import pytest
    with pytest.raises(AssertionError, match="import cycle"):
        test_the_package_has_no_import_cycle()


def test_the_inductor_options_module_imports_nothing_of_the_package():
    assert [n for n, _ in _imports("inductor_options")] == []
