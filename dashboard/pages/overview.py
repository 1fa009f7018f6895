"""Overview: headline counts, and every run in one sortable, filterable table (failed runs with
their error). Sorting and filtering are a few lines of page script over this table; no figure."""

from __future__ import annotations

from dashboard.data import SiteData
from dashboard.pages import Page
from dashboard.render import DASH, Section, esc, f_ms, f_num, f_pct, f_sig, num, present

ERROR_CHARS = 160


def _cell(text: str, sort_value=None, cls: str = "") -> str:
    v = num(sort_value)
    attr = f' data-v="{v!r}"' if v is not None else ""
    return f'<td{attr}{f" class={cls}" if cls else ""}>{text}</td>'


def _status_cell(row) -> str:
    if row["status"] == "ok":
        if row.get("flagged") is True or row.get("flagged") == 1:  # results/sanity.py: impossible figures
            why = str(row.get("flag_summary") or "")
            return (f'<td class="status-flagged"><span class="ok">ok</span> '
                    f'<span class="warn" title="{esc(why)}">⚠ flagged</span></td>')
        return '<td><span class="ok">ok</span></td>'
    kind = row.get("error_type") if present(row.get("error_type")) else "error"
    msg = str(row.get("error_message")) if present(row.get("error_message")) else ""
    rank = f" (rank {int(row['error_rank'])})" if num(row.get("error_rank")) is not None else ""
    full = f"{kind}{rank}: {msg}"
    shown = full if len(full) <= ERROR_CHARS else full[:ERROR_CHARS] + "…"
    return (f'<td class="status-failed"><span class="bad">failed</span> '
            f'<span class="err" title="{esc(full)}">{esc(shown)}</span></td>')


COLUMNS = [("suite", "text"), ("workload", "text"), ("kind", "text"), ("world", "num"), ("nodes", "num"),
           ("scaling", "text"), ("status", "text"), ("tok/s", "num"), ("MFU (HFU)", "num"),
           ("step ms (95% CI)", "num"), ("scaling eff.", "num"), ("J/token", "num"), ("gCO2e/Mtok", "num")]


def _utilisation(row) -> str:
    """MFU (model FLOPs, no recompute) with HFU (hardware FLOPs, recompute included) beside it."""
    hfu = row.get("metrics.hfu")
    return f_pct(row.get("mfu")) + (f" ({f_pct(hfu)})" if present(hfu) else "")


def _row(row) -> str:
    med = row.get("step_time_median_s")
    cells = [
        _cell(esc(row["suite"])),
        _cell(f'<a href="{esc(row["page"])}">{esc(row["workload"])}</a>'),
        _cell(esc(row["kind_label"])),
        _cell(esc(row["world_size"]), row["world_size"]),
        _cell(esc(row["nodes"]), row["nodes"]),
        _cell(esc(row["scaling"])),
        _status_cell(row),
        _cell(f_num(row.get("tokens_per_s")), row.get("tokens_per_s")),
        _cell(_utilisation(row), row.get("mfu")),
        _cell(esc(f_ms(med, row.get("step_time_ci95_lo_s"), row.get("step_time_ci95_hi_s"))), med),
        _cell(f_pct(row.get("scaling_efficiency")), row.get("scaling_efficiency")),
        _cell(esc(f_sig(row.get("j_per_token"))), row.get("j_per_token")),
        _cell(esc(f_sig(row.get("gco2e_per_mtok"))), row.get("gco2e_per_mtok")),
    ]
    return (f'<tr data-status="{esc(row["status"])}" data-kind="{esc(row["kind_label"])}"'
            f'{" class=failed" if row["status"] != "ok" else ""}>' + "".join(cells) + "</tr>")


def _glance(data: SiteData) -> str:
    df = data.df
    n_ok = int((df["status"] == "ok").sum())
    cards = [("runs", f"{len(df)}"), ("ok", f"{n_ok}"), ("failed", f"{len(df) - n_ok}"),
             ("suites", f"{df['suite'].nunique()}"), ("most devices", f"{int(df['world_size'].max())}")]
    ok = data.ok
    for kind in ("dense", "moe"):
        sub = ok[ok["kind"] == kind]
        if sub.empty:
            continue
        best = sub["mfu"].max() if "mfu" in sub else None
        jpt = sub["j_per_token"].min() if "j_per_token" in sub else None
        cards.append((f"{kind}: best MFU", f_pct(best) if present(best) else DASH))
        cards.append((f"{kind}: lowest J/token", f_sig(jpt) if present(jpt) else DASH))
    return '<div class="cards">' + "".join(f'<div class="card"><div class="v">{esc(v)}</div>'
                                           f'<div class="k">{esc(k)}</div></div>' for k, v in cards) + "</div>"


def render(data: SiteData) -> Section:
    df = data.df
    if df.empty:
        return Section("overview", "Runs", '<p class="missing">No records in this results folder.</p>')
    head = "".join(f'<th data-type="{t}" tabindex="0">{esc(h)}</th>' for h, t in COLUMNS)
    kinds = "".join(f'<option value="{esc(k)}">{esc(k)}</option>' for k in sorted(df["kind_label"].unique()))
    controls = (
        '<div class="filters" data-for="runs-table">'
        '<input type="search" data-filter-text placeholder="filter runs (any text)…" aria-label="filter runs">'
        '<select data-filter="status" aria-label="status"><option value="">any status</option>'
        '<option value="ok">ok</option><option value="failed">failed</option></select>'
        f'<select data-filter="kind" aria-label="kind"><option value="">any kind</option>{kinds}</select>'
        f'<span class="count" data-count>{len(df)} of {len(df)} runs</span></div>')
    body = "".join(_row(r) for r in df.to_dict("records"))
    html = (_glance(data) + controls +
            f'<div class="scroll"><table class="grid sortable runs" id="runs-table"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>"
            '<p class="note">Click a column to sort; click a workload for its run page. '
            "Scaling efficiency: weak = throughput(N) / (N × throughput(1)), strong = time(1) / (N × time(N)), "
            "against the 1-device run(s) of the sweep with the same config, hardware and threads per rank.</p>")
    return Section("overview", "Runs", html)


PAGE = Page("overview", "Runs", render)
