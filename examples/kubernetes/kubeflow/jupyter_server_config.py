# jupyter-pause's server settings for Kubeflow Workspaces, built into the image at
# /usr/local/etc/jupyter/jupyter_server_config.py (Dockerfile): a path on every Jupyter config
# path that the image leaves free. Jupyter loads the path's lowest place first, so this file comes
# after /etc/jupyter's and wins only for the settings it makes: the image's own file (and the one
# GKE Workspaces' pod webhook mounts there for IPC) stays in force for everything else.
import asyncio
import selectors


class _PollSelectorPolicy(asyncio.DefaultEventLoopPolicy):
    # poll() instead of epoll: gVisor checkpoints and restores it reliably.
    def new_event_loop(self):
        return asyncio.SelectorEventLoop(selectors.PollSelector())


asyncio.set_event_loop_policy(_PollSelectorPolicy())

c = get_config()  # noqa: F821
c.KernelManager.transport = "ipc"  # IPC sockets survive a pod snapshot, loopback TCP less so
c.PauseApp.backend = "kubeflow"
