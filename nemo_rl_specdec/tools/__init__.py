"""Offline asset builders: they import the package, nothing imports them."""
