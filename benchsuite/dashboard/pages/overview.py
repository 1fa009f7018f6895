"""Overview: headline figures of the runs (results/model.py: the report's medians), and every record
in one sortable, filterable, paged table, named by run, seed and repeat (failed runs with their error). The rows travel in assets/runs.js (a script, since file:// pages may not fetch),
formatted here; the page script only sorts, filters and shows one page of them; no figure."""

from __future__ import annotations

from benchsuite.record.columns import view_columns
from benchsuite.results.scaling import BASELINE
from benchsuite.dashboard.data import SiteData
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
               "error_type", "error_message", "error_rank"]  # what _row reads: only these become rows
view_columns(*ROW_COLUMNS)


def _cell(text: str, sort_value=None) -> list:
    """[text] or [text, number to sort by]; the page script shows `text` as text (never as markup)."""
    v = num(sort_value)
    return [text] if v is None else [text, v]


def _note(row) -> str:
    """The status cell's second part: the sanity flags of an ok run, or a failed run's error."""
    if row["status"] == "ok":
        flagged = row.get("flagged") is True or row.get("flagged") == 1  # record/sanity.py: impossible figures
        return str(row.get("flag_summary") or "flagged") if flagged else ""
    kind = row.get("error_type") if present(row.get("error_type")) else "error"
    msg = str(row.get("error_message")) if present(row.get("error_message")) else ""
    rank = f" (rank {int(row['error_rank'])})" if num(row.get("error_rank")) is not None else ""
    return f"{kind}{rank}: {msg}"


def _utilisation(row) -> str:
    """MFU (model FLOPs, no recompute) with HFU (hardware FLOPs, recompute included) beside it."""
    hfu = row.get("metrics.hfu")
    return f_pct(row.get("mfu")) + (f" ({f_pct(hfu)})" if present(hfu) else "")


def _efficiency(row) -> str:
    """The run's scaling efficiency (every record of a run shows its run's); 'baseline' on the baseline."""
    return "baseline" if row.get("scaling_baseline") == BASELINE else f_pct(row.get("scaling_efficiency"))


def _row(row) -> list:
    """One run for assets/runs.js: [page, status, model, note, cells]."""
    med = row.get("step_time_median_s")
    cells = [
        _cell(str(row["suite"])), _cell(str(row["label"])), _cell(str(row["seed"]), row["seed"]),
        _cell(str(row["repeat"]), row["repeat"]), _cell(str(row["kind_label"])),
        _cell(str(row["world_size"]), row["world_size"]), _cell(str(row["nodes"]), row["nodes"]),
        _cell(str(row["scaling"])), _cell(str(row["status"])),
        _cell(f_num(row.get("tokens_per_s")), row.get("tokens_per_s")),
        _cell(_utilisation(row), row.get("mfu")),
        _cell(f_ms(med, row.get("step_time_ci95_lo_s"), row.get("step_time_ci95_hi_s")), med),
        _cell(_efficiency(row), row.get("scaling_efficiency")),
        _cell(f_sig(row.get("j_per_token")), row.get("j_per_token")),
        _cell(f_sig(row.get("gco2e_per_mtok")), row.get("gco2e_per_mtok")),
    ]
    return [row["page"], str(row["status"]), str(row["kind_label"]), _note(row), cells]


def _best(runs, column: str, largest: bool) -> tuple[float | None, str]:
    """The best run's median of a column, and the run's label."""
    have = runs[runs[column].map(lambda v: num(v) is not None)]
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
    ok = data.ok_runs
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
    rows = DataFile("runs", "BENCHSUITE_RUNS", [_row(r) for r in df.reindex(columns=ROW_COLUMNS).to_dict("records")])
    return PageSection("overview", "Runs", html, data_files=[rows])


PAGE = Page("overview", "Runs", render)
