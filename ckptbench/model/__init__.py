"""The model: pure computation, no I/O and no torch (numpy only in :mod:`.simulate` and :mod:`.simulate_twolevel`).

* :mod:`.sizing` — checkpoint bytes from parameters, a training recipe and a parallel layout.
* :mod:`.failures` — the job's MTBF from per-GPU/node MTBFs, faults per day or a published run.
* :mod:`.interval` — Young, Daly, the exact optimum of Daly's model, and the async model.
* :mod:`.simulate` — Monte Carlo runs (numpy, vectorised over runs) that validate the closed forms.
* :mod:`.twolevel` — two-level checkpointing (a local tier every interval, every k-th drained to a remote
  tier): the exact model, the numeric optimum (tau, k), Benoit et al.'s first order, a peer-replica what-if.
* :mod:`.simulate_twolevel` — the Monte Carlo of that schedule (numpy), exponential or Weibull failures.
* :mod:`.goodput` — planned time from ``6 N D``, wall time, badput by category, cost, what-ifs.
* :mod:`.presets` — ``configs/models`` and ``configs/failures``.

Import the submodules directly; this package imports none of them, so ``import ckptbench.model``
costs nothing.
"""
