"""FastLoader's process and thread machinery (private). A loader worker process imports this package, so
it imports nothing: each module here loads numpy at most, besides the user's dataset."""
