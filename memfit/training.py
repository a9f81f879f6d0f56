"""One training step of the course GPT, and the instruments that watch its memory.

* `Trainer`: model + optimizer + precision; `step(idx, targets)` is forward, backward, optimizer
  step, `zero_grad(set_to_none=True)`: the step whose peak the lessons predict.
* `measure_step`: the peak of a steady-state step (after a warm-up step has created the optimizer
  states), from the course meter, as total bytes of tensors.
* `timeline`: memory after every op of a step, with its phase (forward, backward, optimizer).
* `bytes_after_forward`: what a forward pass leaves alive for backward, measured.
* `saved_tensors`: what autograd keeps for backward, found with saved_tensors_hooks.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from memfit.gpt import GPT, GPTConfig, unique_parameters
from memfit.meter import measure_peak, open_meter

PRECISIONS = ("fp32", "amp", "bf16")  # fp32 everywhere | autocast, fp32 weights | bf16 weights and states
OPTIMIZERS = ("adamw", "sgd")  # torch.optim.AdamW | SGD with momentum (both foreach); or pass a factory
# params -> optimizer (lesson 07 passes its AdamW8bit that way: the library never imports a lesson's answer)


def amp_dtype(device: torch.device | str) -> torch.dtype:
    """The autocast dtype: bf16 where the GPU has bf16 tensor cores (sm_80+) or on a CPU; fp16 on a
    T4 or V100."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0):
        return torch.float16
    return torch.bfloat16


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, not {value!r}")


class Trainer:
    def __init__(self, cfg: GPTConfig, precision: str = "amp", optimizer="adamw",
                 recompute: str = "none", device=None, seed: int = 0, attention=None, loss=None):
        from memfit.runtime import DEVICE
        _check_choice("precision", precision, PRECISIONS)
        if not callable(optimizer):
            _check_choice("optimizer", optimizer, OPTIMIZERS)
        self.cfg, self.precision, self.device = cfg, precision, torch.device(device or DEVICE)
        torch.manual_seed(seed)
        from torch._guards import detect_fake_mode
        # under FakeTensorMode (lesson 08's predictions) the model is built on its device: moving a fake parameter's
        # .data keeps its old device, and module.to() fails to swap fake parameters
        with torch.device(self.device) if detect_fake_mode() is not None else contextlib.nullcontext():
            self.model = GPT(cfg, recompute, attention, loss)  # (attention, loss: the GPT's own unless given)
        # each parameter's data moved rather than module.to(): the same for this model (no buffers, a tied weight
        # is one Parameter)
        for p in self.model.parameters():
            p.data = p.data.to(self.device, torch.bfloat16 if precision == "bf16" else p.dtype)
        params = list(self.model.parameters())
        if callable(optimizer):
            self.optimizer = optimizer(params)
        elif optimizer == "adamw":
            self.optimizer = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.1, foreach=True)
        else:
            self.optimizer = torch.optim.SGD(params, lr=1e-2, momentum=0.9, foreach=True)
        self.low_dtype = amp_dtype(self.device)
        # fp16 autocast needs loss scaling (its exponent range is narrow); bf16 does not.
        self.scaler = torch.amp.GradScaler(self.device.type) if (
            precision == "amp" and self.low_dtype == torch.float16) else None
        self.phase = "idle"  # read by `timeline`

    def autocast(self):
        if self.precision != "amp":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.low_dtype)

    def step(self, idx: torch.Tensor, targets: torch.Tensor, accum: int = 1) -> torch.Tensor:
        """One optimizer step. With accum > 1, gradient accumulation: `accum` micro-batches of (idx, targets), a
        forward and a backward each, each loss divided by accum so that the gradients add up to the mean's; the
        gradients of the first stay alive through the others (lesson 08). Returns the last micro-batch's loss."""
        if isinstance(accum, bool) or not isinstance(accum, int) or accum < 1:
            raise ValueError(f"accum must be a positive int, not {accum!r}")
        for _ in range(accum):
            self.phase = "forward"
            with self.autocast():
                loss = self.model(idx, targets)
            self.phase = "backward"
            scaled = loss / accum if accum > 1 else loss
            (self.scaler.scale(scaled) if self.scaler else scaled).backward()
        self.phase = "optimizer"
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.phase = "idle"
        return loss.detach()  # a tensor: reading it would synchronize the GPU

    def state_bytes(self) -> dict[str, int]:
        """Bytes of the tensors that live between steps: parameters and optimizer states."""
        # AdamW's "step" counters are scalars kept on the CPU (unless capturable): not model states.
        states = [t for s in self.optimizer.state.values() for key, t in s.items()
                  if isinstance(t, torch.Tensor) and key != "step"]
        # buffers count with the parameters: a frozen weight kept as a buffer (lesson 08's NF4 codes) is the model's
        buffers = {id(b): b for b in self.model.buffers()}.values()
        return {"params": sum(p.numel() * p.element_size() for p in unique_parameters(self.model))
                + sum(b.numel() * b.element_size() for b in buffers),
                "optimizer": sum(t.numel() * t.element_size() for t in states)}


def random_batch(cfg: GPTConfig, batch: int, seq: int, device, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq + 1), generator=gen).to(device)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


class MarkovCorpus:
    """A synthetic language with a known floor: each token is followed by one of `branching` successors, drawn
    once from a seeded generator with random probabilities. A model that learns the chain reaches the chain's
    entropy rate (`floor`, in nats per token); from scratch it starts near log(vocab)."""

    def __init__(self, vocab: int, branching: int = 4, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.vocab = vocab
        self.successors = torch.stack([torch.randperm(vocab, generator=gen)[:branching] for _ in range(vocab)])
        self.probs = torch.rand(vocab, branching, generator=gen).add_(0.2)
        self.probs /= self.probs.sum(1, keepdim=True)
        # stationary distribution by power iteration, for the entropy rate
        transition = torch.zeros(vocab, vocab, dtype=torch.float64)
        transition.scatter_(1, self.successors, self.probs.double())
        pi = torch.full((vocab,), 1.0 / vocab, dtype=torch.float64)
        for _ in range(200):
            pi = pi @ transition
        self.floor = float(-(pi[:, None] * self.probs.double() * self.probs.double().log()).sum())

    def batch(self, batch: int, seq: int, gen: torch.Generator, device):
        """(idx, targets) of shape (batch, seq): walks of the chain from uniform random starts."""
        tokens = torch.empty(batch, seq + 1, dtype=torch.int64)
        tokens[:, 0] = torch.randint(0, self.vocab, (batch,), generator=gen)
        for t in range(seq):
            choice = torch.multinomial(self.probs[tokens[:, t]], 1, generator=gen).squeeze(1)
            tokens[:, t + 1] = self.successors[tokens[:, t], choice]
        tokens = tokens.to(device)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def loss_curve(cfg: GPTConfig, make_optimizer, steps: int, batch: int = 8, seq: int = 64, precision: str = "fp32",
               device=None, seed: int = 0) -> list[float]:
    """Train a fresh course GPT on the Markov corpus (the same model init and batches for every optimizer) and
    return the loss of every step: the convergence test of an optimizer against another."""
    corpus = MarkovCorpus(cfg.vocab_size, seed=seed)
    trainer = Trainer(cfg, precision, make_optimizer, device=device, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    losses = [trainer.step(*corpus.batch(batch, seq, gen, trainer.device)) for _ in range(steps)]
    return [float(x) for x in losses]


@dataclass
class StepMemory:
    peak: int  # bytes of tensors alive at the step's peak: states + the peak extra of the step
    states: dict[str, int]  # bytes alive before the step (params, optimizer)
    extra: int  # the meter's peak extra bytes during the step
    meter: str

    def __str__(self) -> str:
        from memfit.meter import format_bytes
        return f"peak {format_bytes(self.peak)} ({self.meter}): states {format_bytes(sum(self.states.values()))} + step {format_bytes(self.extra)}"


def measure_step(trainer: Trainer, batch: int, seq: int, meter: str | None = None) -> StepMemory:
    """Peak tensor memory of one steady-state training step (the optimizer states already exist:
    the warm-up step creates them)."""
    idx, targets = random_batch(trainer.cfg, batch, seq, trainer.device)
    trainer.step(idx, targets)  # warm-up: optimizer states, cuBLAS handles, autotuning
    states = trainer.state_bytes()
    _, report = measure_peak(trainer.step, idx, targets, device=trainer.device, meter=meter, warmup=False)
    return StepMemory(sum(states.values()) + report.peak_bytes, states, report.peak_bytes, report.meter)


# ------------------------------------------------------------------------------------------ timeline

@dataclass
class Timeline:
    ops: list[str] = field(default_factory=list)
    phases: list[str] = field(default_factory=list)
    allocated: list[int] = field(default_factory=list)  # bytes after each op, states included
    meter: str = ""

    @property
    def peak(self) -> int:
        return max(self.allocated)

    @property
    def peak_phase(self) -> str:
        return self.phases[self.allocated.index(self.peak)]


class _OpRecorder(TorchDispatchMode):
    def __init__(self, trainer: Trainer, timeline: Timeline, read_bytes):
        super().__init__()
        self.trainer, self.timeline, self.read_bytes = trainer, timeline, read_bytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.timeline.ops.append(str(func.overloadpacket))
        self.timeline.phases.append(self.trainer.phase)
        self.timeline.allocated.append(self.read_bytes())
        return out


def timeline(trainer: Trainer, idx: torch.Tensor, targets: torch.Tensor) -> Timeline:
    """Bytes of tensors alive after every op of one step, counted from the states' bytes (other allocations,
    workspaces and tensors of earlier cells, are not the step's): on a GPU from the CUDA allocator, on a CPU from
    the live-tensor meter."""
    line = Timeline()
    base = sum(trainer.state_bytes().values())
    with open_meter(trainer.device, stat="allocated") as meter:
        line.meter = meter.name
        # The recorder runs inside the meter, so each reading includes the op's outputs.
        with _OpRecorder(trainer, line, lambda: base + meter.current):
            trainer.step(idx, targets)
    return line


def bytes_after_forward(trainer: Trainer, idx: torch.Tensor, targets: torch.Tensor) -> int:
    """Bytes of tensors a forward pass leaves alive for backward: what autograd saved (or, under
    recomputation, what checkpointing kept), measured by the course meter."""
    with open_meter(trainer.device, stat="allocated") as meter:
        with trainer.autocast():
            loss = trainer.model(idx, targets)
        kept = meter.current
    del loss
    return kept


# ------------------------------------------------------------------------------------ saved tensors

@dataclass
class SavedTensor:
    module: str  # the innermost module running when autograd saved it
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int  # bytes of its whole storage (a saved view keeps all of it alive)
    kind: str  # "activation", "parameter" (a weight saved by its own op), "weight copy" (autocast's cast) or "ctx
    # attribute" (a tensor a custom Function kept as ctx.name = tensor, not through save_for_backward)


def saved_tensors(model: GPT, idx: torch.Tensor, targets: torch.Tensor, autocast=None) -> list[SavedTensor]:
    """Every distinct storage autograd saves during the forward pass of model(idx, targets) (through
    save_for_backward, or as an attribute of a custom Function's ctx), attributed to the module that saved it.
    Run with recompute="none" (checkpointing saves through
    its own hooks)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, SavedTensor] = {}
    stack = ["model"]
    names = {m: n for n, m in model.named_modules()}

    def pre(module, _args):
        stack.append(names[module] or "model")

    def post(module, _args, _out):
        stack.pop()

    def pack(t: torch.Tensor, module: str | None = None):
        ptr = t.untyped_storage().data_ptr()
        if ptr and ptr not in seen:
            if module is not None:
                kind = "ctx attribute"
            elif ptr in params:
                kind = "parameter"
            elif _is_weight_cast(t):
                kind = "weight copy"
            else:
                kind = "activation"
            seen[ptr] = SavedTensor(module or stack[-1], tuple(t.shape), t.dtype, t.untyped_storage().nbytes(), kind)
        return t

    # A custom autograd.Function may also keep tensors as attributes of its ctx (ctx.x = x) rather than through
    # save_for_backward: the graph holds them just the same, though no hook sees them (kind "ctx attribute", where
    # no hook saw the storage first). After each module's forward,
    # the graph behind its outputs not yet walked is its own (the innermost module's hook runs first).
    walked: set = set()

    def ctx_attributes(module, _args, out):
        for _function, _name, t in ctx_attribute_tensors(_tensors_of(out), walked):
            pack(t, names[module] or "model")

    handles = [m.register_forward_pre_hook(pre) for m in model.modules()]
    handles += [m.register_forward_hook(ctx_attributes) for m in model.modules()]
    handles += [m.register_forward_hook(post) for m in model.modules()]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), (autocast or contextlib.nullcontext()):
            loss = model(idx, targets)
    finally:
        for h in handles:
            h.remove()
    del loss
    return list(seen.values())


def ctx_attribute_tensors(tensors, walked: set | None = None, limit: int = 100_000):
    """(the custom autograd.Function, the attribute's name, the tensor) for every tensor a custom Function in the graph
    behind `tensors` keeps as an attribute of its ctx (ctx.x = x), walking each graph node once (`walked`, shared
    between calls, says which were) and at most `limit` nodes."""
    walked = set() if walked is None else walked
    nodes = [t.grad_fn for t in tensors if t.grad_fn is not None]
    while nodes and len(walked) < limit:
        node = nodes.pop()
        if node is None or node in walked:
            continue
        walked.add(node)
        function = getattr(node, "_forward_cls", None)  # set on a custom Function's node, which is its ctx
        if function is not None:
            for name, value in vars(node).items():
                for t in _tensors_of(value):
                    yield function, name, t
        nodes += [next_fn for next_fn, _ in node.next_functions]


def _tensors_of(value) -> list[torch.Tensor]:
    """The tensors of a value: itself, or those of a tuple, list or dict of them (one level deep is what a ctx or a
    module's output holds)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    if isinstance(value, dict):
        return [v for v in value.values() if isinstance(v, torch.Tensor)]
    return []


def _is_weight_cast(t: torch.Tensor) -> bool:
    """A cast of a parameter (autocast's low-precision weight copy), possibly seen through a view."""
    fn = t.grad_fn
    for _ in range(3):
        if fn is None:
            return False
        if type(fn).__name__.startswith("ToCopyBackward"):
            return any(type(nxt).__name__ == "AccumulateGrad" for nxt, _ in fn.next_functions if nxt is not None)
        fn = fn.next_functions[0][0] if fn.next_functions else None
    return False

