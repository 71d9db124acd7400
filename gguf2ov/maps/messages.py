"""How the map machinery names values, lists and flags in its one-line errors."""

MAX_LISTED = 10  # names shown in one listing of an error message


def capped(names, limit: int = MAX_LISTED) -> str:
    """Comma-separated names, at most `limit` of them, then "... and K more"."""
    names = list(names)
    text = ", ".join(_clip(str(n)) for n in names[:limit])
    return text + (f", ... and {len(names) - limit} more" if len(names) > limit else "")


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else f"{text[:limit - 20]}...({len(text)} chars)"


def short(value, limit: int = 60) -> str:
    """repr(value) for a message, at most `limit` characters (a value from a file can be any size)."""
    if isinstance(value, list) and len(value) > limit:  # a value from a file can be any length
        text = repr(value[:limit])[:-1] + f", ... ({len(value)} items)]"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def layers_text(layers: list[int]) -> str:
    if not layers:
        return "no layer"
    if layers == list(range(len(layers))):
        return f"layers 0..{layers[-1]}" if len(layers) > 1 else "layer 0"
    return f"layers {capped(layers)}"


def flag_option(flag: str) -> str:
    """The command-line option of a rule's `flag`."""
    return "--" + flag.replace("_", "-")
