"""Constants whose values OpenVINO asks for only while it writes the .bin, freed once it is written.

openvino.utils.make_postponed_constant makes an `openvino.Op` written in Python, and such an op keeps
its own Python object alive from C++: the PyOp trampoline holds a reference to the object it was made
with (`super().__init__(self)`), which holds the C++ node. Neither is ever freed, nor anything its
maker holds. A build's makers hold the weight forms and through them the opened source (a GGUF's
memory map and metadata), so every build in one process kept about its model's size: a 1.5 MB qwen3
GGUF, +2.2 MB of RSS and one more mapping of the file a build (openvino 2026.4.1).

Here the C++ node is made with a stand-in object instead, and the Python objects are held by their
`PostponedConstants`, which the IR's writer releases once the IR is written: each maker is dropped,
the Python objects are freed, and the nodes go with the model. Nothing of a postponed constant may
refer back to its owner but weakly (a cycle through an op's Python object is never collected).
"""

import weakref
from functools import cache


class PostponedConstant:
    """What the C++ node holds instead of its Python object (the class name is the node's type name)."""


class PostponedConstants:
    """The postponed constants of one IR: made by `make`, alive until `release`."""

    def __init__(self):
        self._alive: list = []

    def make(self, element_type, shape, maker, name: str | None = None):
        """A constant of `element_type` and `shape` whose value `maker()` (an ov.Tensor) makes while the
        IR is written (the arguments of openvino.utils.make_postponed_constant)."""
        return _op_class()(element_type, shape, maker, weakref.ref(self), name)

    def release(self) -> None:
        """Once the IR is written: the makers dropped and the Python objects freed."""
        for op in self._alive:
            op.m_maker = None
        self._alive.clear()

    def __len__(self) -> int:
        return len(self._alive)


@cache
def _op_class():
    """openvino.utils.postponed_constant.PostponedConstant, held by its owner instead of by itself (made
    when first used: importing OpenVINO is for the commands that build an IR)."""
    from openvino import Op, PartialShape

    class Postponed(Op):
        def __init__(self, element_type, shape, maker, owner, name: str | None = None):
            super().__init__(PostponedConstant())
            constants = owner()
            if constants is None:  # a clone made after the IR was written: a caller kept the model in use
                raise RuntimeError("a postponed constant was used after its IR was written and released")
            constants._alive.append(self)
            self.get_rt_info()["postponed_constant"] = True  # what the serializer looks for; any value
            self.m_element_type, self.m_shape, self.m_maker, self.m_owner = element_type, shape, maker, owner
            if name is not None:
                self.friendly_name = name
            self.constructor_validate_and_infer_types()

        def evaluate(self, outputs, _) -> bool:
            outputs[0] = self.m_maker()
            return True

        def validate_and_infer_types(self) -> None:
            self.set_output_type(0, self.m_element_type, PartialShape(self.m_shape))

        def clone_with_new_inputs(self, new_inputs):
            return Postponed(self.m_element_type, self.m_shape, self.m_maker, self.m_owner, self.friendly_name)

        def has_evaluate(self) -> bool:
            return True

    return Postponed


class DecodeAhead:
    """The decodes of an IR's postponed weights (each a callable that makes all of one weight's values), in
    the order they were made, which is the graph's and nearly the order OpenVINO writes them in: when one is
    taken, the next not yet decoded is started in a worker thread, so that it is decoded while OpenVINO hashes
    and writes the one taken (both run without Python's GIL: numpy's array operations, the serializer's C++).
    One weight at most is decoded ahead of the writer: a weight asked for before the one decoded ahead is
    decoded where it is asked, and the one ahead waits for its turn (a tiny Gemma 4 target: 2 of 41 weights
    asked out of order, a swap of two neighbours)."""

    def __init__(self):
        self._decodes: list = []
        self._ahead: dict = {}  # index -> Future: started, not yet taken (one at most)
        self._pool = None

    def add(self, decode) -> int:
        """Register a weight's decode; returns what `take` takes it by."""
        self._decodes.append(decode)
        return len(self._decodes) - 1

    def take(self, index: int):
        """The values of weight `index` (decoded ahead, or now), the next one started behind it."""
        from concurrent.futures import ThreadPoolExecutor

        ahead = self._ahead.pop(index, None)
        values = ahead.result() if ahead is not None else self._decodes[index]()
        self._decodes[index] = None
        following = next((i for i in range(index + 1, len(self._decodes)) if self._decodes[i] is not None), None)
        if following is not None and not self._ahead:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="decode-ahead")
            self._ahead[following] = self._pool.submit(self._decodes[following])
        return values

    def close(self) -> None:
        """Once the IR is written (or its writing failed): the worker ended, nothing held."""
        self._ahead.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._decodes.clear()
