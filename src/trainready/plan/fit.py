"""Does a setup fit? One rule for `estimate` and `plan`, with its margins stated.

GPU: the modelled peak (memory.py: the caching allocator's reserved memory, which already counts its
fragmentation, plus the CUDA context and NCCL buffers) against the card, less a safety margin that covers
the memory model's own error (bench/plan_accuracy.py prints it: peak memory within a few percent on the
rows that publish one). `fits` is the physical answer (peak <= card); `fits_with_margin` is what `plan`
ranks on and what `estimate` flags.

Host: RAM per node the job needs (offloaded states, checkpoint staging, one process per GPU) against the
instance's RAM less HOST_MARGIN for the operating system, the page cache and data-loader workers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GPU_MARGIN = 0.10
"""Default fraction of GPU memory kept free (`--memory-margin` on plan and estimate)."""
HOST_MARGIN = 0.10
"""Fraction of host RAM left to the OS, page cache and data-loader workers: offloaded states may use the rest.
DeepSpeed's own estimator (`estimate_zero3_model_states_mem_needs`) multiplies its host figure by an
`additional_buffer_factor` of 1.5 instead; we count the buffers we know (pinned staging, process memory)
and keep this margin."""


def gpu_limit_gib(gpu_gib: float, margin: float) -> float:
    """GPU memory a setup may use: the card less the safety margin (the rule's GPU half, also used by the search's
    micro-batch probing)."""
    return gpu_gib * (1 - margin)


@dataclass(frozen=True, slots=True)
class Fit:
    gpu_need_gib: float
    gpu_gib: float
    margin: float
    host_need_gib: float
    host_ram_gib: float | None
    host_margin: float = HOST_MARGIN

    @property
    def gpu_limit_gib(self) -> float:
        return gpu_limit_gib(self.gpu_gib, self.margin)

    @property
    def fits(self) -> bool:
        """Physically, by the model: the peak is within the card."""
        return self.gpu_need_gib <= self.gpu_gib

    @property
    def fits_with_margin(self) -> bool:
        return self.gpu_need_gib <= self.gpu_limit_gib

    @property
    def host_limit_gib(self) -> float | None:
        return None if self.host_ram_gib is None else self.host_ram_gib * (1 - self.host_margin)

    @property
    def host_fits(self) -> bool | None:
        """None: the instance's RAM is not known (no instance given)."""
        limit = self.host_limit_gib
        return None if limit is None else self.host_need_gib <= limit

    def gpu_text(self) -> str:
        head = self.gpu_gib - self.gpu_need_gib
        return (f"{self.gpu_need_gib:,.1f} of {self.gpu_gib:g} GiB per GPU "
                f"({'headroom' if head >= 0 else 'over by'} {abs(head):,.1f} GiB, {abs(head) / self.gpu_gib:.0%}; "
                f"margin {self.margin:.0%})")

    def host_text(self) -> str:
        if self.host_ram_gib is None:
            return f"host RAM {self.host_need_gib:,.0f} GiB per node (the instance's RAM is not known)"
        return (f"host RAM {self.host_need_gib:,.0f} GiB per node of {self.host_ram_gib:,.0f}, at most "
                f"{self.host_limit_gib:,.0f} usable (margin {self.host_margin:.0%})")

    def problem(self) -> str | None:
        """Why it does not pass the rule, with the figures and the flag that changes it; None when it does."""
        if not self.fits:
            return f"does not fit: {self.gpu_text()}"
        if not self.fits_with_margin:
            return (f"fits only inside the safety margin: {self.gpu_text()}; "
                    f"--memory-margin {math.floor(max(0.0, 1 - self.gpu_need_gib / self.gpu_gib) * 100) / 100:.2f} "
                    f"would accept it")
        if self.host_fits is False:
            return f"too little host RAM: {self.host_text()}"
        return None


def fit_of(gpu_need_gib: float, gpu_gib: float, host_need_gib: float, host_ram_gib: float | None,
           margin: float = GPU_MARGIN) -> Fit:
    return Fit(gpu_need_gib=gpu_need_gib, gpu_gib=gpu_gib, margin=margin, host_need_gib=host_need_gib,
               host_ram_gib=host_ram_gib)
