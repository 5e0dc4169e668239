"""Mixed precision: the autocast dtype of a config, running a module under it, and dynamic loss
scaling for float16 (CUDA only; a CPU run is always float32)."""
from __future__ import annotations

import torch

def amp_dtype(amp: str, device: torch.device):
    """The autocast dtype, or None (AMP off): CUDA only."""
    if device.type != "cuda" or amp == "none":
        return None
    if amp == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if amp == "bf16" else torch.float16


def run_model(module, inputs, device, amp, channels_last):
    """``module(inputs)`` on ``device`` (channels-last when asked), under autocast when
    ``amp`` is a dtype."""
    inputs = inputs.to(device, non_blocking=True)
    if channels_last:
        inputs = inputs.contiguous(memory_format=torch.channels_last)
    if amp is None:
        return module(inputs)
    with torch.autocast(device.type, dtype=amp):
        return module(inputs)


class LossScaler:
    """Dynamic loss scaling for float16 autocast, for any optimiser with ``zero_grad``/``step``.

    The loss is multiplied by ``scale`` before backward and the gradients divided by it after;
    a step whose gradients are not all finite is skipped and the scale halved; after
    ``growth_interval`` good steps in a row the scale doubles (``torch.amp.GradScaler``'s
    policy, which needs a ``torch.optim.Optimizer``; `LeanAdam` is not one). In many
    processes the gradients are already averaged when they are checked, so every process takes
    the same decision.
    """

    def __init__(self, params, init_scale: float = 2.0 ** 16, growth_interval: int = 2000):
        self.params = [p for p in params if p.requires_grad]
        self.scale, self.growth_interval, self.good = float(init_scale), growth_interval, 0
        self.skipped = 0

    def step(self, value: torch.Tensor, optimizer) -> None:
        """Backward of ``value * scale``, gradients unscaled, then ``optimizer.step()`` if
        they are all finite (else the step is skipped and the scale halved)."""
        optimizer.zero_grad(set_to_none=True)
        (value * self.scale).backward()
        # a sparse (row-wise) gradient's values: ROLE's estimator with estimator_update="rows"
        grads = [p.grad._values() if p.grad.is_sparse else p.grad
                 for p in self.params if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, 1.0 / self.scale)
            finite = bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())
        else:
            finite = True
        if finite:
            optimizer.step()
            self.good += 1
            if self.good >= self.growth_interval:
                self.scale, self.good = self.scale * 2.0, 0
        else:
            self.scale, self.good, self.skipped = self.scale / 2.0, 0, self.skipped + 1

    def state_dict(self) -> dict:
        """``{"scale", "good", "skipped"}``: what a resumed run needs to scale as this one."""
        return {"scale": self.scale, "good": self.good, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned."""
        missing = [k for k in ("scale", "good") if k not in state]
        if missing:
            raise ValueError(f"LossScaler.load_state_dict: the state lacks {missing}; was it "
                             f"saved by LossScaler.state_dict()?")
        self.scale, self.good = float(state["scale"]), int(state["good"])
        self.skipped = int(state.get("skipped", 0))
