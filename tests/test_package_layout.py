"""The package's module layout: the public names importable from ``flashattn``, the
``flashattn.functional`` alias, and no module importing another module's private names."""
import ast
import importlib
import os

import flashattn

PACKAGE_DIR = os.path.dirname(os.path.abspath(flashattn.__file__))

PUBLIC = {
    "flashattn.sdpa": ["scaled_dot_product_attention"],
    "flashattn.flash_attn_interface": ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func"],
    "flashattn.varlen": ["flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func",
                         "flash_attn_varlen_qkvpacked_func"],
    "flashattn.kvcache": ["flash_attn_with_kvcache"],
    "flashattn.reference": ["attention_reference"],
    "flashattn.ops": ["cuda_kernels_built"],
}


def test_public_names_are_the_modules_functions():
    for module_name, names in PUBLIC.items():
        module = importlib.import_module(module_name)
        for name in names:
            assert name in flashattn.__all__, name
            assert getattr(flashattn, name) is getattr(module, name), f"flashattn.{name} is not {module_name}.{name}"


def test_functional_is_an_alias_of_the_split_modules():
    from flashattn import functional

    for name in functional.__all__:
        assert getattr(functional, name) is getattr(flashattn, name)
    assert functional.MAX_HEAD_DIM == flashattn.ops.MAX_HEAD_DIM


def _python_files():
    for root, _, files in os.walk(PACKAGE_DIR):
        for name in files:
            if name.endswith(".py"):
                yield os.path.join(root, name)


def test_no_module_imports_another_modules_private_names():
    offenders = []
    for path in _python_files():
        tree = ast.parse(open(path).read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("flashattn")):
                # `from . import _C` (the extension module itself) is a module, not a private name.
                private = [a.name for a in node.names if a.name.startswith("_") and a.name != "_C"]
                if private:
                    offenders.append(f"{os.path.relpath(path, PACKAGE_DIR)}:{node.lineno}: {', '.join(private)}")
    assert not offenders, "\n".join(offenders)



def test_benchmark_code_is_not_in_the_package():
    assert not os.path.exists(os.path.join(PACKAGE_DIR, "benchmark.py"))
    assert not os.path.exists(os.path.join(PACKAGE_DIR, "charts.py"))
