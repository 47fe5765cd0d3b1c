"""Render-only stand-in for pygame on a GPU loan machine (ci/gpu_loan.sh; never installed by the project).

MPE's environments (mpe2) import pygame and build a drawing surface and a font in their constructor, but
draw only when rendered, which training and evaluation never do. The loan machine has no pygame and its
12 MB wheel would put the trip over the device tool's 64 MiB, so the script puts this folder on the path
when `import pygame` fails. Anything that would really draw fails loudly."""


class Surface:
    def __init__(self, size, *args, **kwargs):
        self.size = tuple(size)

    def get_size(self):
        return self.size


def __getattr__(name):
    raise RuntimeError(f"pygame.{name}: rendering is not available on a loan machine (ci/loan_stubs)")
