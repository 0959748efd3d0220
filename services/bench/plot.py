"""The bench plots: rolling latency medians per policy, offramp's thresholds per site and
its active-ramp count over a stream (matplotlib when installed, else a plain SVG)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

ROLL = 64  # samples in the rolling median of the latency plot


def draw(roll: dict[str, np.ndarray], th: np.ndarray, active: np.ndarray, path: Path,
         title: str) -> Path:
    """Latency (rolling medians per policy), offramp's thresholds (sites x samples, NaN where
    inactive) and its active-ramp count over the stream, to ``path`` (.svg without
    matplotlib)."""
    try:
        import matplotlib  # noqa: F401  (optional: not a dependency)
    except ImportError:
        if path.suffix.lower() != ".svg":
            raise ValueError(f"{path.suffix} plots need matplotlib (not installed): use .svg") \
                from None
        path.write_text(_svg(roll, th, active, title))
        return path
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    for name, y in roll.items():
        ax[0].plot(np.arange(y.size) + ROLL - 1, y, label=name, lw=1)
    ax[0].set_ylabel(f"latency ms (rolling median {ROLL})")
    ax[0].legend()
    for s in range(th.shape[0]):
        if np.isfinite(th[s]).any():
            ax[1].plot(th[s], lw=1, label=f"ramp {s}")
    ax[1].set_ylabel("offramp threshold")
    ax[1].legend(ncol=6, fontsize=7)
    ax[2].step(np.arange(active.size), active, where="post")
    ax[2].set_ylabel("active ramps")
    ax[2].set_xlabel("sample")
    fig.suptitle(f"{title}: latency, thresholds and active ramps")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939")


Series = list[tuple[str, np.ndarray, np.ndarray]]   # (label, x, y); NaN y: a gap


def svg_panels(title: str, panels: list[tuple[str, Series, float | tuple[float, float]]],
               x_label: str, x_max: float) -> str:
    """Stacked line panels (title, series, y maximum or (y minimum, y maximum)) as a
    dependency-free SVG; lines are downsampled to at most 1,000 points and break where y
    is not finite."""
    w, h, left, top, gap = 960, 200, 70, 40, 50
    n = x_max if x_max > 0 else 1.0
    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{w + left + 150}" '
             f'height="{top + len(panels) * (h + gap)}" font-family="sans-serif" '
             'font-size="11">'), f'<text x="{left}" y="20" font-size="14">{title}</text>']
    for i, (name, series, span) in enumerate(panels):
        y0 = top + i * (h + gap)
        lo, hi = span if isinstance(span, tuple) else (0.0, span)
        hi = hi if hi > lo else lo + 1.0
        parts.append(f'<rect x="{left}" y="{y0}" width="{w}" height="{h}" fill="none" '
                     'stroke="#999"/>')
        parts.append(f'<text x="{left}" y="{y0 - 6}">{name}</text>')
        for frac in (0.0, 0.5, 1.0):
            yy = y0 + h - frac * h
            parts.append(f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">'
                         f'{lo + frac * (hi - lo):.3g}</text>')
        parts.append(f'<text x="{left + w}" y="{y0 + h + 14}" text-anchor="end">'
                     f'{x_label} {n:g}</text>')
        for j, (label, xs, ys) in enumerate(series):
            parts += _polyline(xs, ys, _COLORS[j % len(_COLORS)], (left, y0, w, h), n, lo, hi)
            parts.append(f'<text x="{left + w + 10}" y="{y0 + 12 + 13 * j}" '
                         f'fill="{_COLORS[j % len(_COLORS)]}">{label}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _polyline(xs: np.ndarray, ys: np.ndarray, color: str, box: tuple[float, ...], n: float,
              lo: float, hi: float) -> list[str]:
    left, y0, w, h = box
    step = max(1, xs.size // 1000)
    pts: list[str] = []
    runs: list[list[str]] = []
    for x, y in zip(xs[::step], ys[::step], strict=True):
        if np.isfinite(y):
            frac = (min(max(y, lo), hi) - lo) / (hi - lo)
            pts.append(f"{left + w * x / n:.1f},{y0 + h - h * frac:.1f}")
        elif pts:
            runs.append(pts)
            pts = []
    runs.append(pts)
    return [f'<polyline fill="none" stroke="{color}" stroke-width="1" '
            f'points="{" ".join(r)}"/>' for r in runs if r]


def _svg(roll: dict[str, np.ndarray], th: np.ndarray, active: np.ndarray,
         title: str) -> str:
    """Three stacked panels as a dependency-free SVG (lines downsampled to <= 1000 points)."""
    n = max([y.size + ROLL - 1 for y in roll.values()] + [active.size, 1])
    lat = [(k, np.arange(y.size) + ROLL - 1.0, y) for k, y in roll.items()]
    ths = [(f"ramp {s}", np.arange(th.shape[1], dtype=float), th[s]) for s in range(th.shape[0])
           if np.isfinite(th[s]).any()]
    return svg_panels(f"{title}: latency, thresholds, active ramps", [
        (f"latency ms, rolling median of {ROLL}", lat,
         max((float(y.max()) for _, _, y in lat), default=1.0) * 1.05),
        ("offramp thresholds (gaps: ramp inactive)", ths,
         max((float(np.nanmax(y)) for _, _, y in ths), default=1.0) * 1.05),
        ("offramp active ramps", [("active", np.arange(active.size, dtype=float),
                                   active.astype(float))],
         float(max(active.max(), 1)) if active.size else 1.0)], "sample", float(n))


def save_panels(title: str, panels: list[tuple[str, Series, float | tuple[float, float]]],
                x_label: str, x_max: float, path: Path) -> Path:
    """``panels`` (as :func:`svg_panels` takes them) saved to ``path``: with matplotlib when
    it is installed (any format it writes), else as SVG."""
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        if path.suffix.lower() != ".svg":
            raise SystemExit(f"error: {path.suffix} plots need matplotlib (not installed): "
                             "use .svg") from None
        path.write_text(svg_panels(title, panels, x_label, x_max))
        return path
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.4 * len(panels)), sharex=True,
                             squeeze=False)
    for ax, (name, series, _) in zip(axes[:, 0], panels, strict=True):
        for label, xs, ys in series:
            ax.plot(xs, ys, lw=1, label=label, drawstyle="steps-post")
        ax.set_ylabel(name, fontsize=7)
        ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel(x_label)
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
