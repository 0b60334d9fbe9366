"""Read a pickle as data, never as code.

Python's `pickle` turns names into live objects (it imports modules and walks attributes) and
calls them (REDUCE, NEWOBJ, BUILD and `__setstate__`): that is how a file runs code when it is
loaded, whatever `find_class` allows, because an allowed module exposes its imports as
attributes. This reader does neither. It decodes the opcode stream (pickletools.genops, a pure
parser) into plain values in which a global is a `Global(module, name)` record, a call a `Call`
record and an instantiation an `Obj` record. A global not in the caller's exact allow-list of
(module, name) pairs is refused where it appears; so is every opcode not listed in `_HANDLED`
(INST, OBJ, EXT*, NEWOBJ_EX, out-of-band buffers). The caller turns the records into its own
values by matching them exactly: nothing here can import, call or look up anything.
"""

from __future__ import annotations

import pickletools
from dataclasses import dataclass, field
from typing import Any

MAX_ITEMS = 5_000_000  # values built; a tensor index of a 1T-parameter model is far below this


class PickleDataError(ValueError):
    """The pickle uses something a data-only reader does not accept."""


@dataclass(frozen=True)
class Global:
    module: str
    name: str

    def __str__(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass(eq=False)
class Call:
    """`func(*args)` as recorded by REDUCE (never performed)."""

    func: Global
    args: tuple


@dataclass(eq=False)
class Obj:
    """`cls.__new__(cls, *args)` then `BUILD state`, as recorded by NEWOBJ/BUILD (never performed)."""

    cls: Global
    args: tuple
    state: Any = None
    built: bool = field(default=False, repr=False)


@dataclass(frozen=True)
class PersistentId:
    value: Any


class _Mark:
    pass


_MARK = _Mark()


def load(data: bytes, allowed: frozenset[tuple[str, str]] | set[tuple[str, str]], *, persistent_ids: bool = False) -> Any:
    """The value the pickle describes, with globals, calls and objects as records."""
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    built = 0
    try:
        ops = pickletools.genops(data)
        for opcode, arg, pos in ops:
            name = opcode.name
            built += 1
            if built > MAX_ITEMS:
                raise PickleDataError(f"more than {MAX_ITEMS} items")
            if name == "STOP":
                if len(stack) != 1:
                    raise PickleDataError("malformed stack at STOP")
                return stack[0]
            handler = _HANDLED.get(name)
            if handler is None:
                raise PickleDataError(f"opcode {name} at byte {pos} is not accepted (data-only reader)")
            handler(stack, memo, arg, allowed, persistent_ids)
    except PickleDataError:
        raise
    except (ValueError, IndexError, KeyError, TypeError, EOFError) as exc:  # truncated or malformed
        raise PickleDataError(f"malformed pickle: {type(exc).__name__}: {exc}") from None
    raise PickleDataError("pickle ends without STOP")


def _pop_mark(stack: list[Any]) -> list[Any]:
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is _MARK:
            items = stack[i + 1:]
            del stack[i:]
            return items
    raise PickleDataError("MARK missing")


def _pop(stack: list[Any]) -> Any:
    value = stack.pop()
    if value is _MARK:
        raise PickleDataError("unexpected MARK")
    return value


def _global(stack: list[Any], module: str, name: str, allowed: Any) -> None:
    if (module, name) not in allowed:
        raise PickleDataError(f"refers to {module}.{name}, which this file never holds")
    stack.append(Global(module, name))


def _op_global(stack, memo, arg, allowed, pids):  # noqa: ANN001 - one signature for every handler
    module, _, name = str(arg).partition(" ")
    _global(stack, module, name, allowed)


def _op_stack_global(stack, memo, arg, allowed, pids):  # noqa: ANN001
    name, module = _pop(stack), _pop(stack)
    if not (isinstance(module, str) and isinstance(name, str)):
        raise PickleDataError("STACK_GLOBAL needs two strings")
    _global(stack, module, name, allowed)


def _op_reduce(stack, memo, arg, allowed, pids):  # noqa: ANN001
    args, func = _pop(stack), _pop(stack)
    if not isinstance(func, Global) or not isinstance(args, tuple):
        raise PickleDataError("REDUCE of something that is not an allowed global")
    stack.append(Call(func, args))


def _op_newobj(stack, memo, arg, allowed, pids):  # noqa: ANN001
    args, cls = _pop(stack), _pop(stack)
    if not isinstance(cls, Global) or not isinstance(args, tuple):
        raise PickleDataError("NEWOBJ of something that is not an allowed global")
    stack.append(Obj(cls, args))


def _op_build(stack, memo, arg, allowed, pids):  # noqa: ANN001
    state, target = _pop(stack), stack[-1]
    if not isinstance(target, Obj) or target.built:
        raise PickleDataError("BUILD on something that is not a new object")
    target.state, target.built = state, True


def _op_persid(stack, memo, arg, allowed, pids):  # noqa: ANN001
    if not pids:
        raise PickleDataError("persistent ids are not accepted here")
    value = arg if arg is not None else _pop(stack)
    stack.append(PersistentId(value))


def _push(value: Any):  # noqa: ANN202
    return lambda stack, memo, arg, allowed, pids: stack.append(value() if callable(value) else value)


def _push_arg(stack, memo, arg, allowed, pids):  # noqa: ANN001
    stack.append(arg)


def _op_int(stack, memo, arg, allowed, pids):  # noqa: ANN001
    stack.append(arg)  # genops decodes "I01"/"I00" as True/False already


def _op_tuple(n: int):  # noqa: ANN202
    def handler(stack, memo, arg, allowed, pids):  # noqa: ANN001
        items = [_pop(stack) for _ in range(n)][::-1]
        stack.append(tuple(items))
    return handler


def _op_tuple_mark(stack, memo, arg, allowed, pids):  # noqa: ANN001
    stack.append(tuple(_pop_mark(stack)))


def _op_list_mark(stack, memo, arg, allowed, pids):  # noqa: ANN001
    stack.append(list(_pop_mark(stack)))


def _op_dict_mark(stack, memo, arg, allowed, pids):  # noqa: ANN001
    items = _pop_mark(stack)
    stack.append(dict(zip(items[::2], items[1::2], strict=True)))


def _op_frozenset_mark(stack, memo, arg, allowed, pids):  # noqa: ANN001
    stack.append(frozenset(_pop_mark(stack)))


def _target(stack: list[Any], kind: type) -> Any:
    target = stack[-1]
    if not isinstance(target, kind):
        raise PickleDataError(f"expected a {kind.__name__} on the stack")
    return target


def _op_append(stack, memo, arg, allowed, pids):  # noqa: ANN001
    value = _pop(stack)
    _target(stack, list).append(value)


def _op_appends(stack, memo, arg, allowed, pids):  # noqa: ANN001
    items = _pop_mark(stack)
    _target(stack, list).extend(items)


def _op_setitem(stack, memo, arg, allowed, pids):  # noqa: ANN001
    value, key = _pop(stack), _pop(stack)
    _target(stack, dict)[key] = value


def _op_setitems(stack, memo, arg, allowed, pids):  # noqa: ANN001
    items = _pop_mark(stack)
    target = _target(stack, dict)
    for key, value in zip(items[::2], items[1::2], strict=True):
        target[key] = value


def _op_additems(stack, memo, arg, allowed, pids):  # noqa: ANN001
    items = _pop_mark(stack)
    _target(stack, set).update(items)


def _op_put(stack, memo, arg, allowed, pids):  # noqa: ANN001
    memo[int(arg)] = stack[-1]


def _op_memoize(stack, memo, arg, allowed, pids):  # noqa: ANN001
    memo[len(memo)] = stack[-1]


def _op_get(stack, memo, arg, allowed, pids):  # noqa: ANN001
    stack.append(memo[int(arg)])


def _op_mark(stack, memo, arg, allowed, pids):  # noqa: ANN001
    stack.append(_MARK)


def _op_pop(stack, memo, arg, allowed, pids):  # noqa: ANN001
    stack.pop()


def _op_pop_mark(stack, memo, arg, allowed, pids):  # noqa: ANN001
    _pop_mark(stack)


def _op_dup(stack, memo, arg, allowed, pids):  # noqa: ANN001
    stack.append(stack[-1])


def _op_nothing(stack, memo, arg, allowed, pids):  # noqa: ANN001
    pass


_HANDLED = {
    "PROTO": _op_nothing, "FRAME": _op_nothing,
    "MARK": _op_mark, "POP": _op_pop, "POP_MARK": _op_pop_mark, "DUP": _op_dup,
    "NONE": _push(None), "NEWTRUE": _push(True), "NEWFALSE": _push(False),
    "INT": _op_int, "BININT": _push_arg, "BININT1": _push_arg, "BININT2": _push_arg, "LONG": _push_arg,
    "LONG1": _push_arg, "LONG4": _push_arg, "FLOAT": _push_arg, "BINFLOAT": _push_arg,
    "UNICODE": _push_arg, "BINUNICODE": _push_arg, "SHORT_BINUNICODE": _push_arg, "BINUNICODE8": _push_arg,
    "BINBYTES": _push_arg, "SHORT_BINBYTES": _push_arg, "BINBYTES8": _push_arg,
    "EMPTY_TUPLE": _push(()), "TUPLE1": _op_tuple(1), "TUPLE2": _op_tuple(2), "TUPLE3": _op_tuple(3),
    "TUPLE": _op_tuple_mark, "EMPTY_LIST": _push(list), "LIST": _op_list_mark, "APPEND": _op_append,
    "APPENDS": _op_appends, "EMPTY_DICT": _push(dict), "DICT": _op_dict_mark, "SETITEM": _op_setitem,
    "SETITEMS": _op_setitems, "EMPTY_SET": _push(set), "ADDITEMS": _op_additems, "FROZENSET": _op_frozenset_mark,
    "PUT": _op_put, "BINPUT": _op_put, "LONG_BINPUT": _op_put, "MEMOIZE": _op_memoize,
    "GET": _op_get, "BINGET": _op_get, "LONG_BINGET": _op_get,
    "GLOBAL": _op_global, "STACK_GLOBAL": _op_stack_global, "REDUCE": _op_reduce, "NEWOBJ": _op_newobj,
    "BUILD": _op_build, "PERSID": _op_persid, "BINPERSID": _op_persid,
}
