"""wia-hw."""
