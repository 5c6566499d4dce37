"""tools/mutation_check.py: every deliberate bug still applies to the code it names (a
mutation whose text moved away would be reported STALE, i.e. no check at all)."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location(
        "mutation_check", ROOT / "tools" / "mutation_check.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses resolve their module while it loads
    spec.loader.exec_module(mod)
    return mod


def test_every_mutation_patches_its_text_once_and_names_existing_tests():
    tool = _tool()
    assert tool.MUTATIONS
    for m in tool.MUTATIONS:
        source = (ROOT / m.path).read_text()
        assert source.count(m.old) == 1, (
            f"{m.name}: {m.path} holds its text {source.count(m.old)} times"
        )
        assert m.old != m.new, m.name
        for test in m.tests:
            assert (ROOT / test.split("::")[0]).is_file(), f"{m.name}: no {test}"
