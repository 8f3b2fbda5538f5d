"""MkDocs hook: the benchmark plots, drawn at build time from the benchmarks' own JSON.

`docs/benchmarks/data/` holds the JSON of the figures RELIABILITY.md quotes, as the
benchmarks write it (`restore-results.json`, `resume-results.json`,
`checkpoint-results.json`; `benchmarks/restore.py` and the others write theirs under
those names). Every file whose name starts with a benchmark's name and ends in
`-results.json` is read, so a second run (the checkpoint's one 1 GB cell) sits beside the
first. Each plot is an SVG added to the site as `benchmarks/plots/<name>.svg`; nothing
generated is committed.
"""

from __future__ import annotations

import io
import json
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

# A figure of a cell's JSON (None where the cell has none), and a method plotted: its name,
# its median seconds and, for ours, the paired ratios shown above its bars.
Getter = Callable[[dict[str, Any]], Any]
Method = tuple[str, Getter, Getter | None]

DATA = Path("benchmarks") / "data"
PLOTS = "benchmarks/plots"
OURS = "#3f51b5"  # material's indigo: ours is the same colour in every plot
BASELINES = ("#9e9e9e", "#bdbdbd", "#e0e0e0", "#757575")
LINKS = {
    "per-connection": "50 MiB/s\nper conn.",
    "total": "1 Gbit/s\nHTTPS",
    "loopback": "loopback",
}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    data = Path(config.docs_dir) / DATA
    for name, draw in (("restore", _restore), ("resume", _resume), ("checkpoint", _checkpoint)):
        documents = [
            json.loads(path.read_text()) for path in sorted(data.glob(f"{name}*-results.json"))
        ]
        if not documents:
            raise SystemExit(f"docs/{DATA}: no {name}*-results.json to plot")
        files.append(File.generated(config, f"{PLOTS}/{name}.svg", content=draw(documents)))
    return files


def _at(*keys: str) -> Getter:
    """The figure at `keys` of a cell's JSON, None where it has none."""

    def get(cell: dict[str, Any]) -> Any:
        value: Any = cell
        for key in keys:
            if key not in value:
                return None
            value = value[key]
        return value

    return get


def _restore(documents: list[dict[str, Any]]) -> str:
    cells = [cell for document in documents for cell in document["results"]]
    sizes = [size for size in ("300 MB", "1 GB") if any(cell["size"] == size for cell in cells)]
    methods: list[Method] = [
        ("ours", _at("median_ours_process_s"), _at("paired_process_to_shell")),
        ("shell (strongest)", _at("median_shell_s"), None),
        ("aria2c -x4", _at("median_aria2c_s"), None),
        ("curl", _at("median_curl_s"), None),
        ("floor: unsquashfs + link", _at("median_unsquashfs_plus_link_floor_s"), None),
    ]
    panels = []
    for size in sizes:
        chosen = [cell for cell in cells if cell["size"] == size]
        panels.append((f"restore, {size}", chosen))
    return _bars(
        panels,
        methods,
        label=lambda cell: f"{LINKS[cell['link']]}\n{cell['cpu']}",
        ratio_name="ours / shell",
    )


def _resume(documents: list[dict[str, Any]]) -> str:
    cells = [cell for document in documents for cell in document["results"]]
    methods: list[Method] = [
        ("resume (ours)", _at("median_s", "resume"), _at("paired", "resume_to_baseline")),
        ("baseline: aria2c + sha256 + unsquashfs", _at("median_s", "baseline"), None),
        ("a fresh seed", _at("median_s", "seed"), None),
        ("floor: unsquashfs + link", _at("floor_s"), None),
    ]
    return _bars(
        [(f"resume, {cells[0]['size']}", cells)],
        methods,
        label=lambda cell: f"{LINKS[cell['link']]}\n{cell['vcpus']} vCPU",
        ratio_name="resume / baseline",
    )


def _checkpoint(documents: list[dict[str, Any]]) -> str:
    cells = [cell for document in documents for cell in document["cells"]]
    methods: list[Method] = [
        ("ours", _at("median_s", "ours"), _at("paired_ratios", "streaming")),
        ("tar+openssl+curl", _at("median_s", "tar+openssl+curl"), None),
        ("streaming: tar | zstd | multipart", _at("median_s", "streaming"), None),
    ]
    cells.sort(key=lambda cell: "1 GB" in cell["size"])  # the one 1 GB cell last
    return _bars(
        [("checkpoint", cells)],
        methods,
        label=lambda cell: f"{cell['size']}\n{LINKS[cell['link']]}\n{cell['vcpus']} vCPU",
        ratio_name="ours / streaming",
    )


def _bars(
    panels: list[tuple[str, list[dict[str, Any]]]],
    methods: Iterable[Method],
    *,
    label: Any,
    ratio_name: str,
) -> str:
    """Grouped bars of median seconds, one group per cell, each panel's cells side by side;
    above ours, the paired median ratio against the baseline named."""
    import matplotlib  # noqa: PLC0415 - only when the site is built

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "seedkeeper", "font.size": 9})
    methods = list(methods)
    # A method keeps its colour in every panel, whichever methods a panel shows.
    colours = {
        name: OURS if index == 0 else BASELINES[(index - 1) % len(BASELINES)]
        for index, (name, _, _) in enumerate(methods)
    }
    width_cells = max(len(cells) for _, cells in panels)
    figure, axes = plt.subplots(
        len(panels), 1, figsize=(1.2 * width_cells + 1.8, 2.6 * len(panels) + 0.6), squeeze=False
    )
    for axis, (title, cells) in zip(axes[:, 0], panels, strict=True):
        shown = [method for method in methods if any(method[1](cell) for cell in cells)]
        width = 0.8 / len(shown)
        for index, (name, median, ratio) in enumerate(shown):
            xs = [
                cell_index + (index - (len(shown) - 1) / 2) * width
                for cell_index in range(len(cells))
            ]
            heights = [median(cell) or 0.0 for cell in cells]
            axis.bar(
                xs,
                heights,
                width,
                label=name,
                color=colours[name],
                edgecolor="#424242",
                linewidth=0.4,
            )
            if ratio:
                for x, height, cell in zip(xs, heights, cells, strict=True):
                    axis.annotate(
                        f"{statistics.median(ratio(cell)):.2f}\N{MULTIPLICATION SIGN}",
                        (x, height),
                        xytext=(0, 2),
                        textcoords="offset points",
                        ha="center",
                        fontsize=7,
                    )
        axis.set_xlim(-0.6, width_cells - 0.4)
        axis.set_title(title, fontsize=10)
        axis.set_xticks(range(len(cells)), [label(cell) for cell in cells], fontsize=8)
        axis.set_ylabel("median seconds")
        axis.spines[["top", "right"]].set_visible(False)
        axis.margins(y=0.12)
    legend: dict[str, Any] = {}
    for axis in axes[:, 0]:
        for handle, name in zip(*axis.get_legend_handles_labels(), strict=True):
            legend.setdefault(name, handle)
    figure.legend(
        list(legend.values()), list(legend), loc="lower center", ncol=3, frameon=False, fontsize=8
    )
    figure.text(
        0.99, 0.995, f"above ours: {ratio_name}, paired median", ha="right", va="top", fontsize=7
    )
    rows = -(-len(legend) // 3)
    figure.tight_layout(rect=(0, 0.05 * rows / len(panels) + 0.02, 1, 0.97))
    out = io.StringIO()
    figure.savefig(out, format="svg", metadata={"Date": None})
    plt.close(figure)
    return out.getvalue()
