"""The arguments the commands share say what they take: `--target` is an OpenVINO folder (TARGET_DIR)
for every command but `run`, which also builds one from a GGUF, a hub name or a checkpoint (TARGET)."""

from gguf2ov.cli import app


def _target_options() -> dict:
    parser = app.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return {name: next(a for a in command._actions if "--target" in a.option_strings)
            for name, command in sub.choices.items() if "--target" in command._option_string_actions}


def test_target_names_what_each_command_takes():
    options = _target_options()
    assert set(options) == {"convert", "check", "export", "verify", "drift", "accept", "ovms", "run"}
    run = options.pop("run")
    assert run.metavar == "TARGET"
    for form in ("OpenVINO folder", "GGUF file", "hub name org/repo[:QUANT]", "checkpoint folder", "OUT/target"):
        assert form in run.help, form
    for name, option in options.items():
        assert option.metavar == "TARGET_DIR" and "OpenVINO folder" in option.help, (name, option.help)
        assert "GGUF file" not in option.help and "checkpoint folder" not in option.help, (name, option.help)
