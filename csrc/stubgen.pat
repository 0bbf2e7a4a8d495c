# Patterns for nanobind's stubgen (python -m nanobind.stubgen -p csrc/stubgen.pat): what the stub cannot
# see by itself. AlignedBuffer supports the buffer protocol through a type slot (Python 3.12 names it
# __buffer__); type checkers need the method to accept it where a Buffer is expected.
AlignedBuffer.__suffix__:
    def __buffer__(self, flags: int, /) -> memoryview: ...
