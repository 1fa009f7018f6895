"""What makes records measurements of one run, and how a run is named.

A run identity is the resolved config less what does not change what is measured (its description,
the kill limit) and less the seed, plus the hardware it ran on (the ranks' device names and the
threads per rank). The records of one identity are its seeds; the records of one seed, its repeats.
Every view groups records this way (results/model.py), and names a record by all three parts:
"dense · w2 · seed 1 · repeat 0".
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import msgspec

from benchsuite.record.names import digest
from benchsuite.record.sections import hashed
from benchsuite.record.types import Config, Record
from benchsuite.record.values import dig

TEXT_ONLY = (("description",), ("train", "timeout_s"))  # said or enforced, never measured
SEED = ("train", "seed")
ROUTING = ("moe", "routing")  # learned or forced: what a routing pair differs by (results/routing.py)
# What a site chooses, not the workload: two clusters in two countries run one workload (compare).
SITE_SETTINGS = (("energy",), ("carbon",))


def without(config: Config | dict, paths) -> dict:
    """The config as JSON values, with each dotted path (a tuple of keys, two at most) removed; config: the typed
    config, or its JSON values where a reader has them (left as they are)."""
    cfg = ({k: dict(v) if isinstance(v, dict) else v for k, v in config.items()} if isinstance(config, dict)
           else msgspec.to_builtins(config))
    for path in paths:
        parent = dig(cfg, *path[:-1]) if len(path) > 1 else cfg
        if isinstance(parent, dict):
            parent.pop(path[-1], None)
    return cfg


def seed_of(rec: Record) -> int:
    """The record's train.seed (0 for a record without one)."""
    train = rec.config.train
    return train.seed if train is not None and train.seed is not None else 0


def hardware_of(rec: Record) -> dict:
    """What a run ran on: the ranks' device types and names, and the threads per rank."""
    names = sorted({f"{d.type}: {d.name}" for d in rec.env.devices or []})
    return {"devices": ", ".join(names) or None, "threads_per_rank": rec.env.threads_per_rank}


def run_identity(rec: Record, config: dict | None = None) -> str:
    """The identity of rec's run: hash of its config less TEXT_ONLY and the seed, and its hardware. config: the
    record's config as JSON values, where the caller has them (a reader making rows: not converted again)."""
    cfg = rec.config if config is None else config
    return digest({"config": hashed(without(cfg, (*TEXT_ONLY, SEED))), "hardware": hardware_of(rec)})


def routing_identity(rec: Record, config: dict | None = None) -> str | None:
    """An MoE run's identity less its moe.routing: the learned and the forced runs of one configuration share it
    (results/routing.py pairs them); None for a dense run. config: as run_identity's."""
    if rec.config.moe is None:
        return None
    cfg = rec.config if config is None else config
    return digest({"config": hashed(without(cfg, (*TEXT_ONLY, SEED, ROUTING))), "hardware": hardware_of(rec)})


def hardware_label(records: list[Record]) -> str:
    """'2× NVIDIA H100 80GB HBM3', with ', 2 threads per rank' where the record states them (a part of the run
    as much as the devices: the likeliest cause of a CPU run's change), from each record's devices; records
    on different hardware are all named, joined by '; '."""
    labels = []
    for rec in records:
        names = Counter(str(dev.name) for dev in rec.env.devices or [])
        label = " + ".join(f"{n}× {name}" for name, n in names.items()) or "unknown"
        threads = rec.env.threads_per_rank
        if threads is not None:
            label += f", {threads} thread{'s' if threads != 1 else ''} per rank"
        if label not in labels:
            labels.append(label)
    return "; ".join(labels)


def seeds_text(seeds: list[int]) -> str:
    """'0', '0, 1, 2': the seeds of a run as its rows and labels show them."""
    return ", ".join(str(s) for s in sorted(seeds))


def config_keys() -> list[str]:
    """Every dotted key of a resolved config (config.RunConfig and its sections), for --ignore."""
    from benchsuite.config import SECTIONS, RunConfig

    keys = []
    for f in msgspec.structs.fields(RunConfig):
        if f.name in SECTIONS:
            keys.append(f.name)
            keys += [f"{f.name}.{g.name}" for g in msgspec.structs.fields(SECTIONS[f.name])]
        else:
            keys.append(f.name)
    return keys


def ignored_paths(keys: list[str]) -> list[tuple[str, ...]]:
    """--ignore KEY,... as config paths; ValueError naming an unknown key and the valid ones."""
    valid = config_keys()
    unknown = [k for k in keys if k not in valid]
    if unknown:
        raise ValueError(f"unknown config key(s) {', '.join(repr(k) for k in unknown)}; a key is a dotted path of "
                         f"the resolved config, e.g. train.seed, parallel.tensor, model.layers")
    return [tuple(k.split(".")) for k in keys]


def _shown(value: Any) -> str:
    """A config value in a label: text as it is, anything else as JSON (null, true, 2, [1, 2])."""
    return value if isinstance(value, str) else json.dumps(value, default=str)


def told_apart(labels: dict[str, str], configs: dict[str, dict]) -> dict[str, str]:
    """Each label made unique where several keys share one: the config keys whose values differ among them,
    with each one's value ('dense · w2 · train.precision bf16'). The one way every view names what tells a
    run from its neighbours (routing, precision, any swept key), rather than a hash a person cannot read."""
    groups: dict[str, list[str]] = {}
    for key, label in labels.items():
        groups.setdefault(label, []).append(key)
    out = dict(labels)
    for label, keys in groups.items():
        if len(keys) < 2:
            continue
        first = configs[keys[0]]
        differ = sorted({k for other in keys[1:] for k in differing_keys(first, configs[other])})
        for key in keys:
            said = ", ".join(f"{k} {_shown(dig(configs[key], *k.split('.')))}" for k in differ)
            out[key] = f"{label} · {said}" if said else label
    return out


def differing_keys(a: dict, b: dict, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two configs (a section missing on one side counts
    as its keys)."""
    out = []
    for key in sorted(set(a) | set(b), key=str):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += differing_keys(va, vb, f"{prefix}{key}.")
        elif va != vb:
            out.append(f"{prefix}{key}")
    return out
