"""The `bayesurl` command: every subcommand has --help, unknown commands fail."""

import subprocess
import sys

import pytest

from bayesurl.cli import _subcommands, build_parser, main

EXPECTED = {"benchmark", "evaluate", "run", "train", "wrap"}


def test_expected_subcommands_exist():
    assert EXPECTED <= set(_subcommands())


@pytest.mark.parametrize("name", sorted(_subcommands()))
def test_every_subcommand_has_help(name, capsys):
    with pytest.raises(SystemExit) as exc:
        main([name, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert f"usage: bayesurl {name}" in out


def test_unknown_subcommand_fails(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code != 0
    assert "invalid choice" in capsys.readouterr().err


def test_console_entry_point_runs():
    proc = subprocess.run(
        [sys.executable, "-m", "bayesurl", "--help"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and "COMMAND" in proc.stdout
    assert build_parser().prog == "bayesurl"


# ---- user errors are one line on stderr, exit status 2, traceback behind --debug


def _npz(path, **arrays):
    import numpy as np

    np.savez(path, **arrays)
    return str(path)


def _good_npz(tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    return _npz(
        tmp_path / "x.npz",
        embeddings=rng.normal(size=(20, 4)).astype("float32"),
        labels=np.repeat(np.arange(4), 5),
    )


def _one_line_error(capsys, argv):
    try:
        code = main(argv)
    except SystemExit as exc:  # argument errors (e.g. --device) exit from argparse
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_user_error_is_one_line_and_exit_2(tmp_path, capsys):
    err = _one_line_error(capsys, ["evaluate", str(tmp_path / "missing.npz")])
    assert err.startswith("bayesurl evaluate: error:") and "missing.npz" in err


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(FileNotFoundError):
        main(["--debug", "evaluate", str(tmp_path / "missing.npz")])
    with pytest.raises(FileNotFoundError):
        main(["evaluate", "--debug", str(tmp_path / "missing.npz")])


def test_argument_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["evaluate", "--ks", "two"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--ks" in err and "usage" not in err


def test_main_catches_every_user_error_kind(monkeypatch, capsys):
    import bayesurl.commands.evaluate as ev
    from bayesurl.cli import UsageError

    for exc in (
        ValueError("`x` bad\nsecond line"),
        TypeError("`y` wrong type"),
        FileNotFoundError(2, "No such file or directory", "/nope"),
        IsADirectoryError(21, "Is a directory", "/tmp"),
        KeyError("unknown key `z`"),
        UsageError("give INPUT"),
    ):

        def boom(args, exc=exc):
            raise exc

        monkeypatch.setattr(ev, "run", boom)
        err = _one_line_error(capsys, ["evaluate", "x.npz"])
        assert "bayesurl evaluate: error:" in err
    # a programming error is not a user error: it keeps its traceback
    monkeypatch.setattr(ev, "run", lambda args: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        main(["evaluate", "x.npz"])


def _with_device():
    parser = build_parser()
    sub = next(
        a for a in parser._actions if isinstance(a, __import__("argparse")._SubParsersAction)
    )
    return sorted(n for n, p in sub.choices.items() if any(a.dest == "device" for a in p._actions))


@pytest.mark.parametrize("name", _with_device())
def test_every_subcommand_checks_its_device_first(name, capsys):
    # validated while parsing, before any data are loaded or anything is trained
    err = _one_line_error(capsys, [name, "--device", "bogus"])
    assert "argument --device: 'bogus' is not a device" in err


def test_evaluate_bad_device_is_one_line(tmp_path, capsys):
    good = _good_npz(tmp_path)
    err = _one_line_error(capsys, ["evaluate", good, "--device", "bogus"])
    assert "--device" in err
    if not __import__("torch").cuda.is_available():
        err = _one_line_error(capsys, ["evaluate", good, "--device", "cuda"])
        assert "--device" in err and "CUDA" in err


def test_evaluate_json_into_a_folder_is_refused_before_work(tmp_path, capsys):
    good = _good_npz(tmp_path)
    err = _one_line_error(capsys, ["evaluate", good, "--json", str(tmp_path)])
    assert "--json" in err and "folder" in err
    # nothing printed to stdout: the check ran before the evaluation
    assert capsys.readouterr().out == ""


def test_help_texts_have_no_restructuredtext_markup(capsys):
    import re

    for name in sorted(_subcommands()):
        with pytest.raises(SystemExit):
            main([name, "--help"])
        out = capsys.readouterr().out
        assert not re.search(r":(func|class|mod|meth|attr|data|doc|ref):`", out), (name, out)
        assert "``" not in out, (name, out)
        assert not re.search(r"\w::\s*$", out, flags=re.M), (name, out)


def test_rst_to_text():
    from bayesurl.cli import rst_to_text

    doc = """Title line.

    See :func:`~bayesurl.benchmark.run_benchmark` and :class:`bayesurl.x.Y`, ``--out``,
    :doc:`the guide <getting_started>`.

    - first item that is long enough to wrap around the narrow width given below here
    - second

    Example::

        bayesurl train --out ``runs``
    """
    text = rst_to_text(doc, width=40)
    assert "run_benchmark and bayesurl.x.Y, --out," in " ".join(text.split())
    assert "the guide." in text
    assert "Example:\n\n    bayesurl train --out ``runs``" in text  # literal kept verbatim
    assert all(len(line) <= 40 for line in text.splitlines() if not line.startswith("    "))
    assert "\n  " in text.split("- first")[1].split("- second")[0]  # hanging indent


def test_evaluate_npz_with_misspelt_arrays_is_refused(tmp_path, capsys):
    import numpy as np

    rng = np.random.default_rng(0)
    base = {
        "embeddings": rng.normal(size=(20, 4)).astype("float32"),
        "labels": np.repeat(np.arange(4), 5),
    }
    for wrong in ("uncertainty", "sample"):
        path = _npz(tmp_path / f"{wrong}.npz", **base, **{wrong: rng.random(20)})
        err = _one_line_error(capsys, ["evaluate", path])
        assert f"'{wrong}'" in err and "uncertainties" in err  # names it, lists the known ones


def test_output_options_declared_by_a_subcommand_are_checked_while_parsing(
    tmp_path, monkeypatch, capsys
):
    # the mechanism train / benchmark / wrap use: OUTPUT_DIRS / OUTPUT_FILES in the module
    import bayesurl.commands.train as train

    monkeypatch.setattr(train, "OUTPUT_DIRS", ("out",), raising=False)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    ran = []
    monkeypatch.setattr(train, "run", lambda args: ran.append(args) or 0)
    err = _one_line_error(capsys, ["train", "--method", "ce", "--out", str(a_file)])
    assert "argument --out:" in err and "is a file" in err and not ran
    assert main(["train", "--method", "ce", "--out", str(tmp_path / "new")]) == 0 and ran


def test_benchmark_help_lists_every_preset(capsys) -> None:
    """``make run`` uses pretrained_quick: ``--help`` names it and every other preset of the
    default recipe, each of the recipes' presets read from the TOML files."""
    from bayesurl.runs.config import list_recipes, read_recipe_file

    with pytest.raises(SystemExit):
        main(["benchmark", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    presets = set(read_recipe_file("fashion_mnist")["presets"])
    assert {"pretrained_quick", "pretrained", "quick", "smoke"} <= presets
    for preset in presets:
        assert preset in text, preset
    assert list_recipes()  # the recipe files the presets come from are found
