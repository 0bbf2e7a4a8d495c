"""What every PNG of ours ends with: the machine and tool footer, then the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptbench import safeio


def save_with_footer(fig: Any, document: dict[str, Any], path: Path | str, *, top: float = 1.0) -> Path:
    """Stamp where ``document`` was measured in the figure's corner, write it as PNG to ``path`` and close it."""
    import matplotlib.pyplot as plt

    env = document["environment"]
    fig.text(0.99, 0.01, f"{env.get('host')} · {env.get('cpu_count')} CPUs · kernel {env.get('kernel')} · "
             f"ckptbench {env.get('tool_version')} · {document['created']}", ha="right", fontsize=6, color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, top))
    path = Path(path)
    safeio.write_output(path, lambda out: fig.savefig(out, format="png"))
    plt.close(fig)
    return path
