"""kfast's version, in a module of its own so that setup.cfg and the command line read it without
importing the package's public names."""

__version__ = "0.1.0"
