#!/usr/bin/env python3
"""Sweeps workloads over the multi-size THP series' settings (seed 000: the
4K baseline, 16K, 32K+16K, 64K+32K+16K and PMD, as `hugelab compare` has
them by default) on the model, prints a summary table and draws one figure.

    python examples/sweep_seed000.py FIGURE [--rows OUT] [--ray ADDRESS] [WORKLOAD...]

FIGURE is the figure's file (.svg or .png). The workloads default to the
programs of workloads/ and the recording of a part of a kernel build that
`hugelab compare` replays (crates/cli/workloads/kbuild-mm.hlw.zst): the
series measured a kernel build. --rows writes the sweep's rows (Parquet,
CSV or JSON; a re-run resumes from it); --ray ADDRESS runs the cells on that
Ray cluster (pip install 'hugelab[ray]').

The table has a row per workload and setting, at the workload's first
snapshot (else at its end), as compare's summary takes it: page faults and
anonymous memory and their change against 4K, and the share of anonymous
memory in large folios. The figure: the change in page faults against 4K,
a group of bars per workload, a bar per setting.
"""

import argparse
import sys
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: the figure goes to a file
matplotlib.rcParams["svg.hashsalt"] = "hugelab"  # the same SVG from the same rows
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

import hugelab  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def default_workloads():
    programs = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "workloads").glob("*.hlw"))
    return programs + ["crates/cli/workloads/kbuild-mm.hlw.zst"]


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """A row per workload and setting at the workload's first snapshot (the
    snapshot statement with the smallest line), else at ``end``."""
    first = (rows.dropna(subset=["line"]).sort_values("line")
             .groupby("workload")["snapshot"].first())
    at = rows["workload"].map(first).fillna("end")
    taken = rows[rows["snapshot"] == at]
    wide = taken.pivot_table(index=["workload", "setting"], columns="counter", values="value",
                             sort=False)
    large = wide.filter(regex=r"^mthp\.\d+kB\.nr_anon$")
    sizes = [int(c.split(".")[1].removesuffix("kB")) for c in large.columns]
    large_kb = (large * sizes).sum(axis=1)
    table = pd.DataFrame({
        "page_faults": wide["vmstat.pgfault"].astype("int64"),
        "anon_kb": wide["meminfo.AnonPages"].astype("int64"),
        "large_folio_kb": large_kb.astype("int64"),
    })
    base = table.groupby(level="workload", sort=False).transform("first")
    table["page_faults_change_pct"] = (table["page_faults"] / base["page_faults"] - 1) * 100
    table["anon_kb_change_pct"] = (table["anon_kb"] / base["anon_kb"] - 1) * 100
    table["large_folio_pct"] = (table["large_folio_kb"] / table["anon_kb"] * 100).fillna(0)
    return table.round(1)


def plot(table: pd.DataFrame, figure: Path) -> None:
    change = table["page_faults_change_pct"].unstack("setting")
    # The settings in the sweep's order, the baseline (all zero) left out.
    change = change[list(dict.fromkeys(table.index.get_level_values("setting")))[1:]]
    change = change.loc[list(dict.fromkeys(table.index.get_level_values("workload")))]
    change.index = ["\n".join(textwrap.wrap(Path(w).name.split(".")[0], 16, break_on_hyphens=True))
                    for w in change.index]
    ax = change.plot.bar(figsize=(8, 4.5), width=0.8, rot=0)
    ax.set_ylabel("page faults, change against 4K (%)")
    ax.set_xlabel("")
    ax.set_title("Page faults under the multi-size THP series' settings (hugelab model)")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.legend(title="setting", fontsize="small", bbox_to_anchor=(1.01, 1), loc="upper left")
    ax.figure.tight_layout()
    ax.figure.savefig(figure, metadata={"Date": None} if figure.suffix == ".svg" else None)
    plt.close(ax.figure)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("figure", type=Path, help="the figure's file: .svg or .png")
    ap.add_argument("workloads", nargs="*", help="default: workloads/ and the kernel build's")
    ap.add_argument("--rows", help="write the sweep's rows here too (.parquet, .csv, .json)")
    ap.add_argument("--ray", metavar="ADDRESS", help="run the cells on this Ray cluster")
    args = ap.parse_intermixed_args(argv)
    workloads = args.workloads or default_workloads()
    engine = {"engine": "ray", "address": args.ray} if args.ray else {}
    rows = hugelab.sweep(workloads, hugelab.SERIES_SETTINGS, output=args.rows, **engine)
    cells = rows.groupby(["workload", "setting", "machine"]).ngroups
    print(f"{cells} cells: {len(workloads)} workloads × {len(hugelab.SERIES_SETTINGS)} "
          f"settings, {len(rows)} rows")
    table = summary(rows)
    with pd.option_context("display.width", 200, "display.max_columns", None):
        print(table.to_string())
    plot(table, args.figure)
    print(f"figure: {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
