from helpers import horovodrun  # noqa: F401 - a fixture, exported to every test
