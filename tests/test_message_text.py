"""Error messages of the C++ layer are built from strings only (csrc/torch/checks.h, to_text): streaming
an integer into a TORCH_CHECK message crashed the process on one torch build (two C++ runtimes in one
process), where the same message built from strings raised a RuntimeError. This scans every
TORCH_CHECK / TORCH_WARN in csrc/torch for message parts that are neither string literals nor calls
known to return text."""
import os
import re

import pytest

CSRC_TORCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc", "torch")
TEXT_VARIABLES = {"op", "name", "expected", "text", "key", "cu_name", "used_name", "max_name"}  # const char* / std::string in those files
TEXT_CALLS = ("to_text(", "std::to_string(")
TEXT_SUFFIXES = (".str()", ".c_str()", ".scalar_type()", "->scalar_type()", ".cast<std::string>()")


def _calls(source):
    """(line, [arguments]) of each TORCH_CHECK / TORCH_WARN call, split at top-level commas."""
    for match in re.finditer(r"\bTORCH_(CHECK|WARN|WARN_ONCE)\s*\(", source):
        args, current, depth, i = [], "", 1, match.end()
        while depth:
            c = source[i]
            if c == '"':
                end = i + 1
                while source[end] != '"':
                    end += 2 if source[end] == "\\" else 1
                current += source[i:end + 1]
                i = end + 1
                continue
            if c in "([{":
                depth += 1
            elif c in ")]}":
                depth -= 1
                if depth == 0:
                    break
            if c == "," and depth == 1:
                args.append(current.strip())
                current = ""
            else:
                current += c
            i += 1
        args.append(current.strip())
        first_message_arg = 1 if match.group(1) == "CHECK" else 0
        yield source[:match.start()].count("\n") + 1, args[first_message_arg:]


def _is_text(arg):
    arg = " ".join(arg.split())
    return (arg.startswith('"') or arg in TEXT_VARIABLES or arg.startswith(TEXT_CALLS)
            or arg.endswith(TEXT_SUFFIXES))


def _sources():
    return sorted(f for f in os.listdir(CSRC_TORCH) if f.endswith((".cpp", ".h")))


@pytest.mark.parametrize("name", _sources())
def test_messages_are_built_from_strings(name):
    with open(os.path.join(CSRC_TORCH, name)) as f:
        source = f.read()
    bad = [f"{name}:{line}: {arg}" for line, args in _calls(source) for arg in args if not _is_text(arg)]
    assert not bad, "message parts that are not text (wrap numbers in to_text):\n" + "\n".join(bad)


def test_the_scan_sees_a_streamed_integer():
    source = 'TORCH_CHECK(x > 0, op, ": x must be positive, got ", x);\nTORCH_CHECK(y, "fine ", to_text(y));'
    assert [[a for a in args if not _is_text(a)] for _, args in _calls(source)] == [["x"], []]
