"""Finding circuits with interp's public API: head types, the IOI circuit, edge circuits, ICL."""

import interp

if getattr(interp, "__file__", None) is None:  # a folder named interp without __init__.py
    raise ImportError(
        f"`import interp` found the folder {next(iter(interp.__path__))}, not the interp package: a "
        "folder named interp in the current directory (a clone of the repository?) hides an editable "
        "install. Run from another directory, or install the clone as `make` does: "
        "pip install -e CLONE --config-settings editable_mode=compat"
    )
