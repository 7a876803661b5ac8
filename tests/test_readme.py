"""The README has exactly two set-up commands, and CI runs the test command verbatim."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    return [line.strip() for line in lines if line.startswith("    python -m pip install")]


def test_readme_has_a_demo_and_a_test_command():
    commands = _commands()
    assert len(commands) == 2
    assert commands[0].endswith("python examples/quickstart.py")
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line and not line.startswith(("#", "set ", "cd "))
    ]
    assert ci == [_commands()[1]]
