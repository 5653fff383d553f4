#!/usr/bin/env python3
"""Plots ditto's predicted vs. measured TTFT and E2E, per run and stage, as an SVG.

Usage: scripts/plot_fidelity.py VALIDATE_JSON [OUT.svg]
where VALIDATE_JSON is the output of `ditto validate --json DIR...`. Standard library only.
Each point is one (run, stage) mean or p90; the diagonal is a perfect prediction and the
dashed lines are +-10%.
"""
import json
import math
import sys

PANELS = [("ttft", "TTFT (ms)"), ("e2e", "E2E (ms)")]
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
          "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#000000", "#aec7e8"]
W, H, PAD = 420, 400, 60


def points(report, metric):
    out = []
    for i, run in enumerate(report["runs"]):
        for stage in run["stages"]:
            for stat in ("mean", "p90"):
                key = f"{metric}_{stat}"
                p, m = stage["predicted_ms"][key], stage["measured_ms"][key]
                if p and m:
                    out.append((i, stage["stage"], stat, m, p))
    return out


def panel(report, metric, title, x0):
    pts = points(report, metric)
    lo = min(min(m, p) for _, _, _, m, p in pts) * 0.8
    hi = max(max(m, p) for _, _, _, m, p in pts) * 1.2
    llo, lhi = math.log10(lo), math.log10(hi)

    def sx(v):
        return x0 + PAD + (math.log10(v) - llo) / (lhi - llo) * (W - 2 * PAD)

    def sy(v):
        return H - PAD - (math.log10(v) - llo) / (lhi - llo) * (H - 2 * PAD)

    svg = [f'<text x="{x0 + W / 2}" y="20" text-anchor="middle" font-size="14">{title}: predicted vs measured</text>',
           f'<rect x="{x0 + PAD}" y="{PAD}" width="{W - 2 * PAD}" height="{H - 2 * PAD}" fill="none" stroke="#888"/>',
           f'<line x1="{sx(lo)}" y1="{sy(lo)}" x2="{sx(hi)}" y2="{sy(hi)}" stroke="#444"/>']
    for f in (0.9, 1.1):
        svg.append(f'<line x1="{sx(lo)}" y1="{sy(lo * f)}" x2="{sx(hi / f if f > 1 else hi)}" '
                   f'y2="{sy(hi if f > 1 else hi * f)}" stroke="#aaa" stroke-dasharray="4,3"/>')
    for t in range(math.ceil(llo), math.floor(lhi) + 1):
        for k in (1, 2, 5):
            v = k * 10 ** t
            if lo <= v <= hi:
                svg.append(f'<text x="{sx(v)}" y="{H - PAD + 15}" font-size="10" text-anchor="middle">{v:g}</text>')
                svg.append(f'<text x="{x0 + PAD - 5}" y="{sy(v) + 3}" font-size="10" text-anchor="end">{v:g}</text>')
    svg.append(f'<text x="{x0 + W / 2}" y="{H - 15}" font-size="11" text-anchor="middle">measured</text>')
    svg.append(f'<text x="{x0 + 15}" y="{H / 2}" font-size="11" transform="rotate(-90 {x0 + 15} {H / 2})" '
               f'text-anchor="middle">predicted</text>')
    for i, stage, stat, m, p in pts:
        c = COLORS[i % len(COLORS)]
        if stat == "mean":
            svg.append(f'<circle cx="{sx(m):.1f}" cy="{sy(p):.1f}" r="{3 if stage < 0 else 4}" fill="{c}"/>')
        else:
            svg.append(f'<rect x="{sx(m) - 3:.1f}" y="{sy(p) - 3:.1f}" width="6" height="6" fill="none" stroke="{c}"/>')
    return svg


def main():
    report = json.load(open(sys.argv[1]))
    out = sys.argv[2] if len(sys.argv) > 2 else "docs/fidelity.svg"
    width = W * len(PANELS)
    legend_h = 18 * (len(report["runs"]) + 1)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{H + legend_h}" '
           f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>']
    for k, (metric, title) in enumerate(PANELS):
        svg += panel(report, metric, title, k * W)
    for i, run in enumerate(report["runs"]):
        y = H + 14 + 18 * i
        svg.append(f'<circle cx="{PAD}" cy="{y - 4}" r="4" fill="{COLORS[i % len(COLORS)]}"/>')
        svg.append(f'<text x="{PAD + 10}" y="{y}" font-size="11">{run["name"]} ({run["gpu"]} x{run["tp"]})</text>')
    y = H + 14 + 18 * len(report["runs"])
    svg.append(f'<text x="{PAD}" y="{y}" font-size="11">dots: means (whole run and each stage); '
               f'squares: p90; model: {report["latency_model"]}</text>')
    svg.append("</svg>")
    open(out, "w").write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
