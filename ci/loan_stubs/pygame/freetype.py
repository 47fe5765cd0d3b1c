"""Render-only stand-in for pygame.freetype (see __init__.py)."""


def init():
    pass


class Font:
    def __init__(self, *args, **kwargs):
        pass
