"""Run a model from a middle layer: the partial forward behind fast trials.

Every layer before the first calibrated one computes the same thing in every trial, so the hidden
states entering a layer L can be recorded once (during the uncalibrated baseline pass) and a trial
whose calibration starts at or after L runs only `layers[L:]`.

The partial forward reuses the model's own `forward`, so masks (padding, causal, sliding-window
layer types), position embeddings and the final norm are built exactly as in a full pass:

- layers before L are given a pass-through `forward` for the duration of the call (their input goes
  straight out, bare or in a one-item tuple as the model's layers return theirs; nothing is computed);
- a forward pre-hook on layer L swaps the hidden states it receives (the embeddings, passed through)
  for the recorded ones.

Recording uses forward pre-hooks too, only to read the hidden states entering a layer; they never
alter the computation. Whether a loaded model can be resumed like this is checked on a probe batch
(`LayerStack.resumable`): the resumed output must equal the full forward's, otherwise the caller
falls back to full forwards.

Documents are tokenised once per evaluator (`Batches`) in exactly the order and batches of
`CalibratedEncoder` (length-sorted, long first), and a resumed or recording pass is the encoder's own
loop (`encoder.forward`) with a per-batch scope from here, so a vector from a resumed pass is computed
from the same batch, with the same padding and the same code, as one from a full pass.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager

import torch

from tuner.calibration import CalibrationConfig
from tuner.engine.batching import Batches, BatchScope, to_device
from tuner.engine.models import LoadedModel

log = logging.getLogger(__name__)

PROBE_TEXTS = ("posfair probe of a resumed forward pass", "posfair probe " * 12)


class ResumeUnsupportedError(RuntimeError):
    """The model's layers cannot be found or resumed generically; use full forward passes."""


def starting_layers(configs: Iterable[CalibrationConfig | None], num_layers: int) -> tuple[int, ...]:
    """The layers worth caching for these configs: where each starts calibrating (never layer 0, which
    has nothing before it to skip)."""
    starts = {min(c.resolve_layers(num_layers)) for c in configs if c is not None}
    return tuple(sorted(s for s in starts if 0 < s < num_layers))


def resume_point(cached: Iterable[int], first_calibrated: int) -> int | None:
    """Where a pass whose first calibrated layer is `first_calibrated` resumes: the deepest of the `cached`
    layers (those whose inputs are recorded) at or before it; None when there is none (the full forward)."""
    return max((layer for layer in cached if layer <= first_calibrated), default=None)


# ----------------------------------------------------------------------------------------- layer stack


class _Stop(Exception):
    """Raised by a recording hook to end a pass once the deepest wanted layer's input is recorded."""


class LayerStack:
    """The model's list of transformer layers, found generically, and the hooks to record and resume."""

    def __init__(self, model: LoadedModel) -> None:
        self.loaded = model
        self.layers = _find_layers(model.model, model.num_layers)
        # whether a layer returns its hidden states as a tuple's first item (MPNet); see `resumable`
        self.in_tuple = False

    @contextmanager
    def recording(
        self, wanted: Sequence[int], sink: Callable[[int, torch.Tensor], None], stop: bool = False
    ) -> Iterator[None]:
        """Hand the hidden states entering each wanted layer to `sink(layer, states)`.

        With `stop`, the pass ends (with `_Stop`, caught by the caller) right after the deepest wanted
        layer's input is recorded: nothing past it is computed.
        """
        deepest = max(wanted)
        handles = []

        def make(layer: int) -> Callable:
            def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
                sink(layer, _hidden_of(args, kwargs))
                if stop and layer == deepest:
                    raise _Stop

            return hook

        try:
            for layer in wanted:
                handles.append(self.layers[layer].register_forward_pre_hook(make(layer), with_kwargs=True))
            yield
        finally:
            for handle in handles:
                handle.remove()

    @contextmanager
    def resuming(self, start: int) -> Iterator[Callable[[torch.Tensor], None]]:
        """Layers before `start` pass their input through; layer `start` receives the states fed in.

        Yields `feed(states)`, to be called once before each forward pass of the block.
        """
        pending: list[torch.Tensor] = []

        def inject(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            if not pending:
                raise RuntimeError(f"layer {start} was reached without cached hidden states fed in")
            states = pending.pop()
            incoming = _hidden_of(args, kwargs)
            if states.shape != incoming.shape:
                raise RuntimeError(
                    f"cached hidden states {tuple(states.shape)} do not fit this batch {tuple(incoming.shape)}"
                )
            states = to_device(states, incoming.device).to(dtype=incoming.dtype)
            if args:
                return (states, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": states}

        def feed(states: torch.Tensor) -> None:
            pending[:] = [states]

        with ExitStack() as stack:
            for layer in self.layers[:start]:
                stack.enter_context(_passing_through(layer, self.in_tuple))
            handle = self.layers[start].register_forward_pre_hook(inject, with_kwargs=True)
            stack.callback(handle.remove)
            yield feed

    def resumable(self, wanted: Sequence[int]) -> list[int]:
        """The wanted layers from which a resumed pass reproduces the full forward on a probe batch (which also
        shows how the layers return their hidden states, for the pass-through)."""
        tokenizer = self.loaded.tokenizer
        batch = tokenizer(
            list(PROBE_TEXTS), padding=True, truncation=True, max_length=self.loaded.max_length, return_tensors="pt"
        ).to(self.loaded.device)
        recorded: dict[int, torch.Tensor] = {}
        model = self.loaded.model
        good = []

        def note_form(module: torch.nn.Module, args: tuple, output: object) -> None:
            self.in_tuple = isinstance(output, tuple)

        with torch.inference_mode(), _one_thread():
            returned = self.layers[0].register_forward_hook(note_form)
            try:
                with self.recording(wanted, lambda layer, h: recorded.__setitem__(layer, h.clone())):
                    full = model(**batch).last_hidden_state
            finally:
                returned.remove()
            for layer in wanted:
                try:
                    with self.resuming(layer) as feed:
                        feed(recorded[layer])
                        resumed = model(**batch).last_hidden_state
                except Exception as error:  # noqa: BLE001 - any failure means "cannot resume here"
                    log.warning("layer %d: resuming a pass fails (%s); trials use full forward passes", layer, error)
                    continue
                if recorded[layer].dtype != model.dtype:
                    log.warning(
                        "layer %d: its input is %s, not the model's %s; not cached",
                        layer,
                        recorded[layer].dtype,
                        model.dtype,
                    )
                elif resumed.shape == full.shape and torch.equal(resumed, full):
                    good.append(layer)
                else:
                    log.warning(
                        "layer %d: a pass resumed there on %s does not reproduce the full forward bit for bit, so "
                        "its inputs are not cached: trials calibrating from it run the full forward (slower)",
                        layer,
                        self.loaded.device,
                    )
        return good


@contextmanager
def _one_thread() -> Iterator[None]:
    """A probe batch is tiny: threads only add synchronisation, which costs a lot on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _find_layers(model: torch.nn.Module, num_layers: int) -> torch.nn.ModuleList:
    """The ModuleList of `num_layers` blocks whose i-th block holds an attention module with layer_idx i."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == num_layers and num_layers > 0:
            indices = [{getattr(m, "layer_idx", None) for m in block.modules()} for block in module]
            if all(i in found_here for i, found_here in enumerate(indices)):
                found.append((name, module))
    if len(found) != 1:
        raise ResumeUnsupportedError(
            f"found {len(found)} candidate layer lists ({[n for n, _ in found]}); cannot resume a pass generically"
        )
    return found[0][1]


def _hidden_of(args: tuple, kwargs: dict) -> torch.Tensor:
    hidden = args[0] if args else kwargs.get("hidden_states")
    if not isinstance(hidden, torch.Tensor):
        raise ResumeUnsupportedError("a layer's first input is not its hidden states")
    return hidden


@contextmanager
def _passing_through(layer: torch.nn.Module, in_tuple: bool) -> Iterator[None]:
    """Make a layer return its input unchanged, bare or as a one-item tuple (any instance-level forward, e.g. a
    device hook, is restored)."""
    saved = layer.__dict__.get("forward")

    def forward(*args: object, **kwargs: object) -> torch.Tensor | tuple[torch.Tensor]:
        hidden = _hidden_of(args, kwargs)
        return (hidden,) if in_tuple else hidden

    layer.forward = forward
    try:
        yield
    finally:
        if saved is None:
            del layer.forward
        else:
            layer.forward = saved


# --------------------------------------------------------------------------------------------- passes

StateSource = Callable[[int], torch.Tensor]  # batch index → hidden states entering the resume layer
Sink = Callable[[int, int, torch.Tensor], None]  # (batch index, layer, hidden states entering it)


def resumed_from(stack: LayerStack, start: int, states: StateSource) -> BatchScope:
    """For `encoder.forward`: batch i runs only the layers from `start` on, from `states(i)`."""

    @contextmanager
    def scope(i: int) -> Iterator[None]:
        with stack.resuming(start) as feed:
            feed(states(i))
            yield

    return scope


def recorded_into(stack: LayerStack, layers: Sequence[int], sink: Sink, stop: bool = False) -> BatchScope:
    """For `encoder.forward`: batch i hands the hidden states entering `layers` to `sink(i, layer, states)`
    (with `stop`, the forward ends there: see `record_layer_inputs`)."""
    return lambda i: stack.recording(layers, lambda layer, states: sink(i, layer, states), stop=stop)


def record_layer_inputs(
    model: LoadedModel, batches: Batches, stack: LayerStack, layers: Sequence[int], sink: Sink
) -> None:
    """Record the hidden states entering `layers` for every batch and compute nothing past the deepest of them:
    no vectors come out of such a pass, so it is no encoding loop."""
    scope = recorded_into(stack, layers, sink, stop=True)
    with torch.inference_mode():
        for i, inputs in enumerate(batches.inputs):
            with scope(i):
                try:
                    model.model(**{k: to_device(v, model.device) for k, v in inputs.items()})
                except _Stop:
                    pass
