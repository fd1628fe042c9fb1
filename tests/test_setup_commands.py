"""README's set-up and test commands, .ci/run and the package metadata stay in step (no build, no GPU)."""
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(*parts):
    with open(os.path.join(REPO, *parts), encoding="utf-8") as f:
        return f.read()


def readme_setup_commands():
    """The lines of the fenced bash block in README's Set-up section."""
    section = _read("README.md").split("\n## Set-up\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```bash\n(.*?)^```", section, re.S | re.M)
    assert block, "README's Set-up section has no ```bash block"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def ci_lines():
    """.ci/run's command lines, comments and blank lines left out."""
    lines = (line.strip() for line in _read(".ci", "run").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def test_readme_setup_is_one_setup_and_one_test_command():
    setup, test = readme_setup_commands()
    assert "pip install --no-build-isolation -e " in setup and "[test]" in setup
    assert test.startswith("python -m pytest tests")


def test_ci_runs_readme_commands_verbatim_and_in_order():
    commands, lines = readme_setup_commands(), ci_lines()
    for command in commands:
        assert lines.count(command) == 1, f".ci/run should run README's {command!r} once, verbatim"
    positions = [lines.index(command) for command in commands]
    assert positions == sorted(positions)


def test_ci_builds_only_through_readme_setup_command():
    setup = readme_setup_commands()[0]
    for line in ci_lines():
        if line == setup:
            continue
        assert "setup.py" not in line and "CPATH" not in line, line
        assert not re.search(r"pip install .*(-e|\.\[|\s\.(\s|$))", line), f"a second install of the package: {line}"


def test_pyproject_version_is_package_version_and_python_floor_is_readme_s():
    pyproject = _read("pyproject.toml")
    version = re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1)
    package = re.search(r'^__version__ = "([^"]+)"', _read("flashattn", "__init__.py"), re.M).group(1)
    assert version == package
    floor = re.search(r'^requires-python = ">=(\d+\.\d+)"', pyproject, re.M).group(1)
    assert f"Python {floor}+" in _read("README.md").split("\n## Set-up\n", 1)[1].split("\n## ", 1)[0]
