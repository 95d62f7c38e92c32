"""Where ``ClientModule`` was documented before the engine's module became ``pfl.engine.trainer``: a
method's ``from pfl.engine.worker import ClientModule`` keeps working."""

from pfl.engine.trainer import ClientModule

__all__ = ["ClientModule"]
