"""Overview: headline figures of the runs (results/model.py: the report's medians), and every record
in one sortable, filterable, paged table, named by run, seed and repeat (failed runs with their error). The rows travel in assets/runs.js (a script, since file:// pages may not fetch),
formatted here; the page script only sorts, filters and shows one page of them; no figure."""

from __future__ import annotations

from benchsuite.record.columns import view_columns
from benchsuite.results.scaling import BASELINE
from benchsuite.dashboard.data import SiteData, numbers
from benchsuite.results.frames import column_values
from benchsuite.dashboard.page import Page
from benchsuite.dashboard.render import DASH, DataFile, PageSection, esc, f_ms, f_num, f_pct, f_sig, num, present


WIDE = "wide"  # a column left out below 1,200 px (dashboard.css), so the table fits a 900 px window
COLUMNS = [  # (header, sort type, how the page script draws the cell, WIDE or "")
    ("Suite", "text", "", WIDE), ("Run", "text", "link", ""), ("Seed", "num", "", ""),
    ("Repeat", "num", "", WIDE), ("Model", "text", "", ""), ("Devices", "num", "", ""),
    ("Nodes", "num", "", WIDE), ("Scaling", "text", "", WIDE), ("Status", "text", "status", ""),
    ("Tokens/s", "num", "", ""), ("MFU (HFU)", "num", "", ""), ("Step time (ms, 95% CI)", "num", "", ""),
    ("Scaling efficiency (the run's)", "num", "", ""), ("Energy/token (J)", "num", "", WIDE),
    ("CO2e/Mtok (g)", "num", "", WIDE)]
PAGE_SIZE = 100
ROW_COLUMNS = ["page", "status", "kind_label", "suite", "label", "seed", "repeat", "world_size", "nodes", "scaling",
               "tokens_per_s", "mfu", "metrics.hfu", "step_time_median_s", "step_time_ci95_lo_s", "step_time_ci95_hi_s",
               "scaling_efficiency", "scaling_baseline", "j_per_token", "gco2e_per_mtok", "flagged", "flag_summary",
               "error_type", "error_message", "error_rank"]  # what runs_rows reads: only these become rows
view_columns(*ROW_COLUMNS)
NUMBERS = ["seed", "repeat", "world_size", "nodes", "tokens_per_s", "mfu", "step_time_median_s", "step_time_ci95_lo_s",
           "step_time_ci95_hi_s", "scaling_efficiency", "j_per_token", "gco2e_per_mtok", "error_rank"]  # as figures


def _cell(text: str, sort_value: float | None = None) -> list:
    """[text] or [text, number to sort by]; the page script shows `text` as text (never as markup)."""
    return [text] if sort_value is None else [text, sort_value]


def _note(status, flagged, flag_summary, error_type, error_message, error_rank) -> str:
    """The status cell's second part: the sanity flags of an ok run, or a failed run's error."""
    if status == "ok":
        flagged = flagged is True or flagged == 1  # record/sanity.py: impossible figures
        return str(flag_summary or "flagged") if flagged else ""
    kind = error_type if present(error_type) else "error"
    msg = str(error_message) if present(error_message) else ""
    rank = f" (rank {int(error_rank)})" if error_rank is not None else ""
    return f"{kind}{rank}: {msg}"


def _utilisation(mfu, hfu) -> str:
    """MFU (model FLOPs, no recompute) with HFU (hardware FLOPs, recompute included) beside it."""
    return f_pct(mfu) + (f" ({f_pct(hfu)})" if present(hfu) else "")


def _efficiency(efficiency, baseline) -> str:
    """The run's scaling efficiency (every record of a run shows its run's); 'baseline' on the baseline."""
    return "baseline" if baseline == BASELINE else f_pct(efficiency)


def runs_rows(df) -> list[list]:
    """Every record for assets/runs.js, [page, status, model, note, cells] each; built a column at a time, the
    figures read once (data.numbers: num of each value) for their sort value and their text."""
    v = column_values(df, ROW_COLUMNS)
    n = {c: numbers(df[c]) if c in df else [None] * len(df) for c in NUMBERS}
    rows = []
    for i, (page, status, kind_label) in enumerate(zip(v["page"], v["status"], v["kind_label"])):
        seed, repeat, world_size, nodes = v["seed"][i], v["repeat"][i], v["world_size"][i], v["nodes"][i]
        med, mfu = n["step_time_median_s"][i], n["mfu"][i]
        tokens, efficiency = n["tokens_per_s"][i], n["scaling_efficiency"][i]
        joules, co2e = n["j_per_token"][i], n["gco2e_per_mtok"][i]
        cells = [
            _cell(str(v["suite"][i])), _cell(str(v["label"][i])), _cell(str(seed), n["seed"][i]),
            _cell(str(repeat), n["repeat"][i]), _cell(str(kind_label)),
            _cell(str(world_size), n["world_size"][i]), _cell(str(nodes), n["nodes"][i]),
            _cell(str(v["scaling"][i])), _cell(str(status)),
            _cell(f_num(tokens), tokens), _cell(_utilisation(mfu, v["metrics.hfu"][i]), mfu),
            _cell(f_ms(med, n["step_time_ci95_lo_s"][i], n["step_time_ci95_hi_s"][i]), med),
            _cell(_efficiency(efficiency, v["scaling_baseline"][i]), efficiency),
            _cell(f_sig(joules), joules), _cell(f_sig(co2e), co2e),
        ]
        note = _note(status, v["flagged"][i], v["flag_summary"][i], v["error_type"][i], v["error_message"][i],
                     v["error_rank"][i] if n["error_rank"][i] is not None else None)
        rows.append([page, str(status), str(kind_label), note, cells])
    return rows


def _best(runs, column: str, largest: bool) -> tuple[float | None, str]:
    """The best run's median of a column, and the run's label."""
    have = runs[[v is not None for v in numbers(runs[column])]]
    if have.empty:
        return None, ""
    row = have.loc[have[column].idxmax() if largest else have[column].idxmin()]
    return num(row[column]), str(row["label"])


def _glance(data: SiteData) -> str:
    """Counts of records and runs; per model kind, the best run's median MFU and J/token (the figures
    the bars and the report show), naming the run."""
    df = data.df
    n_ok = int((df["status"] == "ok").sum())
    cards = [("records", f"{len(df)}"), ("ok", f"{n_ok}"), ("failed", f"{len(df) - n_ok}"),
             ("runs (seeds and repeats pooled)", f"{len(data.runs)}"),
             ("suites", f"{df['suite'].nunique()}"), ("most devices", f"{int(df['world_size'].max())}")]
    ok = data.ok_runs_of(["kind", "label", "mfu", "j_per_token"])
    for kind in ("dense", "moe"):
        sub = ok[ok["kind"] == kind]
        if sub.empty:
            continue
        name = "MoE" if kind == "moe" else kind
        for what, column, largest, fmt in (("best MFU", "mfu", True, f_pct),
                                           ("lowest energy/token (J)", "j_per_token", False, f_sig)):
            value, label = _best(sub, column, largest)
            cards.append((f"{name}: {what}" + (f" ({label})" if label else ""), fmt(value) if value is not None
                          else DASH))
    return '<div class="cards">' + "".join(f'<div class="card"><div class="v">{esc(v)}</div>'
                                           f'<div class="k">{esc(k)}</div></div>' for k, v in cards) + "</div>"


def render(data: SiteData) -> PageSection:
    df = data.df
    if df.empty:
        return PageSection("overview", "Runs", '<p class="missing">No records in this results folder.</p>')
    head = "".join(f'<th data-type="{t}" data-render="{r}" class="{w}" tabindex="0">{esc(h)}</th>'
                   for h, t, r, w in COLUMNS)
    kinds = "".join(f'<option value="{esc(k)}">{esc(k)}</option>' for k in sorted(df["kind_label"].unique()))
    controls = (
        '<div class="filters" data-for="runs-table">'
        '<input type="search" data-filter-text placeholder="filter runs (any text)…" aria-label="filter runs">'
        '<select data-filter="status" aria-label="status"><option value="">any status</option>'
        '<option value="ok">ok</option><option value="failed">failed</option></select>'
        f'<select data-filter="kind" aria-label="model"><option value="">any model</option>{kinds}</select>'
        f'<span class="count" data-count>{len(df)} runs</span></div>')
    pager = ('<div class="pager" data-pager-for="runs-table">'
             '<button type="button" data-page="prev">‹ previous</button>'
             '<span data-page-info></span><button type="button" data-page="next">next ›</button></div>')
    html = (_glance(data) + controls +
            f'<div class="scroll"><table class="grid sortable runs" id="runs-table" data-rows="BENCHSUITE_RUNS" '
            f'data-page-size="{PAGE_SIZE}"><thead><tr>{head}</tr></thead><tbody></tbody></table></div>' + pager +
            '<noscript><p class="missing">The runs table needs JavaScript; each run page is runs/&lt;run key&gt;.html.'
            '</p></noscript>'
            f'<p class="note">{PAGE_SIZE} records a page, one per seed and repeat of a run. A window narrower '
            "than 1,200 px leaves out suite, repeat, nodes, scaling, energy and CO2e (each run's page has them). "
            "Click a column to sort; "
            "click a run for its record's page. Scaling efficiency is the run's (its median over seeds and "
            "repeats): weak = throughput(N) / (N × throughput(1)), strong = time(1) / (N × time(N)), against the "
            "1-device run of the sweep with the same config, hardware and threads per rank.</p>")
    rows = DataFile("runs", "BENCHSUITE_RUNS", runs_rows(df))
    return PageSection("overview", "Runs", html, data_files=[rows])


PAGE = Page("overview", "Runs", render)
