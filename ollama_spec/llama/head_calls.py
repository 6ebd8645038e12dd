"""The llama.cpp calls an EAGLE-3 head needs that llama-cpp-python does not bind, found at run time.

`llama-ext.h` declares them without `extern "C"`, so a build exports them under C++ names: Itanium
on Linux and macOS, MSVC on Windows; a build may also export plain names. Each is looked up under
all three; a build that has none of them cannot run a head, and says which version can.

The calls that read llama.cpp's float buffers are bound a second time here returning a plain address
(`*_at`): the head views each buffer once per address (head_rows.RowIO), where a ctypes pointer would
cost a numpy view built from it at every read. Those and the batch calls a head's pass is built with
return at once, and are bound to keep the GIL (`QuickCalls`): a ctypes call lets go of it, and every
call that does is a turn for the threads waiting for it (a server's readers, woken by the step loop
just before a pass), which then hold it for their own work while the head waits to build its batch,
and on a busy machine waits again to be scheduled. The passes let go of it, as llama-cpp-python's
bindings do: the readers run during them.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import llama_cpp

try:
    from llama_cpp import llama_cpp_ext
except ImportError:  # a build from before the staging calls: head_calls says what to install
    llama_cpp_ext = None

from ollama_spec.errors import ModelLoadError

# The first llama-cpp-python whose library exports the layer-input calls (0.3.36 vendors llama.cpp 0c1e570).
NEEDED_VERSION = "0.3.36"


class MissingHeadCalls(ModelLoadError):
    """The installed llama-cpp-python's library lacks a call an EAGLE-3 head needs."""


_ctx = llama_cpp.llama_context_p_ctypes
_model = llama_cpp.llama_model_p_ctypes
_SIGNATURES = {
    "llama_set_embeddings_layer_inp": (
        (
            "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
            "?llama_set_embeddings_layer_inp@@YAXPEAUllama_context@@I_N@Z",
        ),
        [_ctx, ctypes.c_uint32, ctypes.c_bool],
        None,
    ),
    "llama_get_embeddings_layer_inp": (
        (
            "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
            "?llama_get_embeddings_layer_inp@@YAPEAMPEAUllama_context@@I@Z",
        ),
        [_ctx, ctypes.c_uint32],
        ctypes.POINTER(ctypes.c_float),
    ),
    "llama_model_target_layer_ids": (
        ("_Z28llama_model_target_layer_idsPK11llama_model", "?llama_model_target_layer_ids@@YAPEBHPEBUllama_model@@@Z"),
        [_model],
        ctypes.POINTER(ctypes.c_int32),
    ),
    "llama_model_target_layer_ids_n": (
        (
            "_Z30llama_model_target_layer_ids_nPK11llama_model",
            "?llama_model_target_layer_ids_n@@YAIPEBUllama_model@@@Z",
        ),
        [_model],
        ctypes.c_uint32,
    ),
}

# HeadCalls' reads as addresses: (the names it is exported under, argtypes)
_ADDRESS_CALLS = {
    "layer_inp_at": (
        (
            "llama_get_embeddings_layer_inp",
            *_SIGNATURES["llama_get_embeddings_layer_inp"][0],
        ),
        [_ctx, ctypes.c_uint32],
    ),
    "nextn_at": (
        (
            "llama_get_embeddings_nextn",
            "_Z26llama_get_embeddings_nextnP13llama_context",
            "?llama_get_embeddings_nextn@@YAPEAMPEAUllama_context@@@Z",
        ),
        [_ctx],
    ),
    "nextn_ith_at": (
        (
            "llama_get_embeddings_nextn_ith",
            "_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
            "?llama_get_embeddings_nextn_ith@@YAPEAMPEAUllama_context@@H@Z",
        ),
        [_ctx, ctypes.c_int32],
    ),
    "logits_ith_at": (("llama_get_logits_ith",), [_ctx, ctypes.c_int32]),
}


@dataclass(frozen=True)
class HeadCalls:
    set_layer_inp: Callable[..., None]
    get_layer_inp: Callable[..., ctypes.POINTER(ctypes.c_float)]
    target_layer_ids: Callable[..., ctypes.POINTER(ctypes.c_int32)]
    target_layer_ids_n: Callable[..., int]
    set_nextn: Callable[..., None]
    get_nextn: Callable[..., ctypes.POINTER(ctypes.c_float)]
    get_nextn_ith: Callable[..., ctypes.POINTER(ctypes.c_float)]
    # the same reads as addresses (int, or None for none): llama_get_embeddings_layer_inp,
    # llama_get_embeddings_nextn, llama_get_embeddings_nextn_ith, llama_get_logits_ith
    layer_inp_at: Callable[..., int | None]
    nextn_at: Callable[..., int | None]
    nextn_ith_at: Callable[..., int | None]
    logits_ith_at: Callable[..., int | None]


def find_symbol(
    library: ctypes.CDLL, names: tuple[str, ...], argtypes: list, restype, *, keep_gil: bool = False
) -> Callable | None:
    """The first of `names` the library exports, typed; None when it has none of them. Each is a
    function object of its own (the library's attributes are shared with llama-cpp-python's bindings,
    whose types must stay theirs); with `keep_gil`, one called without letting go of the GIL."""
    for name in names:
        try:
            if keep_gil:
                return ctypes.PYFUNCTYPE(restype, *argtypes)((name, library))
            function = library[name]
        except AttributeError:
            continue
        function.argtypes, function.restype = argtypes, restype
        return function
    return None


@dataclass(frozen=True)
class QuickCalls:
    """llama-cpp-python's bindings of the calls a head's pass is built with, bound again to keep the GIL."""

    batch_clear: Callable[..., None]
    add_token: Callable[..., int]
    add_embd: Callable[..., int]
    set_pos: Callable[..., bool]
    set_embd_token: Callable[..., bool]
    set_output_logits: Callable[..., bool]
    set_output_embd: Callable[..., bool]
    seq_pos_max: Callable[..., int]
    seq_rm: Callable[..., bool]


@cache
def quick_calls() -> QuickCalls:
    """The batch calls, bound once (head_calls has checked that this llama-cpp-python has them), typed
    as llama.h declares them."""
    ptr, i32, flag, embd = ctypes.c_void_p, ctypes.c_int32, ctypes.c_bool, llama_cpp.llama_embd
    signatures = (  # name, argtypes, restype: in QuickCalls' order
        ("llama_batch_ext_clear", [ptr], None),
        ("llama_batch_ext_add_token", [ptr, i32, i32], i32),
        ("llama_batch_ext_add_embd", [ptr, i32, embd], i32),
        ("llama_batch_ext_set_pos", [ptr, i32, ctypes.POINTER(i32)], flag),
        ("llama_batch_ext_set_embd_token", [ptr, i32, embd], flag),
        ("llama_batch_ext_set_output_logits", [ptr, i32, flag], flag),
        ("llama_batch_ext_set_output_embd", [ptr, i32, flag], flag),
        ("llama_memory_seq_pos_max", [ptr, i32], i32),
        ("llama_memory_seq_rm", [ptr, i32, i32, i32], flag),
    )
    library = llama_cpp.llama_cpp._lib
    return QuickCalls(*(find_symbol(library, (name,), *signature, keep_gil=True) for name, *signature in signatures))


@cache
def head_calls() -> HeadCalls:
    """The calls, bound once; MissingHeadCalls (one line) where the installed build lacks any."""
    found, missing, library = {}, [], llama_cpp.llama_cpp._lib
    for plain, (mangled, argtypes, restype) in _SIGNATURES.items():
        function = find_symbol(library, (plain, *mangled), argtypes, restype)
        if function is None:
            missing.append(plain)
        found[plain] = function
    addresses = {
        name: find_symbol(library, names, argtypes, ctypes.c_void_p, keep_gil=True)
        for name, (names, argtypes) in _ADDRESS_CALLS.items()
    }
    nextn = [
        getattr(llama_cpp_ext, name, None) for name in ("llama_set_embeddings_nextn", "llama_get_embeddings_nextn")
    ]
    nextn.append(getattr(llama_cpp_ext, "llama_get_embeddings_nextn_ith", None))
    if missing or None in nextn or None in addresses.values() or not hasattr(llama_cpp, "llama_process"):
        missing += [] if missing else ["llama_get_embeddings_nextn / llama_process"]
        raise MissingHeadCalls(
            f"this llama-cpp-python ({llama_cpp.__version__}) lacks {', '.join(missing)}, which an EAGLE-3 "
            f"head needs: install llama-cpp-python >= {NEEDED_VERSION}"
        )
    return HeadCalls(
        found["llama_set_embeddings_layer_inp"],
        found["llama_get_embeddings_layer_inp"],
        found["llama_model_target_layer_ids"],
        found["llama_model_target_layer_ids_n"],
        *nextn,
        **addresses,
    )
