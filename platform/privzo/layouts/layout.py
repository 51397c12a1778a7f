"""The process layouts (``single``, ``replica``, ``zero3``) chosen by name: what differs by rank.

A layout answers, for one rank of a run, the questions that would otherwise be ``if rank`` / ``if
strategy`` branches in the Ray Train worker: how the rank builds its model and data (whole, or a
ZeRO-3 partition), whether it runs a forward on an empty share of a batch, whether it evaluates,
whether it reports (logs, runs the caller's hooks, checkpoints, returns the summary), and how the
fine-tuned weights are saved. ``parallel.strategy`` names the layout (``get_layout``).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from privzo.config.run import RunConfig
from privzo.layouts.context import RunContext, RunHooks, build_context
from privzo.models.loading import save_weights


class Layout:
    """Whole model on every rank; rank 0 reports and evaluates (``single`` has only rank 0)."""

    name = "single"
    forward_on_empty = False  # a rank with an empty share of a batch skips both forwards

    def build(self, config: RunConfig, cache_dir: Path) -> tuple[RunContext, Any]:
        """The rank's context, and an object that must outlive training (DeepSpeed's config)."""
        return build_context(config, cache_dir, progress=False), None

    def reports(self, rank: int) -> bool:
        """Whether this rank logs, runs the caller's hooks, checkpoints and returns the summary."""
        return rank == 0

    def evaluates(self, rank: int) -> bool:
        """Whether this rank evaluates the model (the others wait)."""
        return rank == 0

    def rank_hooks(self, hooks: RunHooks | None, rank: int) -> RunHooks | None:
        """The caller's hooks this rank runs: both where the model is evaluated, since either
        may score it (a search's ASHA rungs after a window, its selection score at the end) and
        its forwards are this layout's forwards (collectives under zero3, so every rank joins);
        only the reporting rank's scores reach the summary, and a hook that releases anything
        itself must do so on rank 0 only."""
        if hooks is None or not self.evaluates(rank):
            return None
        return RunHooks(after_window=hooks.after_window, final_scores=hooks.final_scores)

    def save_model(self, context: RunContext, rank: int, directory: Path) -> None:
        """Save the fine-tuned weights (and tokenizer) to ``directory``; every rank calls it."""
        if self.reports(rank):
            save_weights(context.model, context.loaded.tokenizer, directory)

    def save_whole_model(self, context: RunContext, rank: int, directory: Path) -> None:
        """``save_model`` into a sibling folder renamed to ``directory`` once complete: a save
        that fails (a full disk) leaves no part of the model, so the same command starts the
        run again or resumes it, and it ends in one line naming the folder (safetensors raises
        its own error type for an I/O error)."""
        partial = directory.with_name(f"{directory.name}.partial")
        writes = self.reports(rank)
        if writes:
            shutil.rmtree(partial, ignore_errors=True)  # a killed attempt's
        try:
            self.save_model(context, rank, partial)
        except Exception as error:
            if writes:
                shutil.rmtree(partial, ignore_errors=True)
            if isinstance(error, OSError) or type(error).__name__ == "SafetensorError":
                raise OSError(
                    f"cannot save the model to {directory} ({error}); no part of it is kept: "
                    "free space or fix the directory, then run the same command again"
                ) from error
            raise
        if writes:
            shutil.rmtree(directory, ignore_errors=True)  # an earlier attempt's, replaced
            partial.rename(directory)


class ReplicaLayout(Layout):
    """A whole replica per rank; each rank samples its share of a batch and all-reduces."""

    name = "replica"


class Zero3Layout(Layout):
    """DeepSpeed ZeRO-3: each rank holds a partition, and every forward is a collective, so
    every rank runs every forward (an empty share on the public example) and evaluates."""

    name = "zero3"
    forward_on_empty = True

    def build(self, config: RunConfig, cache_dir: Path) -> tuple[RunContext, Any]:
        from privzo.distributed.zero3 import build_zero3_context

        return build_zero3_context(config, cache_dir)

    def evaluates(self, rank: int) -> bool:
        return True  # its forwards gather weights collectively

    def save_model(self, context: RunContext, rank: int, directory: Path) -> None:
        from privzo.distributed.zero3 import save_gathered

        save_gathered(context, rank, directory)  # a collective, then rank 0 writes


LAYOUTS: dict[str, Layout] = {
    layout.name: layout for layout in (Layout(), ReplicaLayout(), Zero3Layout())
}


def get_layout(name: str) -> Layout:
    """The layout ``parallel.strategy`` names."""
    return LAYOUTS[name]
