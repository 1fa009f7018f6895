"""carbon.country and carbon.region judged by a place lookup the caller brings (codecarbon's offline data,
energy/carbon.py's place_problems): a mistyped place must not silently become the world average."""

from __future__ import annotations

from collections.abc import Callable, Collection

from benchsuite.config.sections import CarbonConfig

PLACES = ("carbon.country", "carbon.region")
PlaceLookup = Callable[[str | None, str | None], list[tuple[str, str]]]  # (country, region) -> (key, reason)


def check_carbon(carbon: CarbonConfig, refused: Collection[str], where: str, problems: list[tuple[str, str]],
                 places: PlaceLookup) -> set[str]:
    """Each problem `places` finds with carbon's country/region, appended under `where`. A value refused
    already ("carbon.country" in `refused`) is not judged, nor a region whose country was refused (a region
    is read within its country). Returns the keys refused ("country", "region")."""
    if "carbon.country" in refused:
        return set()
    found = places(carbon.country, None if "carbon.region" in refused else carbon.region)
    problems += [(f"{where}.{key}", reason) for key, reason in found]
    return {key for key, _ in found}
