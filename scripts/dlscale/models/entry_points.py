"""The entry points of the `dlscale.models` group (docs/pages/your-model.md): a package registers
a model builder there, as pytest finds its plugins. Found and imported from the packages'
metadata, before torch starts (dlscale.models.zoo_probe) and in a rank that builds the model
(dlscale.models.torch.zoo). Standard library only."""

from __future__ import annotations

import sys
from importlib import metadata

from dlscale.registry.model_sources import ENTRY_POINT_GROUP


def installed_entry_points() -> list[dict]:
    """The entry points of the group installed in this environment, by name: each one's value
    and the distribution (name, version) that registers it."""
    out = []
    for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        dist = ep.dist
        out.append(
            {
                "entry_point": ep.name,
                "value": ep.value,
                "distribution": dist.name if dist else None,
                "version": dist.version if dist else None,
            }
        )
    return out


def find_entry_point(name: str) -> metadata.EntryPoint:
    """The entry point `name` of the dlscale.models group in this environment."""
    found = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        installed = sorted({ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)})
        raise LookupError(
            f"no entry point {name!r} in group {ENTRY_POINT_GROUP!r} in the environment "
            f"{sys.prefix}; installed: {', '.join(installed) or 'none'} (a package registers "
            f'one in its pyproject.toml: [project.entry-points."{ENTRY_POINT_GROUP}"])'
        )
    if len(found) > 1:
        dists = ", ".join(f"{ep.dist.name} {ep.dist.version}" for ep in found if ep.dist)
        raise LookupError(f"entry point {name!r} is registered twice ({dists}); uninstall one")
    return found[0]


def load_builder(ep: metadata.EntryPoint):
    """The builder an entry point names, imported (the user's package: any failure to import
    it is reported with the package's name and version)."""
    try:
        return ep.load()
    except Exception as exc:  # noqa: BLE001 - the user's package: any import failure is its
        dist = ep.dist
        raise RuntimeError(
            f"entry point {ep.name!r} ({ep.value}) of "
            f"{dist.name + ' ' + dist.version if dist else 'an unknown package'} cannot be "
            f"imported: {type(exc).__name__}: {exc}"
        ) from exc
