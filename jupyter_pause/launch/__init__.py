"""Starting python kernels fast: forks of one process that imported what they all import.

A resume starts every paused notebook's kernel at once, and each new process spends about a
CPU-second importing ipykernel, IPython, numpy and pandas before it restores anything: on two
cores, eight notebooks took four times one. :mod:`.zygote` is a process that has done those
imports once and forks a kernel per request; :mod:`.provisioner` is the jupyter_client kernel
provisioner that asks it, and launches as the local provisioner does whenever a fork would not
give what a fresh process gives. This package knows nothing of the rest of jupyter_pause.
"""
