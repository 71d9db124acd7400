"""llama.cpp as a reference: `tools` builds its pinned tools, and the other modules record what llama.cpp
makes of small checkpoints (most of it into tests/data/, which the tests read without llama.cpp)."""
