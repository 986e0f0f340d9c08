"""Unit tests of ringserve.cli (the command line) and its container images and units."""
