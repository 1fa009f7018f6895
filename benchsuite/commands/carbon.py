"""`benchsuite carbon estimate|project`: plain carbon estimates, and projections from records."""

from __future__ import annotations

from benchsuite.commands.common import (COUNT, JSON, NON_NEGATIVE, POSITIVE, PUE, UsageError, err, load_results, out,
                                        overflowed, path_arg, print_json)
from benchsuite.record.kinds import source_kind
from benchsuite.terminal import grouped, printable


def add_parser(sub) -> None:
    c = sub.add_parser("carbon", help="carbon accounting: plain estimates and projections from records")
    csub = c.add_subparsers(dest="carbon_verb", required=True)
    ce = csub.add_parser("estimate", parents=[JSON], help="chips × hours × watts × PUE × grid intensity")
    ce.add_argument("--chips", type=POSITIVE, required=True, help="number of accelerators")
    ce.add_argument("--hours", type=POSITIVE, required=True, help="wall-clock hours they run")
    ce.add_argument("--watts", type=POSITIVE, required=True, help="average power per chip")
    ce.add_argument("--pue", type=PUE, default=1.0, help="data-centre PUE, >= 1 (default: 1.0)")
    _add_place(ce, "grid intensity, g CO2e per kWh")
    _add_parts(ce, "default: a GPU's share of its server (docs/explanation/carbon.md)")
    ce.set_defaults(fn=estimate)
    cp = csub.add_parser("project", parents=[JSON],
                         help="hours, kWh and t CO2e of a full training run from measured rates")
    cp.add_argument("records", type=path_arg, help="a record file or a results folder")
    cp.add_argument("--tokens", type=POSITIVE, required=True, help="tokens of the full training run")
    cp.add_argument("--devices", type=COUNT, help="devices of the full run (default: the record's world size)")
    cp.add_argument("--pue", type=PUE, help="data-centre PUE, >= 1 (default: the record's)")
    _add_place(cp, "grid intensity, g CO2e per kWh (default: the record's)")
    _add_parts(cp, "default: the record's [carbon], else a GPU's share of its server")
    cp.set_defaults(fn=project)


def _add_place(p, intensity_help: str) -> None:
    """Where the energy is drawn: a grid intensity, or a country (and region) in codecarbon's data."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("--intensity", type=NON_NEGATIVE, help=intensity_help)
    where.add_argument("--country", help="ISO 3166 alpha-3 code, looked up in codecarbon's offline data")
    p.add_argument("--region", help="region within --country (codecarbon's offline data), e.g. a US state")


PART_OPTIONS = {"market_intensity": "market_intensity_g_per_kwh", "embodied_kg": "embodied_kg_per_device",
                "lifetime_years": "device_lifetime_years", "wue": "wue_l_per_kwh",
                "water_intensity": "water_intensity_l_per_kwh"}  # option dest -> [carbon] key


def _add_parts(p, embodied_default: str) -> None:
    """The parts reported beside the location-based CO2e, never added to it."""
    g = p.add_argument_group("beside the location-based CO2e (never added to it)")
    g.add_argument("--market-intensity", type=NON_NEGATIVE, help="contractual g CO2e/kWh (market-based Scope 2)")
    g.add_argument("--embodied-kg", type=NON_NEGATIVE, help=f"manufacturing kg CO2e per device ({embodied_default})")
    g.add_argument("--lifetime-years", type=POSITIVE, help="years the embodied CO2e is spread over (default 5)")
    g.add_argument("--wue", type=NON_NEGATIVE, help="on-site water, litres per kWh of IT energy")
    g.add_argument("--water-intensity", type=NON_NEGATIVE, help="the grid's water, litres per kWh (off-site)")


# A part's product that can leave float range, by the part's key: what was multiplied, and the fix.
PART_OVERFLOWS = {"market.": ("--market-intensity × the energy", "a smaller --market-intensity"),
                  "embodied.": ("--embodied-kg × the device hours ÷ --lifetime-years",
                                "a smaller --embodied-kg or a larger --lifetime-years"),
                  "water.onsite": ("--wue × the energy", "a smaller --wue"),
                  "water.offsite": ("--water-intensity × the facility energy", "a smaller --water-intensity")}


def overflow_problem(doc: dict, product: str, fix: str) -> tuple[str, bool] | None:
    """Why doc cannot be printed, naming the product beyond float range (a part's, else `product`) and its fix,
    and whether a part's option is to blame; None when every figure is finite."""
    paths = overflowed(doc)
    if not paths:
        return None
    own = any("." not in p for p in paths)  # the main product left float range: the parts follow from it
    parts = [] if own else [PART_OVERFLOWS[key] for key in PART_OVERFLOWS if any(p.startswith(key) for p in paths)]
    what, fixes = zip(*parts) if parts else ([product], [fix])
    return (f"{'; '.join(what)} is beyond float range ({', '.join(paths)}); give {' and '.join(fixes)}",
            bool(parts))


def _parts_given(args) -> dict:
    return {key: getattr(args, dest) for dest, key in PART_OPTIONS.items()}


def _parts_lines(res: dict) -> list[str]:
    """One line per part beside the location-based figure: its value and source, or why it is absent."""
    m, e, w = res["market"], res["embodied"], res["water"]
    market = (f"market-based (Scope 2): {grouped(m['co2e_g'] / 1000, 1)} kg CO2e at {m['intensity_g_per_kwh']:g} g/kWh "
              f"({m['source']}); not added to the location-based figure" if m.get("co2e_g") is not None
              else f"market-based (Scope 2): not computed: {m['reason']}")
    embodied = (f"embodied (Scope 3): {grouped(e['co2e_g'] / 1000, 1)} kg CO2e: {e['kg_per_device']:g} kg per "
                f"device × "
                f"{grouped(e['device_hours'], 0)} device-hours / ({e['lifetime_years']:g} y × 8,760 h); {e['source']}"
                if e.get("co2e_g") is not None else f"embodied (Scope 3): not computed: {e['reason']}")
    water = [f"{label}: {grouped(w[key], 0)} L"
             for label, key in (("water on-site", "onsite_l"), ("off-site", "offsite_l"))
             if w.get(key) is not None]
    return [market, embodied, "; ".join(water) + (f" ({w['reason']})" if w.get("reason") else "") if water
            else f"water: not computed: {w['reason']}"]


def _check_place(args) -> None:
    """--country/--region must be in codecarbon's data: a typo must not become the world average."""
    from benchsuite.energy.carbon import place_problems

    problems = place_problems(args.country, args.region)
    if problems:
        raise UsageError("; ".join(f"--{field} {reason}" for field, reason in problems))


def estimate(args) -> int:
    from benchsuite.energy import carbon

    _check_place(args)
    try:
        res = carbon.estimate(args.chips, args.hours, args.watts, args.pue, args.intensity, args.country, args.region,
                              carbon.parts_config({}, _parts_given(args)))
    except ValueError as e:
        raise UsageError(str(e)) from None
    problem = overflow_problem(res, "--chips × --hours × --watts × --pue × the intensity", "smaller values")
    if problem:
        raise UsageError(problem[0])
    if args.json:
        print_json(res)
        return 0
    out.print(f"{res['chips']:g} chips × {res['hours']:g} h × {res['watts']:g} W = "
              f"{grouped(res['energy_j'] / carbon.J_PER_KWH, 1)} kWh; × PUE {res['pue']:g} = "
              f"{grouped(res['facility_j'] / carbon.J_PER_KWH, 1)} kWh; "
              f"× {grouped(res['intensity_g_per_kwh'], 0)} g/kWh "
              f"({res['intensity_source']}) = {grouped(res['co2e_g'] / 1000, 1)} kg CO2e", markup=False)
    for line in _parts_lines(res):
        out.print(printable(f"  {line}"), markup=False)
    if res.get("intensity_note"):
        err.print(f"note: {printable(res['intensity_note'])}", markup=False)
    return 0


PROJECTED = ("duration_s", "energy_j", "facility_j", "co2e_g", "j_per_token", "tokens_per_s_per_device")


def _run_projection(results, row: dict, args, intensity) -> dict:
    """One run's projection from one throughput and one J/token: each the median over seeds of each seed's
    median over its records' (results/model.run_median), so hours, kWh and CO2e follow from exactly the
    figures printed; beside each figure the range of the records' own projections. energy/carbon.py reads
    records as JSON values (the record's writer uses it too): each record is handed to it as its document."""
    import msgspec

    from benchsuite.energy import carbon
    from benchsuite.results.identity import seed_of
    from benchsuite.results.stats import run_median

    recs = results.run_records(row["identity"])
    head = {"identity": row["identity"], "label": row["label"], "suite": row["suite"], "workload": row["workload"],
            "world_size": int(row["world_size"]), "seeds": list(row["seeds"]), "records": len(recs),
            "run_keys": sorted({r.run_key for r in recs}),
            "short_window": any(bool(r.energy and r.energy.short_window) for r in recs)}
    projections, errors = [], []
    for rec in recs:
        try:
            proj = carbon.project_from_record(msgspec.to_builtins(rec), args.tokens, args.devices, args.pue,
                                              intensity, _parts_given(args))
        except ValueError as e:
            errors.append(str(e))
            continue
        problem = overflow_problem(proj, "--tokens × the record's rates", "a smaller --tokens")
        if problem and problem[1]:
            raise UsageError(problem[0])  # an option of the command, the same for every record: exit 2
        if problem:
            errors.append(problem[0])
            continue
        projections.append((seed_of(rec), proj))
    if not projections:
        return {**head, "error": errors[0]}
    first = projections[0][1]
    rates = {key: run_median([(seed, p[key]) for seed, p in projections])
             for key in ("j_per_token", "tokens_per_s_per_device")}
    first_energy, first_carbon = recs[0].energy, recs[0].config.carbon
    carbon_config = msgspec.to_builtins(first_carbon) if first_carbon else {}
    run = carbon.project(args.tokens, first["devices"], rates["j_per_token"], rates["tokens_per_s_per_device"],
                         first["pue"], carbon.Intensity(first["intensity_g_per_kwh"], first["intensity_source"]),
                         carbon.parts_config(carbon_config, _parts_given(args)),
                         gpus=bool(first_energy and first_energy.per_device))
    out = {**head, **{k: v for k, v in first.items() if k not in run and k != "run_key"}, **run}
    for key in PROJECTED:
        out[f"{key}_range"] = [min(p[key] for _, p in projections), max(p[key] for _, p in projections)]
    out["records_projected"] = len(projections)
    if errors:
        out["records_not_projected"] = errors
    return out


def project(args) -> int:
    from benchsuite.energy import carbon
    from benchsuite.results.frames import rows_of
    from benchsuite.results.model import results_of

    _check_place(args)
    results = results_of(load_results(args.records))
    runs = results.ok_runs_of(["identity", "label", "suite", "workload", "world_size", "seeds"])  # (its head's)
    if runs.empty:
        raise UsageError(f"{args.records}: no ok record to project from")
    intensity = None
    if args.intensity is not None or args.country:
        try:
            intensity = carbon.lookup(args.intensity, args.country, args.region)
        except ValueError as e:
            raise UsageError(str(e)) from None
    rows = [_run_projection(results, row, args, intensity) for row in rows_of(runs)]
    if args.json:
        print_json(rows)
        return 0
    for r in rows:
        seeds = ", ".join(map(str, r["seeds"]))
        head = printable(f"{r['label']} (suite {r['suite']}; seeds {seeds}; {r['records']} records)")
        if "error" in r:
            out.print(f"{head}: cannot project: {printable(r['error'])}", markup=False)
            continue
        spread = "" if r["records_projected"] < 2 else \
            f" (records: {r['co2e_g_range'][0] / 1e6:.3g}–{r['co2e_g_range'][1] / 1e6:.3g} t)"
        out.print(f"{head}: {grouped(r['duration_s'] / 3600, 1)} h on {r['devices']} devices, "
                  f"{r['energy_j'] / carbon.J_PER_KWH:.3g} kWh of IT energy, × PUE {r['pue']:g} = "
                  f"{r['facility_j'] / carbon.J_PER_KWH:.3g} kWh, {r['co2e_g'] / 1e6:.3g} t CO2e{spread} "
                  f"({r['intensity_g_per_kwh']:.0f} g/kWh, {printable(r['intensity_source'])})", markup=False)
        for line in _parts_lines(r) + _projection_assumptions(r, pue_given=args.pue is not None):
            out.print(printable(f"  {line}"), markup=False)
    return 0


def _projection_assumptions(r: dict, pue_given: bool) -> list[str]:
    """What a projection takes for granted and where each input came from, so a reader can weigh it."""
    parts = ", ".join(r["energy_includes"]) or "no part"
    kind = source_kind(r["energy_source"])
    how = ("an energy counter" if kind.measured else "power samples, not an energy counter" if kind.metered
           else "an estimate, not a meter's reading")
    return [
        f"energy: {r['j_per_token']:.3g} J/token, the run's median over its seeds and repeats, from "
        f"{r['energy_source']} energy of {parts} ({how})",
        ("short window: a record's energy window was shorter than the meters resolve (energy.short_window), "
         "so its J/token is uncertain") if r["short_window"] else
        "window: long enough for the meters (no short-window flag)",
        "meters: no bound recorded" if r.get("energy_bound_share") is None else
        f"meters: the record's energy is bound to ±{r['energy_bound_share']:.1%}, and so is every energy and CO2e "
        f"figure above" + (f" ({r['energy_bound_reason']})" if r.get("energy_bound_reason") else ""),
        f"throughput: {grouped(r['tokens_per_s_per_device'], 0)} tok/s per device as measured at world "
        f"{r['world_size']}, held constant at {r['devices']} devices (no scaling loss assumed); "
        f"J/token held constant too",
        f"PUE {r['pue']:g} from {'--pue' if pue_given else 'the record'}; intensity "
        f"{r['intensity_g_per_kwh']:.0f} g/kWh from {r['intensity_source']}",
    ]

