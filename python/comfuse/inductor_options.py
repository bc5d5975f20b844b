"""Inductor's config patches for one compile with ComFuse: the options the user's mode stands for
(torch._inductor.list_mode_options), the user's own Inductor options, and the post-grad pass ComFuse installs. It
imports nothing else from the package, so that building or reading the options never loads the compiler."""
from __future__ import annotations

import torch


def patches(mode: str | None = None, options: dict | None = None, post_grad_pass=None) -> dict:
    """The config patches: the mode's options, then the user's (which win), then `post_grad_pass` as Inductor's
    post-grad custom pass where one is given."""
    out: dict = {}
    if mode not in (None, "default"):
        out.update(torch._inductor.list_mode_options(mode))
    out.update(options or {})
    if post_grad_pass is not None:
        out["post_grad_custom_post_pass"] = post_grad_pass
    return out
