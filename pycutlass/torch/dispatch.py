"""Which kernel serves each torch call, and launching it cheaply.

A :class:`Dispatch` lives in a pycutlass :class:`~pycutlass.Session` (``Dispatch.current()`` is the current
session's). For every call it

1. looks the call's *signature* (shapes, strides, dtypes, device, scalars, override) up in a table of bound launches:
   on a hit, the chosen kernel's cached ``Params`` get the new tensors' addresses patched in and one
   ``cuLaunchKernelEx`` goes to torch's current stream; the output comes from torch's allocator;
2. on a miss, classifies the call (types, layouts, alignment, epilogue: :mod:`.kernels`), picks the operation
   (a per-call override; the tuning table, exact or bucketed key, persisted in a tuning database when one is set;
   tuning now when ``tune=True``; else the nearest tuned shape of the class, else a default), runs it through the
   operation's Arguments, and binds the signature for the next call;
3. falls back to torch's own implementation (``fallback=True``) for calls no kernel supports, and says why with an
   ``ArgumentError`` otherwise.

``collecting()`` records calls instead (they compute with torch), and ``tune_calls`` tunes a recorded set: all
candidate kernels compile in one parallel ``add_module``, each is checked against torch and timed (CUDA events, L2
flushed) beside torch's own call, and the faster of the best kernel and torch is kept (``prefer_faster``).
"""
from __future__ import annotations

import contextlib
import json
import math
import threading

import torch

from ..errors import ArgumentError, PyCutlassError
from ..session import Session, SessionState, current
from . import kernels, reference
from .calls import TORCH, Choice, Collector, OpCall  # noqa: F401  (Choice and OpCall: public here too)
from .kernels import ConvClass, GemmClass

_UNALIGNED_ADDRESS = "an address not aligned to 4 bytes"
_ALIGNMENTS = {torch.float16: (8, 4, 2), torch.bfloat16: (8, 4, 2), torch.float64: (1,)}


# --- binding a call signature to a kernel ----------------------------------------------------------------------------
def _bind(arguments, tensors, vector_bytes):
    """The call bound to its kernel by the tensors' addresses (``pycutlass.runtime.launch.bind_launch``)."""
    from ..runtime.launch import bind_launch

    return bind_launch(arguments, [0 if t is None else t.data_ptr() for t in tensors], vector_bytes)


def _gemm_signature(a, b, bias, c, alpha, beta, activation, activation_arg, kernel) -> tuple:
    """Everything of a GEMM call but its addresses: calls with equal signatures launch the same way."""
    return (a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device, b.device,
            None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.device),
            None if c is None else (c.shape, c.stride(), c.dtype, c.device), alpha, beta, activation,
            activation_arg, kernel)


def _stream(device: torch.device) -> int:
    """torch's current stream on ``device`` (the raw handle; the cheap call inductor's generated code uses)."""
    return torch._C._cuda_getCurrentRawStream(device.index)


def _capturing() -> bool:
    return torch.cuda.is_current_stream_capturing()


def _spec(t):
    return None if t is None else (tuple(t.shape), tuple(t.stride()), t.dtype)


# --- the dispatch -----------------------------------------------------------------------------------------------------
class Dispatch(SessionState):
    """Kernel choice and launch state of one session for ``torch.ops.pycutlass.*``.

    Settings (``configure``): ``tune`` (tune a shape on first sight; default False: the model pass tunes ahead),
    ``fallback`` (run torch for calls no kernel supports; default True), ``policy`` (tuning key: ``"exact"`` or
    ``"pow2"`` buckets, or a function of the problem), ``db`` (a tuning database path: choices persist and are shared
    between processes), ``prefer_faster`` (keep torch where it is faster), ``family`` (``"auto"``, ``"sm80"``),
    ``pdl`` (launch SM90 GEMM kernels with programmatic dependent launch: each may start while the previous kernel
    of the stream drains; default False).
    """

    def __init__(self, session: Session):
        super().__init__(session)
        self.tune = False
        self.fallback = True
        self.policy = "exact"
        self.prefer_faster = True
        self.family = "auto"
        self.pdl = False
        self._db = None
        self._lock = threading.RLock()
        self._bound: dict = {}  # call signature -> BoundLaunch, or TORCH (cleared when a choice changes)
        self.generation = 0  # bumped whenever _bound is cleared: launch plans kept elsewhere check it
        # (operation name, call signature, pdl) -> BoundLaunch (kept: rebinding is free)
        self._by_operation: dict = {}
        self._choices: dict[str, dict] = {}  # tuning key -> {"kernel", "params", "us", "torch_us"}
        self._kernels: dict[str, object] = {}  # name -> operation (candidates, overrides, imported choices)
        self._params: dict[str, dict] = {}  # name -> params that rebuild it
        self._candidates: dict = {}  # class -> [(params, operation)]
        self._facts: dict[int, dict] = {}
        self._collector: Collector | None = None
        self.fallbacks: dict[str, int] = {}  # reason -> count: what ran on torch and why
        self.packs: list = []  # kernel packs (use_packs): when set, kernels come from them only, never compiled
        # operation name -> calls that built full Arguments because the signature could not be bound (Params that
        # cannot be patched): each costs a Params build and a sync, so a model's hot path should show none
        self.unbound_calls: dict[str, int] = {}

    def _forget_bound(self) -> None:
        self._bound.clear()
        self.generation += 1

    @classmethod
    def current(cls) -> "Dispatch":
        return cls.of(current())

    # --- settings ----------------------------------------------------------------------------------------------
    def configure(self, *, tune=None, fallback=None, policy=None, db=None, prefer_faster=None, family=None,
                  pdl=None):
        if policy is not None:
            from ..tune.autotune import bucket_of

            bucket_of(_Shape(1, 1, 1), policy)  # raises for a policy that is not one
            self.policy = policy
        if family is not None:
            if family not in ("auto", "sm80"):
                raise ArgumentError(f"family must be 'auto' or 'sm80', got {family!r}")
            self.family = family
            self._candidates.clear()
        for name, value in (("tune", tune), ("fallback", fallback), ("prefer_faster", prefer_faster), ("pdl", pdl)):
            if value is not None:
                if not isinstance(value, bool):
                    raise ArgumentError(f"{name} must be True or False, got {value!r}")
                setattr(self, name, value)
        if db is not None:
            from ..tune.db import ResultsDB

            self._db = db if isinstance(db, ResultsDB) else ResultsDB(db)
        self._forget_bound()
        return self

    def use_packs(self, packs) -> None:
        """Take every kernel from ``packs`` (loaded ``pycutlass.pack.Pack`` objects, searched in order): a call whose
        class no pack covers runs torch (counted in ``fallbacks``); nothing is tuned or compiled. With
        ``prefer_faster`` (the default) a shape whose entry measured torch faster than its kernel runs torch too.
        An empty list returns to tuning and the default candidates."""
        with self._lock:
            self.packs = list(packs)
            self._forget_bound()

    def register_kernel(self, operation, params: dict | None = None) -> str:
        """Make ``operation`` usable as a per-call override (``kernel=`` takes its name); returns the name."""
        if not hasattr(operation, "name") or not hasattr(operation, "emit"):
            raise ArgumentError(f"kernel must be a pycutlass operation or the name of a registered one, got "
                                f"{operation!r}")
        self._kernels[operation.name] = operation
        if params is not None:
            self._params[operation.name] = params
        return operation.name

    def kernels(self) -> dict:
        return dict(self._kernels)

    # --- collecting --------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def collecting(self):
        """Record every call (they compute with torch) for ``tune_calls``."""
        collector = Collector()
        previous, self._collector = self._collector, collector
        try:
            yield collector
        finally:
            self._collector = previous

    # --- GEMM --------------------------------------------------------------------------------------------------
    def gemm(self, a, b, bias, c, alpha, beta, activation, activation_arg, kernel):
        signature = _gemm_signature(a, b, bias, c, alpha, beta, activation, activation_arg, kernel)
        bound = self._bound.get(signature)
        if bound is not None and self._collector is None:
            if bound is TORCH:
                return reference.eager_gemm(a, b, bias, c, alpha, beta, activation, activation_arg)
            d = a.new_empty((a.shape[0], b.shape[1]))
            if bound.launch((a, b, bias, c, d), torch._C._cuda_getCurrentRawStream(a.device.index)):
                return d
        return self._gemm_slow(signature, a, b, bias, c, alpha, beta, activation, activation_arg, kernel)

    def bound_gemm(self, a, b, bias, c, alpha, beta, activation, activation_arg, kernel):
        """What this GEMM call's signature is bound to now (valid while ``generation`` stays): a kernel launch
        (``BoundLaunch``), ``TORCH``, or None when it is not bound (yet)."""
        return self._bound.get(_gemm_signature(a, b, bias, c, alpha, beta, activation, activation_arg, kernel))

    def _gemm_class(self, a, b, bias, c, beta, activation) -> tuple[GemmClass | None, str]:
        """The call's class, or None and why no kernel serves it."""
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
            raise ArgumentError(f"pycutlass.gemm: a must be M x K and b K x N, got {tuple(a.shape)} and "
                                f"{tuple(b.shape)}")
        m, k = a.shape
        n = b.shape[1]
        for name, t in (("b", b), ("bias", bias), ("c", c)):
            if t is not None and t.device != a.device:
                raise ArgumentError(f"pycutlass.gemm: {name} is on {t.device}, a on {a.device}")
            if t is not None and t.dtype != a.dtype:
                raise ArgumentError(f"pycutlass.gemm: {name} is {t.dtype}, a is {a.dtype}; all tensors must share "
                                    f"one dtype")
        if bias is not None and tuple(bias.shape) != (n,):
            raise ArgumentError(f"pycutlass.gemm: bias must have N = {n} values (one per output column), got shape "
                                f"{tuple(bias.shape)}")
        if c is not None and tuple(c.shape) != (m, n):
            raise ArgumentError(f"pycutlass.gemm: c must be M x N = {m} x {n}, got {tuple(c.shape)}")
        if a.dtype not in _ALIGNMENTS:
            return None, f"dtype {a.dtype} (kernels: float16, bfloat16, float64)"
        a_row, b_row = _major(a), _major(b)
        if a_row is None or b_row is None:
            return None, "an operand is neither row- nor column-major"
        if bias is not None and bias.stride(0) != 1 and n > 1:
            return None, "bias is not contiguous"
        if c is not None and beta != 0 and _major(c) is not True:
            return None, "c is not row-major"
        # the contiguous extent of each operand (CUTLASS's vector accesses run along it) and the leading dimensions
        extents = [k if a_row else m, n if b_row else k, n] + [_leading(t) for t in (a, b)] + \
            ([c.stride(0)] if c is not None else [])
        pointers = [t.data_ptr() for t in (a, b, bias, c) if t is not None]
        alignment = _alignment(a.dtype, extents, pointers)
        if alignment is None:
            if _alignment(a.dtype, extents, []) is not None:  # only this call's addresses: not its signature's
                return None, _UNALIGNED_ADDRESS
            return None, "extents or leading dimensions not multiples of 4 bytes"
        cc = self._device_cc(a.device)
        cls = GemmClass(str(a.dtype).removeprefix("torch."), a_row, b_row, alignment, activation, bias is not None,
                        c is not None and beta != 0, min(cc, 80) if self.family == "sm80" else cc)
        return cls, ""

    def _gemm_slow(self, signature, a, b, bias, c, alpha, beta, activation, activation_arg, kernel):
        cls, why = self._gemm_class(a, b, bias, c, beta, activation)
        m, k = a.shape
        n = b.shape[1]
        if self._collector is not None:
            if cls is not None:
                self._collector.calls.append(self._call("gemm", cls, (m, n, k), (a, b, bias, c),
                                                        (alpha, beta, activation, activation_arg), a.device))
            return reference.eager_gemm(a, b, bias, c, alpha, beta, activation, activation_arg)
        call = lambda: self._call("gemm", cls, (m, n, k), (a, b, bias, c), (alpha, beta, activation,  # noqa: E731
                                                                           activation_arg), a.device)
        operation = self._choose(cls, (m, n, k), kernel, why, call) if m and n and k else None
        if kernel and operation is not None and operation != TORCH:
            _check_override(operation, activation, None, bias is not None and c is not None and beta != 0)
        if operation is None or operation == TORCH:
            if m and n and k and why != _UNALIGNED_ADDRESS:  # an aligned call of this signature may use a kernel
                self._bound[signature] = TORCH
            return reference.eager_gemm(a, b, bias, c, alpha, beta, activation, activation_arg)
        d = torch.empty((m, n), dtype=a.dtype, device=a.device)
        known = self._by_operation.get((operation.name, signature, self.pdl))
        if known is not None and known.launch((a, b, bias, c, d), _stream(a.device)):
            self._bound[signature] = known
            return d
        self._check_not_capturing(operation)
        arguments = self._gemm_arguments(operation, a, b, bias, c, d, alpha, beta, activation_arg)
        operation.run(arguments)
        vectors = tuple(operation.A.alignment * a.element_size() for _ in range(5))
        self._remember(signature, operation, _bind(arguments, (a, b, bias, c, d), vectors))
        return d

    def _remember(self, signature, operation, bound) -> None:
        if bound is not None:
            self._bound[signature] = bound
            self._by_operation[(operation.name, signature, self.pdl)] = bound
        else:
            self.unbound_calls[operation.name] = self.unbound_calls.get(operation.name, 0) + 1

    def _gemm_arguments(self, operation, a, b, bias, c, d, alpha, beta, activation_arg):
        from ..kinds import GemmArguments

        m, k = a.shape
        n = b.shape[1]
        args = (activation_arg,) if operation.epilogue_functor.num_activation_args else ()
        stream = _stream(a.device)
        # pdl: only kernels built to wait on the previous grid take it (SM90 GEMMs but stream-K)
        knobs = {"pdl": True} if self.pdl and operation.pdl_refusal is None else {}
        if operation.bias:  # SM90: the bias vector is an epilogue input
            output_op = operation.epilogue_type(alpha, beta if c is not None else 0.0, *args)
            return GemmArguments(operation, (m, n, k), a, b, c if beta != 0 else None, d, output_op=output_op,
                                 stream=stream, device=a.device.index, session=self.session, bias=bias, **knobs)
        if bias is not None:  # Sm80 family: C is the bias, broadcast over rows (PyCUTLASS's bias=True)
            output_op = operation.epilogue_type(alpha, 1.0, *args)
            return GemmArguments(operation, (m, n, k), a, b, bias, d, output_op=output_op, stream=stream,
                                 device=a.device.index, session=self.session, bias=True)
        output_op = operation.epilogue_type(alpha, beta if c is not None else 0.0, *args)
        return GemmArguments(operation, (m, n, k), a, b, c if c is not None and beta != 0 else None, d,
                             output_op=output_op, stream=stream, device=a.device.index, session=self.session,
                             **knobs)

    # --- batched and grouped GEMM ---------------------------------------------------------------------------------
    def bmm(self, a, b, bias, alpha, activation, activation_arg, kernel):
        # Each batch runs through the GEMM path (its kernels, bound launches and fallbacks): one launch per matrix.
        # CUTLASS's batched mode (one launch) is not used yet (docs/torch.md).
        if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
            raise ArgumentError(f"pycutlass.bmm: a must be L x M x K and b L x K x N, got {tuple(a.shape)} and "
                                f"{tuple(b.shape)}")
        if bias is not None and tuple(bias.shape) not in ((b.shape[2],), (a.shape[0], b.shape[2])):
            raise ArgumentError(f"pycutlass.bmm: bias must be (N,) or (L, N), got {tuple(bias.shape)}")
        out = torch.empty((a.shape[0], a.shape[1], b.shape[2]), dtype=a.dtype, device=a.device)
        for i in range(a.shape[0]):
            vector = None if bias is None else (bias if bias.dim() == 1 else bias[i])
            out[i] = self.gemm(a[i], b[i], vector, None, alpha, 0.0, activation, activation_arg, kernel)
        return out

    def grouped_gemm(self, a, b, bias, alpha, activation, activation_arg, kernel):
        if len(a) != len(b) or (bias is not None and len(bias) != len(a)):
            raise ArgumentError(f"pycutlass.grouped_gemm: {len(a)} a, {len(b)} b and "
                                f"{'no' if bias is None else len(bias)} bias tensors; give one of each per group")
        biases = bias if bias is not None else [None] * len(a)
        return [self.gemm(x, y, z, None, alpha, 0.0, activation, activation_arg, kernel)
                for x, y, z in zip(a, b, biases)]

    # --- convolutions --------------------------------------------------------------------------------------------
    def conv2d(self, x, weight, bias, stride, padding, dilation, activation, activation_arg, kernel):
        signature = ("conv2d", x.shape, x.stride(), weight.shape, weight.stride(), x.dtype, x.device, weight.dtype,
                     weight.device, None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.device),
                     stride, padding, dilation, activation, activation_arg, kernel)
        return self._conv("fprop", signature, x, weight, bias, stride, padding, dilation, activation,
                          activation_arg, kernel)

    def conv2d_dgrad(self, grad, weight, input_size, stride, padding, dilation, kernel):
        signature = ("dgrad", grad.shape, grad.stride(), weight.shape, weight.stride(), grad.dtype, grad.device,
                     weight.dtype, weight.device, input_size, stride, padding, dilation, kernel)
        return self._conv("dgrad", signature, grad, weight, None, stride, padding, dilation, "identity", 0.0,
                          kernel, input_size=input_size)

    def conv2d_wgrad(self, grad, x, weight_size, stride, padding, dilation, kernel):
        signature = ("wgrad", grad.shape, grad.stride(), x.shape, x.stride(), grad.dtype, grad.device, x.dtype,
                     x.device, weight_size, stride, padding, dilation, kernel)
        return self._conv("wgrad", signature, grad, x, None, stride, padding, dilation, "identity", 0.0, kernel,
                          weight_size=weight_size)

    def _conv_geometry(self, conv_kind, first, second, input_size, weight_size, stride, padding, dilation):
        """(x shape, weight shape, output shape) in NCHW / KCRS order."""
        if conv_kind == "fprop":
            x_shape, w_shape = tuple(first.shape), tuple(second.shape)
        elif conv_kind == "dgrad":
            x_shape, w_shape = tuple(input_size), tuple(second.shape)
        else:
            x_shape, w_shape = tuple(second.shape), tuple(weight_size)
        if len(x_shape) != 4 or len(w_shape) != 4 or x_shape[1] != w_shape[1]:
            raise ArgumentError(f"pycutlass.conv2d: input {x_shape} and weight {w_shape} must be N x C x H x W and "
                                f"K x C x R x S with the same C (groups are not supported)")
        y_shape = tuple(reference.conv2d_output_size(x_shape, w_shape, stride, padding, dilation))
        if min(y_shape) < 1:
            raise ArgumentError(f"pycutlass.conv2d: the output would be {y_shape}")
        return x_shape, w_shape, y_shape

    def _conv(self, conv_kind, signature, first, second, bias, stride, padding, dilation, activation,
              activation_arg, kernel, input_size=None, weight_size=None):
        cl = torch.channels_last
        first = first if first.is_contiguous(memory_format=cl) else first.contiguous(memory_format=cl)
        second = second if second.is_contiguous(memory_format=cl) else second.contiguous(memory_format=cl)
        out_shape = (tuple(input_size) if conv_kind == "dgrad" else tuple(weight_size) if conv_kind == "wgrad"
                     else None)
        bound = self._bound.get(signature)
        if bound is TORCH and self._collector is None:
            return self._conv_torch(conv_kind, first, second, bias, stride, padding, dilation, activation,
                                    activation_arg, input_size, weight_size)
        if bound is not None and self._collector is None:
            if out_shape is None:
                out_shape = reference.conv2d_output_size(first.shape, second.shape, stride, padding, dilation)
            out = torch.empty(out_shape, dtype=first.dtype, device=first.device, memory_format=cl)
            if bound.launch((first, second, bias, out), _stream(first.device)):
                return out
        return self._conv_slow(conv_kind, signature, first, second, bias, stride, padding, dilation, activation,
                               activation_arg, kernel, input_size, weight_size)

    def _conv_torch(self, conv_kind, first, second, bias, stride, padding, dilation, activation, activation_arg,
                    input_size, weight_size):
        if conv_kind == "fprop":
            return reference.eager_conv2d(first, second, bias, stride, padding, dilation, activation, activation_arg)
        if conv_kind == "dgrad":
            return reference.conv2d_dgrad(first, second, input_size, stride, padding, dilation)
        return reference.conv2d_wgrad(first, second, weight_size, stride, padding, dilation)

    def _conv_slow(self, conv_kind, signature, first, second, bias, stride, padding, dilation, activation,
                   activation_arg, kernel, input_size, weight_size):
        x_shape, w_shape, y_shape = self._conv_geometry(conv_kind, first, second, input_size, weight_size, stride,
                                                        padding, dilation)
        for name, t in (("second operand", second), ("bias", bias)):
            if t is not None and (t.device != first.device or t.dtype != first.dtype):
                raise ArgumentError(f"pycutlass.conv2d: the {name} is {t.dtype} on {t.device}, the first operand "
                                    f"{first.dtype} on {first.device}")
        if bias is not None and tuple(bias.shape) != (w_shape[0],):
            raise ArgumentError(f"pycutlass.conv2d: bias must have K = {w_shape[0]} values, got {tuple(bias.shape)}")
        torch_args = (conv_kind, first, second, bias, stride, padding, dilation, activation, activation_arg,
                      input_size, weight_size)
        problem = (*x_shape[:1], *x_shape[2:], x_shape[1], w_shape[0], *w_shape[2:], stride, padding, dilation)
        cls, why = None, f"dtype {first.dtype} (conv kernels: float16, bfloat16)"
        if first.dtype in (torch.float16, torch.bfloat16):
            pointers = [t.data_ptr() for t in (first, second, bias) if t is not None]
            alignment = _alignment(first.dtype, [x_shape[1], w_shape[0]], pointers)
            if alignment is None:
                why = _UNALIGNED_ADDRESS if _alignment(first.dtype, [x_shape[1], w_shape[0]], []) is not None \
                    else "channel counts not multiples of 2"
            elif bias is not None and bias.shape[0] > 1 and bias.stride(0) != 1:
                why = "bias is not contiguous"  # the kernel reads it as K contiguous values
            else:
                cls = ConvClass(str(first.dtype).removeprefix("torch."), conv_kind, alignment, activation,
                                bias is not None, tuple(stride) == (1, 1), self._device_cc(first.device))
        call = lambda: self._call("conv2d" if conv_kind == "fprop" else f"conv2d_{conv_kind}", cls,  # noqa: E731
                                  problem, (first, second, bias), (activation, activation_arg, input_size,
                                                                   weight_size), first.device)
        if self._collector is not None:
            if cls is not None:
                self._collector.calls.append(call())
            return self._conv_torch(*torch_args)
        operation = self._choose(cls, problem, kernel, why, call)
        if operation is not None and operation != TORCH:
            if kernel:
                _check_override(operation, activation, conv_kind)
            try:  # CUTLASS's can_implement (filters above 32x32, strided dgrad with dilation, 2 GiB tensors, ...)
                operation.check_problem_size(_conv_problem(x_shape, w_shape, stride, padding, dilation))
            except ArgumentError as error:
                if kernel:
                    raise
                operation = self._no_kernel(str(error))
        if operation is None or operation == TORCH:
            if why != _UNALIGNED_ADDRESS:
                self._bound[signature] = TORCH
            return self._conv_torch(*torch_args)
        out_shape = {"fprop": y_shape, "dgrad": x_shape, "wgrad": w_shape}[conv_kind]
        out = torch.empty(out_shape, dtype=first.dtype, device=first.device, memory_format=torch.channels_last)
        known = self._by_operation.get((operation.name, signature, self.pdl))
        if known is not None and known.launch((first, second, bias, out), _stream(first.device)):
            self._bound[signature] = known
            return out
        self._check_not_capturing(operation)
        arguments = self._conv_arguments(operation, conv_kind, x_shape, w_shape, first, second, bias, out, stride,
                                         padding, dilation, activation_arg)
        operation.run(arguments)
        vectors = tuple(operation.A.alignment * first.element_size() for _ in range(4))
        self._remember(signature, operation, _bind(arguments, (first, second, bias, out), vectors))
        return out

    def _conv_arguments(self, operation, conv_kind, x_shape, w_shape, first, second, bias, out, stride, padding,
                        dilation, activation_arg):
        from ..kinds import Conv2dArguments

        k = w_shape[0]
        problem = _conv_problem(x_shape, w_shape, stride, padding, dilation)
        args = (activation_arg,) if operation.epilogue_functor.num_activation_args else ()
        c_operand = None
        if bias is not None:
            c_operand = bias.view(1, k, 1, 1).expand(*out.shape)
        output_op = operation.epilogue_type(1.0, 1.0 if bias is not None else 0.0, *args)
        return Conv2dArguments(operation, problem, first, second, c_operand, out, output_op=output_op,
                               stream=_stream(first.device), device=first.device.index, session=self.session)

    # --- choosing ---------------------------------------------------------------------------------------------------
    def _choose(self, cls, problem, kernel: str, why: str, call=None):
        """The operation for a call (or TORCH / None: run torch). ``call()`` makes an OpCall of it (tuning)."""
        if kernel:
            if kernel == TORCH:
                return TORCH
            operation = self._kernels.get(kernel)
            if operation is None:
                raise ArgumentError(f"kernel {kernel!r} is not registered with this session's dispatch; pass the "
                                    f"operation itself, or one of {sorted(self._kernels)[:8]}")
            return operation
        if cls is None:
            return self._no_kernel(why)
        if self.packs:
            return self._from_packs(cls, problem)
        candidates = self.candidates(cls)
        if not candidates:
            return self._no_kernel(f"no CUTLASS configuration builds for {cls}")
        key = self.tuning_key(cls, problem)
        choice = self.lookup(key)
        if choice is None and self.tune and call is not None and not _capturing():
            self.tune_calls([call()], progress=False)
            choice = self.lookup(key)
        if choice is None:
            choice = self._nearest(cls, problem)
        if choice is not None:
            return TORCH if choice["kernel"] == TORCH else self._operation(choice["kernel"], choice.get("params"))
        if isinstance(cls, GemmClass):
            params, operation = kernels.default_gemm(candidates, problem[0], problem[1])
        else:
            gemm_m, gemm_n = _conv_gemm_mn(cls, problem)
            params, operation = kernels.default_conv(candidates, gemm_m, gemm_n)
        self._params.setdefault(operation.name, params)
        return self._kernels.setdefault(operation.name, operation)

    def _from_packs(self, cls, problem):
        """The loaded packs' kernel for a call (its class's exact entry or the nearest), or torch when none covers
        the class."""
        if isinstance(cls, GemmClass):
            from ..pack import CallQuery

            epilogue = "linear_combination" if cls.activation == "identity" else cls.activation
            query = CallQuery(cls.dtype, cls.dtype, cls.dtype, "row" if cls.a_row else "col",
                              "row" if cls.b_row else "col", (cls.alignment,) * 3, epilogue,
                              "column" if cls.bias else None, cls.c)
            for pack in self.packs:
                entry, how, _ = pack.choose(query, problem)
                if entry is not None:
                    pack.stats[how] += 1
                    versus_torch = entry.measured.get("vs_torch")
                    # tuning kept torch for this shape, or the pack's measurements say torch is faster here
                    if entry.kernel == TORCH or (self.prefer_faster and versus_torch is not None and versus_torch < 1):
                        return TORCH
                    operation = pack.operation(entry.kernel)
                    self._kernels.setdefault(operation.name, operation)
                    return operation
        return self._no_kernel(f"no loaded pack covers {cls}")

    def _no_kernel(self, why: str):
        if not self.fallback:
            raise ArgumentError(f"no pycutlass kernel serves this call: {why}; allow torch to run it with "
                                f"pycutlass.torch.configure(fallback=True)")
        self.fallbacks[why] = self.fallbacks.get(why, 0) + 1
        return None

    def candidates(self, cls) -> list:
        found = self._candidates.get(cls)
        if found is None:
            found = kernels.gemm_candidates(cls) if isinstance(cls, GemmClass) else kernels.conv_candidates(cls)
            self._candidates[cls] = found
            for params, operation in found:
                self._kernels.setdefault(operation.name, operation)
                self._params.setdefault(operation.name, params)
        return found

    def _operation(self, name: str, params):
        operation = self._kernels.get(name)
        if operation is None:
            if not params:
                raise ArgumentError(f"the tuned kernel {name} is unknown here and has no parameters to rebuild it")
            operation = kernels.build(params)
            self._kernels[operation.name] = operation
            self._params[operation.name] = params
        return operation

    def _device_cc(self, device: torch.device) -> int:
        major, minor = torch.cuda.get_device_capability(device)
        return major * 10 + minor

    def _facts_of(self, cls) -> dict:
        cc = cls.cc
        found = self._facts.get(cc)
        if found is None:
            from ..tune.autotune import local_device_facts

            try:
                found = local_device_facts(torch.cuda.current_device())
            except PyCutlassError:
                found = {"device": "unknown", "cc": cc}
            self._facts[cc] = found
        return found

    def tuning_key(self, cls, problem) -> str:
        from ..tune.autotune import bucket_of, policy_name, tuning_key

        bucket = tuple(problem) if isinstance(cls, ConvClass) else bucket_of(_Shape(*problem), self.policy)
        return tuning_key(self._facts_of(cls), cls.signature(), bucket, policy_name(self.policy))

    def lookup(self, key: str) -> dict | None:
        """The choice for a tuning key (``OpCall.key``): from this dispatch's table, else from its tuning database;
        None when the key was never tuned."""
        found = self._choices.get(key)
        if found is None and self._db is not None:
            row = self._db.tuning(key)
            if row is not None:
                found = {"kernel": row["kernel"], "params": json.loads(row["params"]) or None,
                         "us": row["seconds"] * 1e6 if row["seconds"] else None}
                self._choices[key] = found
        return found

    def _nearest(self, cls, problem) -> dict | None:
        """A shape never tuned (dynamic batch sizes): the tuned shape of the same class nearest in log distance."""
        if not isinstance(cls, GemmClass):
            return None
        signature, facts = cls.signature(), self._facts_of(cls)
        best, best_distance = None, math.inf
        for key, choice in self._choices.items():
            parsed = json.loads(key)
            # (imported choices may come from another GPU: its kernels may not build or run on this one)
            if parsed.get("op") != signature or parsed.get("device") != json.loads(json.dumps(facts)):
                continue
            bucket = parsed["bucket"][:3]
            distance = sum(abs(math.log2(max(a, 1)) - math.log2(max(b, 1))) for a, b in zip(bucket, problem))
            if distance < best_distance:
                best, best_distance = choice, distance
        return best

    def set_choice(self, key: str, choice: dict, candidates: int) -> None:
        """Record ``choice`` (``kernel``, ``params``, ``us``, ``torch_us``, ...) for a tuning key, chosen among
        ``candidates`` kernels: in the table, and in the tuning database when one is set."""
        with self._lock:
            self._choices[key] = choice
            self._forget_bound()  # signatures bound to the previous choice
        if self._db is not None:
            from ..tune.autotune import policy_name

            seconds = (choice.get("us") or 0.0) / 1e6
            self._db.put_tuning(key, choice["kernel"], choice.get("params") or {}, seconds,
                                policy_name(self.policy), candidates)

    # --- tuning -------------------------------------------------------------------------------------------------------
    def _call(self, op, cls, problem, tensors, scalars, device) -> OpCall:
        layer = self._collector.layer if self._collector is not None else ""
        return OpCall(op, layer, self.tuning_key(cls, problem), tuple(_spec(t) for t in tensors), scalars,
                      device.index, cls, tuple(problem))

    def tune_calls(self, calls, *, jobs: int | None = None, progress: bool = True,
                   prefer_faster: bool | None = None, repetitions: int = 30, max_compiles="auto",
                   timed=None) -> list[Choice]:
        """Tune every distinct call: compile the candidates at once (at most ``max_compiles`` outside the kernel
        cache; ``"auto"``: one round of ``jobs``), then check and time each beside torch. ``timed(phase)``, if
        given: a context manager around each phase (``rank``, ``compile``, ``tune``), e.g.
        ``OptimizeReport.timed``."""
        from .tuning import tune_calls

        prefer = self.prefer_faster if prefer_faster is None else prefer_faster
        return tune_calls(self, list(calls), jobs=jobs, progress=progress, prefer_faster=prefer,
                          repetitions=repetitions, max_compiles=max_compiles, timed=timed)

    # --- persistence ---------------------------------------------------------------------------------------------
    def export_state(self) -> dict:
        """The tuning choices as JSON-able data (kernels by name and by the parameters that rebuild them)."""
        from ..tune.autotune import policy_name

        choices = {}
        for key, choice in self._choices.items():
            entry = dict(choice)
            if entry["kernel"] != TORCH and not entry.get("params"):
                entry["params"] = self._params.get(entry["kernel"])
            choices[key] = entry
        return {"format": 1, "policy": policy_name(self.policy), "choices": choices}

    def import_state(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("format") != 1 or not isinstance(state.get("choices"), dict):
            raise ArgumentError("not a pycutlass.torch dispatch state (expected format 1 with 'choices')")
        with self._lock:
            for key, choice in state["choices"].items():
                if choice.get("kernel") != TORCH and choice.get("params"):
                    self._params.setdefault(choice["kernel"], choice["params"])
                self._choices[key] = dict(choice)
            self._forget_bound()

    def clear(self) -> None:
        """Forget choices and bound launches (compiled kernels stay in the compiler's cache)."""
        with self._lock:
            self._choices.clear()
            self._forget_bound()

    def _check_not_capturing(self, operation) -> None:
        if _capturing():
            raise ArgumentError(f"{operation.name}: first call of this shape during CUDA graph capture; run the "
                                f"model once before capturing (pycutlass prepares a kernel's launch on first use)")


class _Shape:
    """A GEMM problem for the key policies (``m``, ``n``, ``k``, ``batch``)."""

    __slots__ = ("m", "n", "k", "batch")

    def __init__(self, m, n, k, batch=1):
        self.m, self.n, self.k, self.batch = m, n, k, batch


def _major(t) -> bool | None:
    """True: row-major (rows contiguous), False: column-major, None: neither."""
    rows, cols = t.shape
    if t.stride(1) == 1 and (t.stride(0) >= cols or rows == 1):
        return True
    if t.stride(0) == 1 and (t.stride(1) >= rows or cols == 1):
        return False
    return None


def _leading(t) -> int:
    return t.stride(0) if _major(t) else t.stride(1)


def _alignment(dtype, extents, pointers) -> int | None:
    """The widest access (elements) that every extent and leading dimension and every address allows."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    for alignment in _ALIGNMENTS[dtype]:
        if all(e % alignment == 0 for e in extents) and all(p % (alignment * itemsize) == 0 for p in pointers):
            return alignment
    return None


def _conv_problem(x_shape, w_shape, stride, padding, dilation):
    from ..kinds.conv2d.problem import Conv2dProblemSize

    n, c, h, w = x_shape
    k, _, r, s = w_shape
    return Conv2dProblemSize((n, h, w, c), (k, r, s, c), (padding[0], padding[0], padding[1], padding[1]),
                             tuple(stride), tuple(dilation))


def _check_override(operation, activation: str, conv_kind: str | None = None, bias_and_c: bool = False) -> None:
    """A per-call override must compute what the call asks: its epilogue's activation, its convolution kind, and
    (Sm80 family, which adds a bias as a broadcast C) not a bias together with C."""
    functor = operation.epilogue_functor
    found = getattr(getattr(functor, "activation", None), "name", None) or "identity"
    if functor is not None and found != activation:
        raise ArgumentError(f"kernel {operation.name} applies the activation {found!r}, the call asks for "
                            f"{activation!r}")
    kind = operation.conv_kind.name if operation.conv_kind is not None else None
    if kind != conv_kind:
        raise ArgumentError(f"kernel {operation.name} is {'a ' + kind + ' convolution' if kind else 'a GEMM'}, the "
                            f"call is {'a ' + conv_kind + ' convolution' if conv_kind else 'a GEMM'}")
    if bias_and_c and not operation.bias:
        raise ArgumentError(f"kernel {operation.name} adds a bias through C (Sm80 family): it cannot also add C; "
                            f"pass an SM90 operation built with bias='column', or leave kernel unset")


def _conv_gemm_mn(cls: ConvClass, problem) -> tuple[int, int]:
    n, h, w, c, k, r, s = problem[:7]
    if cls.conv_kind == "wgrad":
        return k, r * s * c
    return n * h * w, k if cls.conv_kind == "fprop" else c
