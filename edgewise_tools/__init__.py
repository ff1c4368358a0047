"""edgewise_tools: the offline tools around the runtime core.

Training (:mod:`edgewise_tools.train`), model building and INT8 quantization
(:mod:`edgewise_tools.models`), hybrid evaluation (:mod:`edgewise_tools.evaluation`),
the demo (:mod:`edgewise_tools.demo`), the generated reference pages and the
protobuf stub generator, and the handlers of the ``edgewise model|synth|train|eval|demo``
commands (:mod:`edgewise_tools.cli`). Tools may import ``edgewise``, ``edge`` and
``cloud``; nothing in those imports the tools, and the Jetson bundle ships without
them (it copies only ``edgewise/`` and ``edge/``).
"""
