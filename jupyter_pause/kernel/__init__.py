"""Code that runs inside the IPython kernel.

- :mod:`.magics`: ``%checkpoint``, ``%restore``, ``%pause``, ``%resume`` (``%load_ext jupyter_pause``).
- :mod:`.provenance`: which cell last assigned each variable (so skipped ones can be recomputed).
- :mod:`.liveness`: the in-memory token that tells a live resume from a fresh kernel.
- :mod:`.ipystate`: IPython's process state in a checkpoint (execution counter, In/Out,
  extensions, %autoreload, %config, %matplotlib).
- :mod:`.bridge`: what the Jupyter server runs in the kernel by silent execution.
"""
